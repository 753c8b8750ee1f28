// Max pooling over float channels-last activations (kernels/cpu/max_pool.h): the reference equals
// ATen's max_pool2d bit for bit (NaN, -0.0 and +0.0 ties, padding, stride, dilation, ceil mode,
// channel counts off the 16-lane vectors), every table entry equals the reference, bad geometry
// is a clear error.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <vector>

#include "framework/core/error.h"
#include "kernel_test_util.h"
#include "kernels/cpu/max_pool.h"

using namespace qforge::kernels;
using namespace qforge::kernels::testing;

namespace {

PoolGeometry pool(int64_t B, int64_t C, int64_t H, int64_t W, int64_t k, int64_t s, int64_t p, int64_t d = 1,
                  bool ceil_mode = false) {
  PoolGeometry g;
  g.batch = B;
  g.channels = C;
  g.in_h = H;
  g.in_w = W;
  g.kernel_h = g.kernel_w = k;
  g.stride_h = g.stride_w = s;
  g.pad_h = g.pad_w = p;
  g.dilation_h = g.dilation_w = d;
  g.ceil_mode = ceil_mode;
  return g;
}

}  // namespace

TEST(MaxPool, ReferenceAndEveryEntryEqualATenBitForBit) {
  uint32_t seed = 11;
  for (const PoolGeometry& g :
       {pool(2, 64, 28, 28, 3, 2, 1), pool(1, 5, 9, 11, 3, 2, 1, 1, true), pool(3, 17, 10, 7, 2, 2, 0),
        pool(2, 33, 13, 13, 3, 1, 1, 2), pool(1, 16, 8, 8, 4, 3, 2, 1, true), pool(2, 8, 5, 5, 5, 1, 2)}) {
    std::vector<float> x = random_f32(static_cast<size_t>(g.batch * g.in_h * g.in_w * g.channels), -2.0f, 2.0f,
                                      seed += 7);
    // Ties of -0.0 and +0.0 (the first one seen is kept), NaNs (they propagate), -inf.
    for (size_t i = 0; i < x.size(); i += 13) x[i] = (i / 13) % 2 ? 0.0f : -0.0f;
    for (size_t i = 5; i < x.size(); i += 97) x[i] = std::numeric_limits<float>::quiet_NaN();
    for (size_t i = 7; i < x.size(); i += 89) x[i] = -std::numeric_limits<float>::infinity();
    const at::Tensor nhwc = at::from_blob(x.data(), {g.batch, g.in_h, g.in_w, g.channels}, at::kFloat);
    const at::Tensor want = at::max_pool2d(nhwc.permute({0, 3, 1, 2}), {g.kernel_h, g.kernel_w},
                                           {g.stride_h, g.stride_w}, {g.pad_h, g.pad_w},
                                           {g.dilation_h, g.dilation_w}, g.ceil_mode)
                                .permute({0, 2, 3, 1})
                                .contiguous();
    ASSERT_EQ(want.size(1), g.out_h());
    ASSERT_EQ(want.size(2), g.out_w());
    std::vector<float> ref(static_cast<size_t>(want.numel()), 123.0f);
    max_pool2d_nhwc_f32_reference(x.data(), g, ref.data());
    EXPECT_TRUE(bitwise_equal(ref.data(), want.data_ptr<float>(), ref.size()))
        << "C=" << g.channels << " k=" << g.kernel_h << " s=" << g.stride_h << " p=" << g.pad_h;
    for (const auto& e : max_pool_kernels()) {
      if (e.run == nullptr || !machine_has(e.isa)) continue;
      std::vector<float> got(ref.size(), 456.0f);
      e.run(MaxPoolProblem{x.data(), g, got.data()});
      EXPECT_TRUE(bitwise_equal(got.data(), ref.data(), ref.size())) << e.name << " C=" << g.channels;
    }
    std::vector<float> got(ref.size(), 789.0f);
    RunInfo info;
    max_pool2d_nhwc_f32(x.data(), g, got.data(), &info);
    EXPECT_TRUE(bitwise_equal(got.data(), ref.data(), ref.size())) << info.kernel;
  }
}

TEST(MaxPool, BadGeometryIsAClearError) {
  std::vector<float> x(64), y(64);
  PoolGeometry g = pool(1, 4, 4, 4, 3, 1, 2);  // padding above half the kernel
  EXPECT_THROW(max_pool2d_nhwc_f32(x.data(), g, y.data()), qforge::Error);
  g = pool(1, 4, 4, 4, 3, 0, 1);  // stride 0
  EXPECT_THROW(max_pool2d_nhwc_f32(x.data(), g, y.data()), qforge::Error);
  g = pool(1, 4, 2, 2, 5, 1, 0);  // window larger than the input: empty output
  EXPECT_THROW(max_pool2d_nhwc_f32(x.data(), g, y.data()), qforge::Error);
}

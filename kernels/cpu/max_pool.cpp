// Max pooling over float channels-last activations (max_pool.h).
#include "kernels/cpu/max_pool.h"

#include <cmath>
#include <limits>

#include "framework/core/error.h"
#include "kernels/cpu/parallel_blocks.h"

namespace qforge::kernels {

namespace {

int64_t pool_out(int64_t size, int64_t kernel, int64_t pad, int64_t stride, int64_t dilation, bool ceil_mode) {
  const int64_t num = size + 2 * pad - dilation * (kernel - 1) - 1 + (ceil_mode ? stride - 1 : 0);
  int64_t out = (num >= 0 ? num / stride : -((-num + stride - 1) / stride)) + 1;  // floor division
  if (ceil_mode && (out - 1) * stride >= size + pad) --out;
  return out;
}

}  // namespace

int64_t PoolGeometry::out_h() const { return pool_out(in_h, kernel_h, pad_h, stride_h, dilation_h, ceil_mode); }
int64_t PoolGeometry::out_w() const { return pool_out(in_w, kernel_w, pad_w, stride_w, dilation_w, ceil_mode); }

void check_pool_geometry(const PoolGeometry& g) {
  QF_REQUIRE(g.batch >= 0 && g.channels >= 1 && g.in_h >= 1 && g.in_w >= 1, "kernels/cpu: max pooling of a [",
             g.batch, ", ", g.in_h, ", ", g.in_w, ", ", g.channels, "] input");
  QF_REQUIRE(g.kernel_h >= 1 && g.kernel_w >= 1, "kernels/cpu: max pooling kernel ", g.kernel_h, "x", g.kernel_w,
             " (must be positive)");
  QF_REQUIRE(g.stride_h >= 1 && g.stride_w >= 1, "kernels/cpu: max pooling stride ", g.stride_h, "x", g.stride_w,
             " (must be positive)");
  QF_REQUIRE(g.dilation_h >= 1 && g.dilation_w >= 1, "kernels/cpu: max pooling dilation ", g.dilation_h, "x",
             g.dilation_w, " (must be positive)");
  QF_REQUIRE(g.pad_h >= 0 && g.pad_w >= 0 && g.pad_h <= g.kernel_h / 2 && g.pad_w <= g.kernel_w / 2,
             "kernels/cpu: max pooling padding ", g.pad_h, "x", g.pad_w, " (at most half the kernel ", g.kernel_h,
             "x", g.kernel_w, ")");
  QF_REQUIRE(g.out_h() >= 1 && g.out_w() >= 1, "kernels/cpu: max pooling output ", g.out_h(), "x", g.out_w(),
             " is empty (input ", g.in_h, "x", g.in_w, ")");
}

namespace detail {

void max_pool_rows_scalar(const float* x, const PoolGeometry& g, float* y, int64_t p0, int64_t p1) {
  const int64_t C = g.channels, OH = g.out_h(), OW = g.out_w();
  for (int64_t p = p0; p < p1; ++p) {
    const PoolWindow w = pool_window(g, OH, OW, p);
    float* out = y + p * C;
    for (int64_t c = 0; c < C; ++c) out[c] = -std::numeric_limits<float>::infinity();
    for (int64_t ih = w.h0; ih < w.h1; ih += g.dilation_h) {
      for (int64_t iw = w.w0; iw < w.w1; iw += g.dilation_w) {
        const float* in = x + ((w.b * g.in_h + ih) * g.in_w + iw) * C;
        for (int64_t c = 0; c < C; ++c)
          if (in[c] > out[c] || std::isnan(in[c])) out[c] = in[c];
      }
    }
  }
}

}  // namespace detail

void max_pool2d_nhwc_f32_reference(const float* x, const PoolGeometry& g, float* y) {
  check_pool_geometry(g);
  detail::max_pool_rows_scalar(x, g, y, 0, g.batch * g.out_h() * g.out_w());
}

namespace {

template <void (*Rows)(const float*, const PoolGeometry&, float*, int64_t, int64_t)>
void run_rows(const MaxPoolProblem& p) {
  const int64_t pixels = p.g.batch * p.g.out_h() * p.g.out_w();
  const int64_t taps = p.g.kernel_h * p.g.kernel_w * p.g.channels;
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, taps));
  detail::parallel_over(pixels, grain, [&](int64_t p0, int64_t p1) { Rows(p.x, p.g, p.y, p0, p1); });
}

}  // namespace

const KernelTable<MaxPoolProblem>& max_pool_kernels() {
  static const KernelTable<MaxPoolProblem> table{
      {"max_pool_f32_avx512", Isa::kAvx512, nullptr, nullptr, QF_KERNEL_AVX512(run_rows<detail::max_pool_rows_avx512>)},
      {"max_pool_f32_reference", Isa::kReference, nullptr, nullptr, run_rows<detail::max_pool_rows_scalar>},
  };
  return table;
}

void max_pool2d_nhwc_f32(const float* x, const PoolGeometry& g, float* y, RunInfo* info) {
  check_pool_geometry(g);
  QF_REQUIRE(g.batch == 0 || (x != nullptr && y != nullptr), "kernels/cpu: max_pool2d_nhwc_f32 got a null pointer");
  run_kernel_table(max_pool_kernels(), MaxPoolProblem{x, g, y}, g.batch, info);
}

}  // namespace qforge::kernels

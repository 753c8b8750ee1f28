// CUDA override of the fake-quant ops (see fake_quantize_op.h): LibTorch tensors in, the CUDA
// kernels of fake_quantize_cuda.h on the tensor's device and LibTorch's current stream.
#include "fake_quant/cuda/fake_quantize_op.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "fake_quant/cuda/fake_quantize_cuda.h"
#include "fake_quant/cuda/lsq_backward_cuda.h"
#include "framework/core/error.h"

namespace qforge::fq {
namespace {

void check_launch(cudaError_t e, const char* what) {
  QF_REQUIRE(e == cudaSuccess, "fake_quantize: CUDA kernel ", what, " failed: ", cudaGetErrorName(e), " (",
             cudaGetErrorString(e), ")");
}

// C floats from the host onto x's device (stream-ordered with the kernels that read them).
at::Tensor device_floats(const std::vector<float>& v, const at::Tensor& like) {
  return at::tensor(at::ArrayRef<float>(v), at::TensorOptions().dtype(at::kFloat)).to(like.device());
}

}  // namespace

bool cuda_fake_quantize_built() { return true; }

std::tuple<at::Tensor, at::Tensor> cuda_fake_quantize(const at::Tensor& x, const DeviceFakeQuant& op,
                                                      bool want_mask) {
  QF_CHECK(x.is_cuda() && x.scalar_type() == at::kFloat && x.is_contiguous());
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
  at::Tensor y = at::empty_like(x, at::MemoryFormat::Contiguous);
  at::Tensor mask = want_mask ? at::empty(x.sizes(), x.options().dtype(at::kBool)) : at::Tensor();
  const int64_t n = x.numel();
  if (n == 0) return {y, mask};
  const float* px = x.data_ptr<float>();
  float* py = y.data_ptr<float>();
  bool* pm = want_mask ? mask.data_ptr<bool>() : nullptr;
  if (op.float8 != nullptr) {
    const at::Tensor s = device_floats(op.scale, x);
    check_launch(qforge::cuda::fake_quantize_float8(px, py, pm, n, op.C, op.inner, s.data_ptr<float>(), *op.float8,
                                                    stream),
                 "fake_quantize_float8");
  } else if (op.C == 1) {
    check_launch(qforge::cuda::fake_quantize_per_tensor(
                     px, py, pm, n, make_grid(op.scale[0], op.zero_point[0], op.quant_min, op.quant_max), stream),
                 "fake_quantize_per_tensor");
  } else {
    const at::Tensor s = device_floats(op.scale, x), z = device_floats(op.zero_point, x);
    check_launch(qforge::cuda::fake_quantize_per_channel(px, py, pm, n, op.C, op.inner, s.data_ptr<float>(),
                                                         z.data_ptr<float>(), op.quant_min, op.quant_max, stream),
                 "fake_quantize_per_channel");
  }
  return {y, mask};
}

at::Tensor cuda_mask_grad(const at::Tensor& dy, const at::Tensor& mask) {
  QF_CHECK(dy.is_cuda() && dy.scalar_type() == at::kFloat && dy.is_contiguous());
  QF_REQUIRE(mask.device() == dy.device(), "fake_quantize_backward: gradient on ", dy.device(), " but mask on ",
             mask.device());
  const c10::cuda::CUDAGuard guard(dy.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(dy.device().index()).stream();
  at::Tensor dx = at::empty_like(dy, at::MemoryFormat::Contiguous);
  if (dy.numel() > 0)
    check_launch(qforge::cuda::fake_quantize_backward(dy.data_ptr<float>(), mask.data_ptr<bool>(), dx.data_ptr<float>(),
                                                      dy.numel(), stream),
                 "fake_quantize_backward");
  return dx;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> cuda_lsq_backward_rows(const at::Tensor& x, const at::Tensor& dy,
                                                                      const std::vector<LsqGrid>& grids) {
  QF_CHECK(x.is_cuda() && x.scalar_type() == at::kFloat && x.is_contiguous() && x.dim() == 2);
  QF_REQUIRE(dy.device() == x.device() && dy.scalar_type() == at::kFloat && dy.is_contiguous() &&
                 dy.sizes() == x.sizes(),
             "LSQ backward: gradient ", dy.sizes(), " ", dy.scalar_type(), " on ", dy.device(), " does not match input ",
             x.sizes(), " on ", x.device());
  const int64_t C = x.size(0), inner = x.size(1);
  QF_CHECK(static_cast<int64_t>(grids.size()) == C);
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
  static_assert(sizeof(LsqGrid) == 6 * sizeof(float), "LsqGrid travels to the device as 6 floats");
  const std::vector<float> packed(reinterpret_cast<const float*>(grids.data()),
                                  reinterpret_cast<const float*>(grids.data()) + 6 * grids.size());
  const at::Tensor g = device_floats(packed, x);
  at::Tensor dx = at::empty_like(x, at::MemoryFormat::Contiguous);
  at::Tensor ds = at::empty({C}, x.options()), dz = at::empty({C}, x.options());
  at::Tensor work = at::empty({qforge::cuda::lsq_backward_workspace_doubles(C, inner)}, x.options().dtype(at::kDouble));
  check_launch(qforge::cuda::lsq_backward_rows(x.data_ptr<float>(), dy.data_ptr<float>(), dx.data_ptr<float>(), C,
                                               inner, reinterpret_cast<const LsqGrid*>(g.data_ptr<float>()),
                                               ds.data_ptr<float>(), dz.data_ptr<float>(), work.data_ptr<double>(),
                                               stream),
               "lsq_backward_rows");
  return {dx, ds, dz};
}

}  // namespace qforge::fq

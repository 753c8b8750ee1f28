// Frozen layers on CUDA (see linear_cuda.h): the int8 Linear (one fused launch or the chain), the
// int4 GEMVs and the int4 dequantization, the weight-only int8 GEMV.
#include "framework/cuda/linear_cuda.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "framework/api/kernel_plan.h"
#include "framework/core/error.h"
#include "framework/cuda/nonfinite_check_cuda.h"
#include "kernels/cuda/dequantize_s32_f32_cuda.h"
#include "kernels/cuda/dequantize_s4_cuda.h"
#include "kernels/cuda/gemm_s8s8s32_cuda.h"
#include "kernels/cuda/gemv_f32s4_cuda.h"
#include "kernels/cuda/gemv_f32s4_mma_cuda.h"
#include "kernels/cuda/gemv_f32s8_cuda.h"
#include "kernels/cuda/gemv_s4_rules.h"
#include "kernels/cuda/gemv_s8_rules.h"
#include "kernels/cuda/linear_s8_fused_cuda.h"
#include "kernels/cuda/quantize_rows_s8_cuda.h"
#include "kernels/cuda/unpack_s4_math.h"

namespace qforge::cuda_ops {
namespace {

// One cuBLASLt handle and workspace per device and thread (GemmS8S8S32Cuda is not thread-safe).
const cuda::GemmS8S8S32Cuda& gemm_for(int device) {
  thread_local std::map<int, std::unique_ptr<cuda::GemmS8S8S32Cuda>> gemms;
  auto& g = gemms[device];
  if (!g) g = std::make_unique<cuda::GemmS8S8S32Cuda>();  // the caller's guard selects the device
  return *g;
}

void require_on(const at::Tensor& t, const at::Tensor& x, const char* what, at::ScalarType dtype) {
  QF_REQUIRE(t.device() == x.device() && t.scalar_type() == dtype && t.is_contiguous(), "CUDA Linear: ", what,
             " must be a contiguous ", dtype, " tensor on ", x.device(), ", got ", t.scalar_type(), " on ", t.device());
}

// The fused kernel's split-K tickets for (device, stream): zeroed once when (re)allocated, left
// zero by every call, and per stream because concurrent calls must not share them. Never freed
// (a handful of ints per stream; no teardown order issue with the allocator at exit).
unsigned* fused_tickets(const at::Tensor& like, cudaStream_t stream, int64_t count) {
  static std::mutex mutex;
  static auto* tickets = new std::map<std::pair<int, cudaStream_t>, at::Tensor>();
  const std::lock_guard<std::mutex> lock(mutex);
  at::Tensor& t = (*tickets)[{like.device().index(), stream}];
  if (!t.defined() || t.numel() < count) t = at::zeros({std::max<int64_t>(count, 1024)}, like.options().dtype(at::kInt));
  return reinterpret_cast<unsigned*>(t.data_ptr<int32_t>());
}

// The one-launch kernel where its rules allow (true, y written, info names the tile); false with
// the reason in *why otherwise (nothing launched). Arguments as linear_s8, already checked.
bool linear_s8_fused(const at::Tensor& x, const at::Tensor& codes, float static_scale, const at::Tensor& weight,
                     const at::Tensor& w_scale, const at::Tensor& bias, at::Tensor& y, cudaStream_t stream,
                     kernels::RunInfo* info, std::string* why) {
  cuda::LinearS8FusedArgs a;
  a.x = codes.defined() ? nullptr : x.data_ptr<float>();
  a.codes = codes.defined() ? codes.data_ptr<int8_t>() : nullptr;
  a.static_scale = static_scale;
  a.weight = weight.data_ptr<int8_t>();
  a.w_scale = w_scale.data_ptr<float>();
  a.bias = bias.defined() ? bias.data_ptr<float>() : nullptr;
  a.y = y.data_ptr<float>();
  a.M = y.size(0), a.N = y.size(1), a.K = weight.size(1);
  cuda::FusedTile tile{};
  if (!cuda::linear_s8_fused_choose(a, &tile, &a.splits, why)) return false;
  at::Tensor workspace;
  if (const int64_t ints = cuda::fused_workspace_ints(a.M, a.N, a.K, a.splits); ints > 0) {
    workspace = at::empty({ints}, y.options().dtype(at::kInt));  // every read element is written first
    a.workspace = workspace.data_ptr<int32_t>();
    a.tickets = fused_tickets(y, stream, cuda::fused_ticket_count(tile, a.M, a.N));
  }
  NonfiniteFlag first_bad;
  if (!codes.defined()) {
    first_bad = nonfinite_flag(y.device(), stream);
    a.first_nonfinite = first_bad.ptr;
  }
  cuda::linear_s8_fused_cuda(a, tile, stream);
  if (a.first_nonfinite != nullptr) check_nonfinite(first_bad, a.K, stream);
  if (info != nullptr)
    *info = {std::string("linear_s8_fused_cuda ") + cuda::fused_tile_name(tile) +
                 (a.splits > 1 ? " split-K " + std::to_string(a.splits) : ""),
             ""};
  return true;
}

}  // namespace

bool built() { return true; }

std::string unavailable_reason() { return ""; }

at::Tensor linear_s8(const at::Tensor& x, const at::Tensor& codes, float static_scale, const at::Tensor& weight,
                     const at::Tensor& w_scale, const at::Tensor& bias, kernels::RunInfo* info) {
  const at::Tensor& in = codes.defined() ? codes : x;
  QF_REQUIRE(in.is_cuda() && in.dim() == 2, "CUDA Linear: input must be a 2-D CUDA tensor, got ", in.sizes(), " on ",
             in.device());
  const int64_t M = in.size(0), K = in.size(1), N = weight.size(0);
  require_on(weight, in, "weight", at::kChar);
  require_on(w_scale, in, "w_scale", at::kFloat);
  QF_REQUIRE(weight.size(1) == K && w_scale.numel() == N, "CUDA Linear: weight ", weight.sizes(), " and w_scale ",
             w_scale.sizes(), " do not fit input ", in.sizes());
  if (bias.defined()) require_on(bias, in, "bias", at::kFloat);
  const c10::cuda::CUDAGuard guard(in.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(in.device().index()).stream();
  raise_completed_nonfinite(in.device(), stream);
  const at::TensorOptions opts = in.options();
  at::Tensor y = at::empty({M, N}, opts.dtype(at::kFloat));
  if (M == 0 || N == 0) return y;
  if (codes.defined()) {
    require_on(codes, in, "activation codes", at::kChar);
  } else {
    require_on(x, in, "input", at::kFloat);
  }
  std::string fused_why;
  const bool fused = cuda_linear_s8_fused();
  if (fused && linear_s8_fused(x, codes, static_scale, weight, w_scale, bias, y, stream, info, &fused_why)) return y;
  at::Tensor q, a_scale;
  if (codes.defined()) {
    q = codes;
    a_scale = at::full({M}, static_scale, opts.dtype(at::kFloat));
  } else {
    q = at::empty({M, K}, opts.dtype(at::kChar));
    a_scale = at::empty({M}, opts.dtype(at::kFloat));
    const NonfiniteFlag first_bad = nonfinite_flag(in.device(), stream);
    cuda::quantize_rows_s8_cuda(x.data_ptr<float>(), M, K, kernels::ActScale::kPerRow, q.data_ptr<int8_t>(), K,
                                a_scale.data_ptr<float>(), first_bad.ptr, stream);
    check_nonfinite(first_bad, K, stream);
  }
  at::Tensor acc = at::empty({M, N}, opts.dtype(at::kInt));
  gemm_for(in.device().index())
      .run(q.data_ptr<int8_t>(), K, weight.data_ptr<int8_t>(), K, acc.data_ptr<int32_t>(), N, M, N, K, stream, info);
  cuda::dequantize_s32_f32_cuda(acc.data_ptr<int32_t>(), N, a_scale.data_ptr<float>(), w_scale.data_ptr<float>(),
                                bias.defined() ? bias.data_ptr<float>() : nullptr, y.data_ptr<float>(), M, N, stream);
  if (info != nullptr && fused)
    info->fallback = "linear_s8_fused_cuda: " + fused_why + (info->fallback.empty() ? "" : "; " + info->fallback);
  return y;
}

at::Tensor dequantize_s4(const at::Tensor& packed, int64_t N, int64_t K, bool is_signed, const at::Tensor& scale,
                         const at::Tensor& zero, int64_t group_size, bool tiled) {
  const int64_t bytes = tiled ? cuda::s4_tiled_bytes(N, K) : (N * K + 1) / 2;
  QF_REQUIRE(packed.is_cuda() && packed.scalar_type() == at::kByte && packed.numel() == bytes,
             "CUDA int4 dequantize: packed codes must be ", bytes, " uint8", tiled ? " (tiled)" : "",
             " on a CUDA device, got ", packed.numel(), " ", packed.scalar_type(), " on ", packed.device());
  require_on(scale, packed, "int4 scales", at::kFloat);
  if (zero.defined()) require_on(zero, packed, "int4 zero points", at::kInt);
  const c10::cuda::CUDAGuard guard(packed.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(packed.device().index()).stream();
  at::Tensor w = at::empty({N, K}, packed.options().dtype(at::kFloat));
  if (N * K == 0) return w;
  cuda::dequantize_s4_cuda(packed.data_ptr<uint8_t>(), N, K, is_signed, scale.data_ptr<float>(),
                           zero.defined() ? zero.data_ptr<int32_t>() : nullptr, group_size, w.data_ptr<float>(), stream,
                           tiled);
  return w;
}

bool s4_tiles_serve(int64_t K, int64_t group_size, const at::Device& device) {
  if (!device.is_cuda() || !cuda::gemv_f32s4_mma_supported(1, K, group_size, nullptr)) return false;
  const c10::cuda::CUDAGuard guard(device);
  return cuda::gemv_f32s4_mma_runs_here(nullptr);
}

at::Tensor repack_s4_tiles(const at::Tensor& packed, int64_t N, int64_t K) {
  QF_REQUIRE(packed.is_cuda() && packed.scalar_type() == at::kByte && packed.is_contiguous() &&
                 packed.numel() == (N * K + 1) / 2,
             "CUDA int4 repack: packed codes must be ", (N * K + 1) / 2, " contiguous uint8 on a CUDA device, got ",
             packed.numel(), " ", packed.scalar_type(), " on ", packed.device());
  const c10::cuda::CUDAGuard guard(packed.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(packed.device().index()).stream();
  at::Tensor tiled = at::empty({cuda::s4_tiled_bytes(N, K)}, packed.options());
  cuda::repack_s4_tiles_cuda(packed.data_ptr<uint8_t>(), N, K, tiled.data_ptr<uint8_t>(), stream);
  return tiled;
}

at::Tensor linear_s4(const at::Tensor& x_in, const at::Tensor& packed, int64_t N, int64_t K, bool is_signed,
                     const at::Tensor& scale, const at::Tensor& zero, int64_t group_size, bool tiled,
                     const at::Tensor& bias, kernels::RunInfo* info) {
  QF_REQUIRE(x_in.is_cuda() && x_in.dim() == 2 && x_in.size(1) == K,
             "CUDA int4 Linear: input must be a 2-D CUDA tensor [M, ", K, "], got ", x_in.sizes(), " on ",
             x_in.device());
  require_on(x_in, packed, "input", at::kFloat);
  if (bias.defined()) require_on(bias, packed, "bias", at::kFloat);
  const int64_t M = x_in.size(0);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x_in.device().index()).stream();
  raise_completed_nonfinite(x_in.device(), stream);
  // Tiled codes have only the tensor-core GEMV: an input view off its 16-byte alignment is copied.
  const bool realign = tiled && reinterpret_cast<uintptr_t>(x_in.data_ptr()) % cuda::kGemvS4XAlignment != 0;
  const at::Tensor x = realign ? x_in.clone() : x_in;
  std::string why;
  if (cuda::gemv_f32s4_supported(M, K, group_size, &why) &&
      cuda::gemv_f32s4_pointers_supported(x.data_ptr(), packed.data_ptr(), &why)) {
    require_on(scale, packed, "int4 scales", at::kFloat);
    if (zero.defined()) require_on(zero, packed, "int4 zero points", at::kInt);
    at::Tensor y = at::empty({M, N}, x.options());
    // The tensor-core GEMV where its rules and the device allow; the CUDA-core one otherwise.
    std::string mma_why;
    const bool mma = cuda::gemv_f32s4_mma_supported(M, K, group_size, &mma_why) &&
                     cuda::gemv_f32s4_mma_pointers_supported(x.data_ptr(), packed.data_ptr(), &mma_why) &&
                     cuda::gemv_f32s4_mma_runs_here(&mma_why);
    QF_REQUIRE(mma || !tiled, "CUDA int4 Linear: tiled codes need the tensor-core GEMV: ", mma_why);
    const char* mma_kernel = cuda::gemv_f32s4_mma_kernel_for(M, N, K);
    const float* xp = x.data_ptr<float>();
    const uint8_t* codes = packed.data_ptr<uint8_t>();
    const float* sp = scale.data_ptr<float>();
    const int32_t* zp = zero.defined() ? zero.data_ptr<int32_t>() : nullptr;
    const float* bp = bias.defined() ? bias.data_ptr<float>() : nullptr;
    if (!mma) {
      cuda::gemv_f32s4_cuda(xp, M, codes, N, K, is_signed, sp, zp, group_size, bp, y.data_ptr<float>(), stream);
    } else if (cuda::gemv_f32s4_mma_staged_for(M, N, K)) {
      // Workspace per call from the caching allocator on this stream (no cudaMalloc after warm-up).
      const auto bytes = static_cast<int64_t>(cuda::gemv_f32s4_mma_staged_workspace_bytes(M, K));
      at::Tensor workspace = at::empty({bytes}, x.options().dtype(at::kByte));
      cuda::gemv_f32s4_mma_staged_cuda(xp, M, codes, N, K, is_signed, sp, zp, group_size, bp, y.data_ptr<float>(),
                                       workspace.data_ptr(), stream, tiled);
    } else {
      cuda::gemv_f32s4_mma_cuda(xp, M, codes, N, K, is_signed, sp, zp, group_size, bp, y.data_ptr<float>(), stream,
                                tiled);
    }
    if (info != nullptr) {
      *info = mma ? kernels::RunInfo{mma_kernel, ""}
                  : kernels::RunInfo{"gemv_f32s4_cuda", std::string(mma_kernel) + ": " + mma_why};
    }
    return y;
  }
  if (info != nullptr) *info = {"dequantize_s4_cuda+at::linear", "gemv_f32s4_cuda: " + why};
  return at::linear(x, dequantize_s4(packed, N, K, is_signed, scale, zero, group_size, tiled), bias);
}

at::Tensor linear_s8_weight_only(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scale,
                                 const at::Tensor& bias, kernels::RunInfo* info) {
  QF_REQUIRE(codes.dim() == 2, "CUDA int8 weight-only Linear: codes must be [N, K], got ", codes.sizes());
  QF_REQUIRE(x.is_cuda() && x.dim() == 2 && x.size(1) == codes.size(1),
             "CUDA int8 weight-only Linear: input must be a 2-D CUDA tensor [M, ", codes.size(1), "], got ", x.sizes(),
             " on ", x.device());
  require_on(x, x, "input", at::kFloat);
  require_on(codes, x, "int8 codes", at::kChar);
  require_on(scale, x, "int8 scales", at::kFloat);
  QF_REQUIRE(scale.numel() == codes.size(0), "CUDA int8 weight-only Linear: ", scale.numel(), " scales for ",
             codes.size(0), " weight rows");
  if (bias.defined()) {
    require_on(bias, x, "bias", at::kFloat);
    QF_REQUIRE(bias.numel() == codes.size(0), "CUDA int8 weight-only Linear: bias of ", bias.numel(), " for ",
               codes.size(0), " weight rows");
  }
  const int64_t M = x.size(0), N = codes.size(0), K = codes.size(1);
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
  raise_completed_nonfinite(x.device(), stream);
  std::string why;
  if (cuda::gemv_f32s8_supported(M, K, &why) &&
      cuda::gemv_f32s8_pointers_supported(x.data_ptr(), codes.data_ptr(), &why)) {
    at::Tensor y = at::empty({M, N}, x.options());
    if (N > 0)
      cuda::gemv_f32s8_cuda(x.data_ptr<float>(), M, codes.data_ptr<int8_t>(), N, K, scale.data_ptr<float>(),
                            bias.defined() ? bias.data_ptr<float>() : nullptr, y.data_ptr<float>(), stream);
    if (info != nullptr) *info = {"gemv_f32s8_cuda", ""};
    return y;
  }
  if (info != nullptr) *info = {"dequantize+at::linear", "gemv_f32s8_cuda: " + why};
  return at::linear(x, codes.to(at::kFloat) * scale.unsqueeze(1), bias);
}

}  // namespace qforge::cuda_ops

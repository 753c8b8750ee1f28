// MXFP4 / NVFP4 weight-only Linear: validation, packing and its kernel table (gemv_f32fp4_avx2 ->
// linear_f32fp4_reference, then linear_f32_dequant_gemm above kWeightOnlyMaxM) over ATen's threads.
// Layout and float order: kernels/cpu/fp4_linear.h.
#include "kernels/cpu/fp4_linear.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "framework/core/error.h"
#include "framework/core/qtype.h"
#include "kernels/cpu/linear_weight_only.h"
#include "kernels/cpu/parallel_blocks.h"

namespace qforge::kernels {

namespace {

// Each output row is computed by one call in one order: the result does not depend on threads.
template <void (*kKernel)(const detail::Fp4Args&, int64_t, int64_t)>
[[maybe_unused]] void run_fp4_fast(const Fp4Problem& p) {
  detail::Fp4Args args = p.layer->kernel_args();
  args.x = p.x;
  args.ldx = args.k;
  args.m = p.m;
  args.y = p.y;
  args.ldy = args.n;
  detail::parallel_over_blocks(args.n, args.k * p.m, [&](int64_t n0, int64_t n1) { kKernel(args, n0, n1); });
}

void run_fp4_reference(const Fp4Problem& p) {
  const detail::Fp4Args a = p.layer->kernel_args();
  linear_f32fp4_reference_packed(p.x, p.m, a.packed, a.scales, a.n, a.k, a.block, a.bias, p.y);
}

// W[n, k] = e2m1(code) * scale, the float32 product fake-quant forms, then one GEMM.
void run_fp4_dequant_gemm(const Fp4Problem& p) {
  const detail::Fp4Args a = p.layer->kernel_args();
  detail::linear_f32_dequant_gemm(p.x, p.m, a.k, a.n, a.bias, p.y, [&](float* w) {
    detail::parallel_over_blocks(a.n, a.k, [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; ++n) {
        const uint8_t* packed = a.packed + n * (a.k / 2);
        for (int64_t k = 0; k < a.k; ++k)
          w[n * a.k + k] = kE2M1Values[fp4_packed_code(packed, k)] * a.scales[n * (a.k / a.block) + k / a.block];
      }
    });
  });
}

bool fp4_gemv_serves(const Fp4Problem& p) { return detail::weight_only_gemv_serves(p.m); }
bool fp4_gemm_serves(const Fp4Problem& p) { return !detail::weight_only_gemv_serves(p.m); }

at::IntArrayRef fp4_sizes(const at::Tensor& t) { return t.defined() ? t.sizes() : at::IntArrayRef{}; }

}  // namespace

bool PackedLinearFp4::supports(int64_t K, int64_t block, std::string* why) {
  if (block > 0 && block % kFp4Chunk == 0 && K > 0 && K % block == 0) return true;
  if (why) *why = "fp4 blocks of " + std::to_string(block) + " over in_features " + std::to_string(K) +
                  ": the kernels need a block that is a multiple of 16 and divides K";
  return false;
}

PackedLinearFp4::PackedLinearFp4(const at::Tensor& codes, const at::Tensor& scales, int64_t block,
                                 const at::Tensor& bias) {
  QF_REQUIRE(codes.defined() && codes.dim() == 2 && codes.scalar_type() == at::kByte,
             "kernels/cpu: PackedLinearFp4: codes must be uint8 [N, K], got ", fp4_sizes(codes));
  n_ = codes.size(0);
  k_ = codes.size(1);
  std::string why;
  QF_REQUIRE(n_ > 0 && supports(k_, block, &why), "kernels/cpu: PackedLinearFp4: ", why.empty() ? "empty weight" : why);
  block_ = block;
  QF_REQUIRE(scales.defined() && scales.sizes() == at::IntArrayRef({n_, k_ / block}), "kernels/cpu: PackedLinearFp4: ",
             "scales must be float [", n_, ", ", k_ / block, "], got ", fp4_sizes(scales));
  scales_ = scales.to(at::kCPU, at::kFloat).contiguous().clone();
  QF_REQUIRE(at::logical_and(at::isfinite(scales_), scales_ > 0).all().item<bool>(),
             "kernels/cpu: PackedLinearFp4: scales must be finite and > 0");
  const at::Tensor c = codes.to(at::kCPU).contiguous();
  QF_REQUIRE(c.max().item<int64_t>() < 16, "kernels/cpu: PackedLinearFp4: codes must be below 16");
  if (bias.defined()) {
    QF_REQUIRE(bias.numel() == n_, "kernels/cpu: PackedLinearFp4: bias has ", bias.numel(), " values, expected ", n_);
    bias_ = bias.to(at::kCPU, at::kFloat).reshape({n_}).contiguous().clone();
  }
  packed_ = at::zeros({n_, k_ / 2}, at::kByte);
  const uint8_t* pc = c.data_ptr<uint8_t>();
  uint8_t* pp = packed_.data_ptr<uint8_t>();
  for (int64_t n = 0; n < n_; ++n)
    for (int64_t k = 0; k < k_; ++k) {
      const int shift = k % kFp4Chunk < kFp4Lanes ? 0 : 4;
      pp[n * (k_ / 2) + k / kFp4Chunk * kFp4ChunkBytes + k % kFp4Lanes] |= static_cast<uint8_t>(pc[n * k_ + k] << shift);
    }
}

int64_t PackedLinearFp4::bytes() const {
  return packed_.nbytes() + scales_.nbytes() + (bias_.defined() ? bias_.nbytes() : 0);
}

at::Tensor PackedLinearFp4::codes() const {
  at::Tensor out = at::empty({n_, k_}, at::kByte);
  const uint8_t* pp = packed_.data_ptr<uint8_t>();
  uint8_t* po = out.data_ptr<uint8_t>();
  for (int64_t n = 0; n < n_; ++n)
    for (int64_t k = 0; k < k_; ++k) po[n * k_ + k] = static_cast<uint8_t>(fp4_packed_code(pp + n * (k_ / 2), k));
  return out;
}

detail::Fp4Args PackedLinearFp4::kernel_args() const {
  detail::Fp4Args a;
  a.packed = packed_.data_ptr<uint8_t>();
  a.scales = scales_.data_ptr<float>();
  a.n = n_;
  a.k = k_;
  a.block = block_;
  a.bias = bias_.defined() ? bias_.data_ptr<float>() : nullptr;
  return a;
}

at::Tensor PackedLinearFp4::run(const at::Tensor& x_in, RunInfo* info) const {
  QF_REQUIRE(x_in.defined() && x_in.dim() >= 1 && x_in.size(-1) == k_,
             "kernels/cpu: PackedLinearFp4: input must be [..., ", k_, "], got ", fp4_sizes(x_in));
  const at::Tensor x = x_in.to(at::kCPU, at::kFloat).contiguous();  // rows of K, any leading shape
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = n_;
  at::Tensor y = at::empty(shape, at::kFloat);
  run(x.data_ptr<float>(), x.numel() / k_, y.data_ptr<float>(), info);
  return y;
}

void PackedLinearFp4::run(const float* x, int64_t M, float* y, RunInfo* info) const {
  QF_REQUIRE(M >= 0 && (M == 0 || (x != nullptr && y != nullptr)), "kernels/cpu: PackedLinearFp4: M=", M,
             " or a null pointer");
  run_kernel_table(fp4_linear_kernels(), Fp4Problem{this, x, M, y}, M, info);
}

const KernelTable<Fp4Problem>& fp4_linear_kernels() {
  static const KernelTable<Fp4Problem> table{
      {"gemv_f32fp4_avx2", Isa::kAvx2, fp4_gemv_serves, nullptr, QF_KERNEL_AVX2(run_fp4_fast<detail::gemv_f32fp4_avx2>)},
      {"linear_f32fp4_reference", Isa::kReference, fp4_gemv_serves, nullptr, run_fp4_reference},
      {kDequantGemmKernel, Isa::kReference, fp4_gemm_serves, nullptr, run_fp4_dequant_gemm},
  };
  return table;
}

}  // namespace qforge::kernels

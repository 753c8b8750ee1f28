// Codebook (look-up-table) Linear: validation, packing into the 16-byte blocks and 16-entry tables,
// and its kernel table (gemv_f32lut_avx512 -> gemv_f32lut_avx2 -> linear_f32lut_reference, then
// linear_f32_dequant_gemm above kWeightOnlyMaxM) run over ATen's threads. Layout and float order: kernels/cpu/lut_linear.h.
#include "kernels/cpu/lut_linear.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "framework/core/error.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/parallel_blocks.h"
#include "kernels/cpu/workspace.h"

namespace qforge::kernels {

namespace {

int64_t round_up_to(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// Reads the sizes of a possibly undefined tensor for an error message.
at::IntArrayRef sizes_of(const at::Tensor& t) { return t.defined() ? t.sizes() : at::IntArrayRef{}; }

// Runs `kKernel` over whole row blocks, each thread a contiguous range of them; every row's sum is
// computed by one call in the same order, so the result does not depend on the thread count.
template <void (*kKernel)(const detail::LutArgs&, int64_t, int64_t)>
[[maybe_unused]] void run_lut_fast(const LutProblem& p) {
  detail::LutArgs args = p.layer->kernel_args();
  const int64_t K = p.layer->in_features(), n = args.n, kp = args.kp;
  args.x = p.x;
  args.ldx = K;
  // Kernels read whole blocks: x rows padded with 0.0f when K is not a whole number of them.
  const detail::ScratchArray<float> padded(detail::Scratch::kPaddedInput, kp != K ? p.m * kp : 0);
  if (kp != K) {
    detail::pad_rows(padded.data(), p.x, p.m, K, kp);
    args.x = padded.data();
    args.ldx = kp;
  }
  args.m = p.m;
  args.y = p.y;
  args.ldy = n;
  const int64_t blocks = (n + kLutRowBlock - 1) / kLutRowBlock;
  detail::parallel_over_blocks(blocks, kLutRowBlock * kp * p.m, [&](int64_t b, int64_t e) {
    kKernel(args, b * kLutRowBlock, std::min(n, e * kLutRowBlock));
  });
}

void run_lut_reference(const LutProblem& p) {
  const PackedLinearLut& l = *p.layer;
  const at::Tensor idx = l.indices();
  const at::Tensor cb = l.codebook();
  linear_f32_lut_reference(p.x, p.m, idx.data_ptr<uint8_t>(), cb.data_ptr<float>(), l.out_features(),
                           l.in_features(), l.group_size(), l.bits(),
                           l.bias().defined() ? l.bias().data_ptr<float>() : nullptr, p.y);
}

// W[n, k] = codebook[n, k / group_size, idx[n, k]], the levels codebook_lookup gathers: read
// from the packed indices and the tables (entry idx < 2^bits is the level), rows split across
// ATen's threads.
void run_lut_dequant_gemm(const LutProblem& p) {
  const detail::LutArgs a = p.layer->kernel_args();
  const int64_t K = p.layer->in_features(), B = lut_block(a.storage_bits);
  const int64_t row_bytes = a.kp / B * kLutBlockBytes;
  const int mask = (1 << a.storage_bits) - 1;
  detail::linear_f32_dequant_gemm(p.x, p.m, K, a.n, a.bias, p.y, [&](float* w) {
    detail::parallel_over_blocks(a.n, K, [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; ++n) {
        const uint8_t* packed = a.packed + n * row_bytes;
        for (int64_t k = 0; k < K; ++k) {
          const int64_t b = k / B, plane = k % B / kLutEntries, j = k % kLutEntries;
          const int idx = (packed[b * kLutBlockBytes + j] >> (plane * a.storage_bits)) & mask;
          w[n * K + k] = a.tables[(n * a.groups + k / a.group_size) * kLutEntries + idx];
        }
      }
    });
  });
}

bool lut_gemv_serves(const LutProblem& p) { return detail::weight_only_gemv_serves(p.m); }
bool lut_gemm_serves(const LutProblem& p) { return !detail::weight_only_gemv_serves(p.m); }

}  // namespace

bool PackedLinearLut::supports(int bits, int64_t K, int64_t group_size, std::string* why) {
  std::string local;
  std::string& w = why ? *why : local;
  if (bits != 2 && bits != 3 && bits != 4) {
    w = "codebook indices must be 2, 3 or 4 bits, got " + std::to_string(bits);
    return false;
  }
  if (K <= 0 || group_size <= 0 || K % group_size != 0) {
    w = "group_size " + std::to_string(group_size) + " does not divide in_features " + std::to_string(K);
    return false;
  }
  const int64_t B = lut_block(bits);
  if (K / group_size > 1 && group_size % B != 0) {
    // A 16-byte block of B values reads one table, so it must not straddle two groups.
    w = "per-group codebooks of " + std::to_string(bits) + "-bit indices need group_size a multiple of " +
        std::to_string(B) + " (the packed block), got group_size " + std::to_string(group_size) + " with " +
        std::to_string(K / group_size) + " groups over in_features " + std::to_string(K);
    return false;
  }
  return true;
}

PackedLinearLut::PackedLinearLut(const at::Tensor& indices, const at::Tensor& codebook, int64_t group_size, int bits,
                                 const at::Tensor& bias) {
  QF_REQUIRE(indices.defined() && indices.dim() == 2 && indices.scalar_type() == at::kByte,
             "kernels/cpu: PackedLinearLut: indices must be uint8 [N, K], got ",
             indices.defined() ? c10::toString(indices.scalar_type()) : "undefined", " ", sizes_of(indices));
  n_ = indices.size(0);
  k_ = indices.size(1);
  QF_REQUIRE(n_ > 0 && k_ > 0, "kernels/cpu: PackedLinearLut: empty weight [", n_, ", ", k_, "]");
  std::string why;
  QF_REQUIRE(supports(bits, k_, group_size, &why), "kernels/cpu: PackedLinearLut: ", why);
  bits_ = bits;
  group_size_ = group_size;
  groups_ = k_ / group_size;
  const int64_t L = int64_t{1} << bits;
  QF_REQUIRE(codebook.defined() && codebook.is_floating_point() &&
                 codebook.sizes() == at::IntArrayRef({n_, groups_, L}),
             "kernels/cpu: PackedLinearLut: codebook must be float [", n_, ", ", groups_, ", ", L,
             "] (N, K / group_size, 2^bits), got ", sizes_of(codebook));
  const at::Tensor cb = codebook.to(at::kCPU, at::kFloat).contiguous();
  const float* pc = cb.data_ptr<float>();
  for (int64_t i = 0; i < cb.numel(); ++i) {
    QF_REQUIRE(std::isfinite(pc[i]), "kernels/cpu: PackedLinearLut: codebook entry [", i / (groups_ * L), ", ",
               i / L % groups_, ", ", i % L, "] is ", pc[i], "; every level must be finite");
  }
  const at::Tensor idx = indices.to(at::kCPU).contiguous();
  const uint8_t* pi = idx.data_ptr<uint8_t>();
  for (int64_t i = 0; i < n_ * k_; ++i) {
    QF_REQUIRE(pi[i] < L, "kernels/cpu: PackedLinearLut: index ", static_cast<int>(pi[i]), " at [", i / k_, ", ",
               i % k_, "] is not below 2^", bits, " = ", L);
  }
  if (bias.defined()) {
    QF_REQUIRE(bias.numel() == n_, "kernels/cpu: PackedLinearLut: bias has ", bias.numel(), " values, expected ",
               n_);
    bias_ = bias.to(at::kCPU, at::kFloat).reshape({n_}).contiguous().clone();
  }

  const int64_t B = lut_block(bits), s = lut_storage_bits(bits);
  kp_ = round_up_to(k_, B);
  const int64_t row_bytes = kp_ / B * kLutBlockBytes;
  packed_ = at::zeros({n_, row_bytes}, at::kByte);
  uint8_t* pp = packed_.data_ptr<uint8_t>();
  for (int64_t n = 0; n < n_; ++n) {
    for (int64_t k = 0; k < k_; ++k) {
      const int64_t b = k / B, a = k % B / kLutEntries, j = k % kLutEntries;
      pp[n * row_bytes + b * kLutBlockBytes + j] |= static_cast<uint8_t>(pi[n * k_ + k] << (a * s));
    }
  }
  // Entry e = level e mod L, so a lane's bits above the plane's pick a copy of the same level.
  tables_ = cb.index_select(2, at::arange(kLutEntries, at::kLong).remainder(L)).contiguous();
}

int64_t PackedLinearLut::bytes() const {
  return packed_.nbytes() + tables_.nbytes() + (bias_.defined() ? bias_.nbytes() : 0);
}

at::Tensor PackedLinearLut::indices() const {
  QF_REQUIRE(packed_.defined(), "kernels/cpu: PackedLinearLut: not packed");
  at::Tensor out = at::empty({n_, k_}, at::kByte);
  const int64_t B = lut_block(bits_), s = lut_storage_bits(bits_), row_bytes = kp_ / B * kLutBlockBytes;
  const uint8_t* pp = packed_.data_ptr<uint8_t>();
  uint8_t* po = out.data_ptr<uint8_t>();
  const int mask = (1 << s) - 1;
  for (int64_t n = 0; n < n_; ++n) {
    for (int64_t k = 0; k < k_; ++k) {
      const int64_t b = k / B, a = k % B / kLutEntries, j = k % kLutEntries;
      po[n * k_ + k] = static_cast<uint8_t>((pp[n * row_bytes + b * kLutBlockBytes + j] >> (a * s)) & mask);
    }
  }
  return out;
}

at::Tensor PackedLinearLut::codebook() const {
  QF_REQUIRE(tables_.defined(), "kernels/cpu: PackedLinearLut: not packed");
  return tables_.slice(2, 0, int64_t{1} << bits_).contiguous();
}

at::Tensor PackedLinearLut::run(const at::Tensor& x_in, RunInfo* info) const {
  QF_REQUIRE(x_in.defined() && x_in.dim() >= 1 && x_in.size(-1) == k_,
             "kernels/cpu: PackedLinearLut: input must be [..., ", k_, "], got ", sizes_of(x_in));
  const at::Tensor x = x_in.to(at::kCPU, at::kFloat).reshape({-1, k_}).contiguous();
  at::Tensor y = at::empty({x.size(0), n_}, at::kFloat);
  run(x.data_ptr<float>(), x.size(0), y.data_ptr<float>(), info);
  std::vector<int64_t> shape(x_in.sizes().begin(), x_in.sizes().end());
  shape.back() = n_;
  return y.reshape(shape);
}

detail::LutArgs PackedLinearLut::kernel_args() const {
  QF_REQUIRE(packed_.defined(), "kernels/cpu: PackedLinearLut: not packed");
  detail::LutArgs args;
  args.packed = packed_.data_ptr<uint8_t>();
  args.tables = tables_.data_ptr<float>();
  args.n = n_;
  args.kp = kp_;
  args.groups = groups_;
  args.group_size = group_size_;
  args.storage_bits = lut_storage_bits(bits_);
  args.bias = bias_.defined() ? bias_.data_ptr<float>() : nullptr;
  return args;
}

const KernelTable<LutProblem>& lut_linear_kernels() {
  static const KernelTable<LutProblem> table{
      {"gemv_f32lut_avx512", Isa::kAvx512, lut_gemv_serves, nullptr, QF_KERNEL_AVX512(run_lut_fast<detail::gemv_f32lut_avx512>)},
      {"gemv_f32lut_avx2", Isa::kAvx2, lut_gemv_serves, nullptr, QF_KERNEL_AVX2(run_lut_fast<detail::gemv_f32lut_avx2>)},
      {"linear_f32lut_reference", Isa::kReference, lut_gemv_serves, nullptr, run_lut_reference},
      {kDequantGemmKernel, Isa::kReference, lut_gemm_serves, nullptr, run_lut_dequant_gemm},
  };
  return table;
}

void PackedLinearLut::run(const float* x, int64_t M, float* y, RunInfo* info) const {
  QF_REQUIRE(packed_.defined(), "kernels/cpu: PackedLinearLut: not packed");
  QF_REQUIRE(M >= 0 && (M == 0 || (x != nullptr && y != nullptr)), "kernels/cpu: PackedLinearLut: M=", M,
             " or a null pointer");
  run_kernel_table(lut_linear_kernels(), LutProblem{this, x, M, y}, M, info);
}

}  // namespace qforge::kernels

// Codebook (look-up-table) Linear: validation, packing into the 16-byte blocks and 16-entry tables,
// and the dispatcher (gemv_f32lut_avx512 -> gemv_f32lut_avx2 -> linear_f32lut_reference) over
// ATen's threads. Layout and float order: kernels/cpu/lut_linear.h.
#include "kernels/cpu/lut_linear.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "framework/core/error.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/parallel_blocks.h"

namespace qforge::kernels {

namespace {

int64_t round_up_to(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// Reads the sizes of a possibly undefined tensor for an error message.
at::IntArrayRef sizes_of(const at::Tensor& t) { return t.defined() ? t.sizes() : at::IntArrayRef{}; }

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

void PackedLinearLut::run(const float* x, int64_t M, float* y, RunInfo* info) const {
  QF_REQUIRE(packed_.defined(), "kernels/cpu: PackedLinearLut: not packed");
  QF_REQUIRE(M >= 0 && (M == 0 || (x != nullptr && y != nullptr)), "kernels/cpu: PackedLinearLut: M=", M,
             " or a null pointer");
  RunInfo local;
  RunInfo& ri = info != nullptr ? *info : local;
  ri = RunInfo{};
  // Runs `kernel` over whole row blocks, each thread a contiguous range of them; every row's sum is
  // computed by one call in the same order, so the result does not depend on the thread count.
  [[maybe_unused]] auto run_fast = [&](void (*kernel)(const detail::LutArgs&, int64_t, int64_t)) {
    std::vector<float> xp;
    detail::LutArgs args;
    args.x = x;
    args.ldx = k_;
    if (kp_ != k_) {  // kernels read whole blocks: pad x rows with 0.0f
      xp.assign(static_cast<size_t>(M * kp_), 0.0f);
      for (int64_t m = 0; m < M; ++m) {
        std::memcpy(xp.data() + m * kp_, x + m * k_, static_cast<size_t>(k_) * sizeof(float));
      }
      args.x = xp.data();
      args.ldx = kp_;
    }
    args.m = M;
    args.packed = packed_.data_ptr<uint8_t>();
    args.tables = tables_.data_ptr<float>();
    args.n = n_;
    args.kp = kp_;
    args.groups = groups_;
    args.group_size = group_size_;
    args.storage_bits = lut_storage_bits(bits_);
    args.bias = bias_.defined() ? bias_.data_ptr<float>() : nullptr;
    args.y = y;
    args.ldy = n_;
    const int64_t blocks = (n_ + kLutRowBlock - 1) / kLutRowBlock;
    detail::parallel_over_blocks(blocks, kLutRowBlock * kp_ * M, [&](int64_t b, int64_t e) {
      kernel(args, b * kLutRowBlock, std::min(n_, e * kLutRowBlock));
    });
  };
  std::string why;
  constexpr const char* kAvx512 = "gemv_f32lut_avx512";
  constexpr const char* kAvx2 = "gemv_f32lut_avx2";
  if (isa_usable(Isa::kAvx512, &why)) {
#ifdef QFORGE_KERNELS_AVX512
    ri.kernel = kAvx512;
    if (M > 0) run_fast(&detail::gemv_f32lut_avx512);
    return;
#endif
  }
  ri.skip(kAvx512, why);
  why.clear();
  if (isa_usable(Isa::kAvx2, &why)) {
#ifdef QFORGE_KERNELS_AVX2
    ri.kernel = kAvx2;
    if (M > 0) run_fast(&detail::gemv_f32lut_avx2);
    return;
#endif
  }
  ri.skip(kAvx2, why);
  ri.kernel = "linear_f32lut_reference";
  if (M == 0) return;
  const at::Tensor idx = indices();
  const at::Tensor cb = codebook();
  linear_f32_lut_reference(x, M, idx.data_ptr<uint8_t>(), cb.data_ptr<float>(), n_, k_, group_size_, bits_,
                           bias_.defined() ? bias_.data_ptr<float>() : nullptr, y);
}

}  // namespace qforge::kernels

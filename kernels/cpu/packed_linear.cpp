// PackedLinearS8 / PackedLinearS4: pack once at freeze, then quantize activations and dispatch.
#include "kernels/cpu/packed_linear.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "framework/core/error.h"
#include "kernels/cpu/gemm_s8s8s32_onednn.h"
#include "kernels/cpu/gemv_s4.h"
#include "kernels/cpu/gemv_s8.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/linear_decode.h"
#include "kernels/cpu/linear_s8g.h"
#include "kernels/cpu/linear_weight_only.h"
#include "kernels/cpu/quantize_rows_s8.h"
#include "kernels/cpu/workspace.h"

namespace qforge::kernels {

namespace {

std::string shape_str(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

at::Tensor checked_bias(const at::Tensor& bias, int64_t N, const char* who) {
  if (!bias.defined()) return bias;
  QF_REQUIRE(bias.dim() == 1 && bias.size(0) == N, "kernels/cpu: ", who, " bias has shape ",
             shape_str(bias), ", expected [", N, "]");
  return bias.to(at::kFloat).contiguous().clone();
}

// Flattens x [..., K] to a dense float [M, K] and prepares y [..., N].
struct FlatRows {
  at::Tensor x, y;
  int64_t m = 0;
};

FlatRows flatten_rows(const at::Tensor& x, int64_t K, int64_t N, const char* who) {
  QF_REQUIRE(x.defined(), "kernels/cpu: ", who, "::run got an undefined tensor");
  QF_REQUIRE(x.dim() >= 1 && x.size(-1) == K, "kernels/cpu: ", who, "::run input has shape ",
             shape_str(x), ", expected [..., ", K, "] (in_features)");
  QF_REQUIRE(x.scalar_type() == at::kFloat, "kernels/cpu: ", who, "::run input dtype ",
             x.scalar_type(), ", expected float32");
  QF_REQUIRE(x.device().is_cpu(), "kernels/cpu: ", who, "::run input must be on the CPU");
  FlatRows r;
  r.x = x.contiguous();
  r.m = K > 0 ? r.x.numel() / K : 0;
  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end());
  out_shape.back() = N;
  r.y = at::empty(out_shape, x.options().memory_format(at::MemoryFormat::Contiguous));
  return r;
}

// y [..., N] from x [..., K]: rows(x, M, y) on the dense flattened rows.
template <typename F>
at::Tensor on_rows(const at::Tensor& x, int64_t K, int64_t N, const char* who, const F& rows) {
  const FlatRows r = flatten_rows(x, K, N, who);
  rows(r.x.data_ptr<float>(), r.m, r.y.data_ptr<float>());
  return r.y;
}

int64_t tensor_bytes(const at::Tensor& t) {
  return t.defined() ? static_cast<int64_t>(t.numel() * t.element_size()) : 0;
}

Fp16Bits* scale_bits(const at::Tensor& t) {
  static_assert(sizeof(int16_t) == sizeof(Fp16Bits), "int16 tensor holds the fp16 bits");
  return reinterpret_cast<Fp16Bits*>(t.data_ptr<int16_t>());
}

const float* data_or_null(const at::Tensor& t) {
  return t.defined() ? t.data_ptr<float>() : nullptr;
}

// run(x, M, y) of both packed forms: x [M, K] quantized per act_scale into the thread's scratch,
// then gemm(codes, row scales); M == 0 runs nothing.
template <typename Gemm>
void run_quantized(const char* who, const at::Tensor& packed, const float* x, int64_t M, int64_t K, float* y,
                   RunInfo* info, ActScale act_scale, int act_qmax, float act_clip, const Gemm& gemm) {
  QF_REQUIRE(packed.defined(), "kernels/cpu: ", who, "::run on an empty (default) object");
  QF_REQUIRE(M >= 0, "kernels/cpu: ", who, "::run got M=", M);
  if (M == 0) {
    if (info != nullptr) *info = RunInfo{"none (M=0)", ""};
    return;
  }
  QF_REQUIRE(x != nullptr && y != nullptr, "kernels/cpu: ", who, "::run got a null pointer");
  const detail::ScratchArray<int8_t> codes(detail::Scratch::kActivationCodes, M * K);
  const detail::ScratchArray<float> scales(detail::Scratch::kActivationScales, M);
  quantize_rows_s8(x, M, K, act_scale, codes.data(), K, scales.data(), nullptr, act_qmax, act_clip);
  gemm(codes.data(), scales.data());
}

}  // namespace

// ---------------------------------------------------------------------------------------------
PackedLinearS8::PackedLinearS8(const at::Tensor& weight, const at::Tensor& w_scale,
                               const at::Tensor& bias, const PackOptions& options) {
  QF_REQUIRE(weight.defined() && weight.dim() == 2 && weight.scalar_type() == at::kChar,
             "kernels/cpu: PackedLinearS8 weight must be int8 [N, K], got ",
             weight.defined() ? shape_str(weight) : "undefined");
  n_ = weight.size(0);
  k_ = weight.size(1);
  QF_REQUIRE(n_ > 0 && k_ > 0, "kernels/cpu: PackedLinearS8 weight is empty ", shape_str(weight));
  QF_REQUIRE(k_ <= kMaxInFeaturesS8, "kernels/cpu: PackedLinearS8 in_features K=", k_,
             " exceeds ", kMaxInFeaturesS8, " (the int32 accumulator could overflow)");
  QF_REQUIRE(w_scale.defined() && w_scale.numel() == n_, "kernels/cpu: PackedLinearS8 w_scale has ",
             w_scale.defined() ? shape_str(w_scale) : "undefined", ", expected [", n_, "]");
  const at::Tensor w = weight.contiguous();
  const int64_t np = round_up(n_, kS8BlockN), kp = round_up(k_, kS8BlockK);
  packed_ = at::empty({np * kp}, at::kChar);
  colsum_ = at::empty({np}, at::kInt);
  pack_s8_n16k4_reference(w.data_ptr<int8_t>(), n_, k_, packed_.data_ptr<int8_t>(),
                          colsum_.data_ptr<int32_t>());
  w_scale_ = w_scale.to(at::kFloat).reshape({n_}).contiguous().clone();
  bias_ = checked_bias(bias, n_, "PackedLinearS8");
  if (!options.onednn) {
    onednn_status_ = "not requested (PackOptions::onednn = false)";
  } else {
    onednn_ = detail::onednn_pack_s8(w.data_ptr<int8_t>(), n_, k_, &onednn_status_);
    if (onednn_ != nullptr && detail::onednn_impl(*onednn_).find("amx") != std::string::npos) {
      onednn_min_m_ = kOneDnnMinMAmx;
    }
  }
}

S8N16K4View PackedLinearS8::view() const {
  S8N16K4View v;
  v.data = packed_.data_ptr<int8_t>();
  v.colsum = colsum_.data_ptr<int32_t>();
  v.n = n_;
  v.k = k_;
  v.kp = round_up(k_, kS8BlockK);
  return v;
}

int64_t PackedLinearS8::bytes() const {
  return tensor_bytes(packed_) + tensor_bytes(colsum_) + tensor_bytes(w_scale_) +
         tensor_bytes(bias_) + (onednn_ ? detail::onednn_bytes(*onednn_) : 0);
}

at::Tensor PackedLinearS8::weight() const {
  QF_REQUIRE(packed_.defined(), "kernels/cpu: PackedLinearS8 is empty");
  at::Tensor w = at::empty({n_, k_}, at::kChar);
  unpack_s8_n16k4_reference(packed_.data_ptr<int8_t>(), n_, k_, w.data_ptr<int8_t>());
  return w;
}

void PackedLinearS8::run(const float* x, int64_t M, float* y, RunInfo* info,
                         ActScale act_scale, int act_qmax, float act_clip) const {
  run_quantized("PackedLinearS8", packed_, x, M, k_, y, info, act_scale, act_qmax, act_clip,
                [&](const int8_t* q, const float* a_scale) {
    GemvS8Problem p = s8s8f32_problem(q, M, a_scale, view(), w_scale_.data_ptr<float>(), data_or_null(bias_), y);
    p.onednn = onednn_.get();
    p.onednn_status = &onednn_status_;
    p.onednn_min_m = onednn_min_m_;
    run_kernel_table(gemv_s8_kernels(), p, M, info);
  });
}

at::Tensor PackedLinearS8::run(const at::Tensor& x, RunInfo* info, ActScale act_scale) const {
  return on_rows(x, k_, n_, "PackedLinearS8",
                 [&](const float* rows, int64_t m, float* y) { run(rows, m, y, info, act_scale); });
}

at::Tensor PackedLinearS8::run_weight_only(const at::Tensor& x, RunInfo* info) const {
  QF_REQUIRE(packed_.defined(), "kernels/cpu: PackedLinearS8::run_weight_only on an empty object");
  return on_rows(x, k_, n_, "PackedLinearS8", [&](const float* rows, int64_t m, float* y) {
    linear_f32s8f32(rows, m, view(), w_scale_.data_ptr<float>(), data_or_null(bias_), y, info);
  });
}

at::Tensor PackedLinearS8::run_decode(const at::Tensor& x, RunInfo* info) const {
  QF_REQUIRE(packed_.defined(), "kernels/cpu: PackedLinearS8::run_decode on an empty object");
  return on_rows(x, k_, n_, "PackedLinearS8", [&](const float* rows, int64_t m, float* y) {
    linear_q8b32s8f32(rows, m, view(), w_scale_.data_ptr<float>(), data_or_null(bias_), y, info);
  });
}

// ---------------------------------------------------------------------------------------------
PackedLinearS4::PackedLinearS4(const at::Tensor& weight, const at::Tensor& w_scale,
                               const at::Tensor& w_zero, int64_t group_size, const at::Tensor& bias,
                               QType qtype, S4Layout layout) {
  QF_REQUIRE(nibble_packed(qtype), "kernels/cpu: PackedLinearS4 needs a nibble-packed integer qtype "
             "(qint4, quint4 or qint3), got ", qtype.name);
  QF_REQUIRE(weight.defined() && weight.dim() == 2 && weight.scalar_type() == at::kChar,
             "kernels/cpu: PackedLinearS4 weight must be int8 [N, K] holding ", qtype.name,
             " values, got ", weight.defined() ? shape_str(weight) : "undefined");
  n_ = weight.size(0);
  k_ = weight.size(1);
  QF_REQUIRE(n_ > 0 && k_ > 0, "kernels/cpu: PackedLinearS4 weight is empty ", shape_str(weight));
  QF_REQUIRE(group_size > 0, "kernels/cpu: PackedLinearS4 group_size must be positive, got ",
             group_size);
  group_size_ = std::min(group_size, k_);
  groups_ = num_groups(k_, group_size_);
  qtype_ = qtype;
  QF_REQUIRE(w_scale.defined() && w_scale.numel() == n_ * groups_ &&
                 (w_scale.dim() == 2 ? w_scale.size(0) == n_ : groups_ == 1),
             "kernels/cpu: PackedLinearS4 w_scale has shape ",
             w_scale.defined() ? shape_str(w_scale) : "undefined", ", expected [", n_, ", ",
             groups_, "] (K=", k_, ", group_size=", group_size, ")");
  if (w_zero.defined()) {
    QF_REQUIRE(w_zero.numel() == n_ * groups_, "kernels/cpu: PackedLinearS4 w_zero has shape ",
               shape_str(w_zero), ", expected [", n_, ", ", groups_, "]");
  }
  at::Tensor w = weight.contiguous();
  at::Tensor s = w_scale.to(at::kFloat).contiguous().reshape({n_, groups_});
  at::Tensor z = w_zero.defined() ? w_zero.to(at::kInt).contiguous().reshape({n_, groups_}) : at::Tensor();
  if (layout == S4Layout::kN16B32) layout_status_ = fold_for_n16b32(&w, &s, &z);
  const int64_t np = round_up(n_, kS4BlockN), kp = round_up(k_, kS4BlockK);
  packed_ = at::empty({np * kp / 2}, at::kByte);
  pack_s4_n16k8_reference(w.data_ptr<int8_t>(), n_, k_, static_cast<int>(qtype.quant_min),
                          packed_.data_ptr<uint8_t>());
  // fp16 bit patterns (ATen 1.13 has no uint16 dtype; int16 has the same size and alignment).
  scales_ = at::empty({np * groups_}, at::kShort);
  zeros_ = at::empty({np * groups_}, at::kChar);
  pack_s4_group_meta(s.data_ptr<float>(), z.defined() ? z.data_ptr<int32_t>() : nullptr, n_,
                     groups_, static_cast<int>(qtype.quant_min), scale_bits(scales_),
                     zeros_.data_ptr<int8_t>());
  bias_ = checked_bias(bias, n_, "PackedLinearS4");
  if (layout == S4Layout::kN16B32 && layout_status_.empty()) to_n16b32();
}

// n16b32 stores no zero points. Zero point -1 beside a positive scale is gguf load's form of a
// negative block scale d (codes -c - 1, scale |d|); such a block is stored as the file had it,
// codes c = ~(-c - 1) and scale -|d| (its sign bit marks it for weight() / w_zero()): every kernel
// then gives the n16k8 form's result bit for bit, since i_b and u are negated exactly and
// fma(u, -|d|, t) = fma(-u, |d|, t) (docs/kernels.md §3.3a). Returns why the weight does not fit
// n16b32 ("" when it does, *z then undefined).
std::string PackedLinearS4::fold_for_n16b32(at::Tensor* w, at::Tensor* s, at::Tensor* z) {
  if (qtype_.name != qint4.name) return std::string("the grid is ") + qtype_.name + ", not qint4";
  if (group_size_ != std::min(kS4B32K, k_)) return "group_size=" + std::to_string(group_size_) + ", not 32";
  if (!z->defined() || at::eq(*z, 0).all().item<bool>()) {
    *z = at::Tensor();
    return "";
  }
  const at::Tensor negative = z->eq(-1);
  if (!(negative | z->eq(0)).all().item<bool>()) return "zero points other than 0 and -1";
  if (at::signbit(*s).any().item<bool>()) return "zero points -1 beside negative scales";
  const at::Tensor per_k = negative.repeat_interleave(group_size_, 1).narrow(1, 0, k_);
  *w = at::where(per_k, w->bitwise_not(), *w).contiguous();  // ~c = -c - 1: [-8, 7] onto itself
  *s = at::where(negative, s->neg(), *s).contiguous();
  *z = at::Tensor();
  signs_folded_ = true;
  return "";
}

// The codes and scales packed above, moved into one n16b32 stream.
void PackedLinearS4::to_n16b32() {
  at::Tensor stream = at::empty({round_up(n_, kS4BlockN) / kS4BlockN * s4_b32_column_bytes(groups_)}, at::kByte);
  pack_s4_n16b32_reference(packed_.data_ptr<uint8_t>(), scale_bits(scales_), n_, k_, stream.data_ptr<uint8_t>());
  packed_ = stream;
  scales_ = zeros_ = at::Tensor();
  layout_ = S4Layout::kN16B32;
}

S4N16K8View PackedLinearS4::view() const {
  S4N16K8View v;
  v.data = packed_.data_ptr<uint8_t>();
  v.scales = scales_.defined() ? scale_bits(scales_) : nullptr;
  v.zeros = zeros_.defined() ? zeros_.data_ptr<int8_t>() : nullptr;
  v.layout = layout_;
  v.n = n_;
  v.k = k_;
  v.kp = round_up(k_, kS4BlockK);
  v.group_size = group_size_;
  v.groups = groups_;
  return v;
}

int64_t PackedLinearS4::bytes() const {
  return tensor_bytes(packed_) + tensor_bytes(scales_) + tensor_bytes(zeros_) + tensor_bytes(bias_);
}

// The packed codes, scales and zero-point codes as the constructor received them (n16b32 blocks
// stored with a folded sign unfolded: codes 15 - u, zero point -1, scale |d|).
S4Unpacked PackedLinearS4::unpacked() const {
  QF_REQUIRE(packed_.defined(), "kernels/cpu: PackedLinearS4 is empty");
  S4Unpacked u = unpack_s4(view());
  if (!signs_folded_) return u;
  const int zero_code = -1 - static_cast<int>(qtype_.quant_min);
  for (int64_t n = 0; n < n_; ++n) {
    for (int64_t g = 0; g < groups_; ++g) {
      float& scale = u.scale[n * groups_ + g];
      if (!std::signbit(scale)) continue;
      scale = -scale;
      u.zero[n * groups_ + g] = zero_code;
      for (int64_t k = g * group_size_; k < std::min(k_, (g + 1) * group_size_); ++k)
        u.codes[n * k_ + k] = static_cast<int8_t>(u.codes[n * k_ + k] ^ kS4NibbleMask);
    }
  }
  return u;
}

at::Tensor PackedLinearS4::weight() const {
  at::Tensor w = at::empty({n_, k_}, at::kChar);
  const S4Unpacked u = unpacked();
  int8_t* out = w.data_ptr<int8_t>();
  for (int64_t i = 0; i < n_ * k_; ++i) out[i] = static_cast<int8_t>(u.codes[i] + qtype_.quant_min);
  return w;
}

at::Tensor PackedLinearS4::w_scale() const { return at::tensor(unpacked().scale, at::kFloat).reshape({n_, groups_}); }

at::Tensor PackedLinearS4::w_zero() const {
  return at::tensor(unpacked().zero, at::kInt).reshape({n_, groups_}).add(qtype_.quant_min);
}

void PackedLinearS4::run(const float* x, int64_t M, float* y, RunInfo* info,
                         ActScale act_scale, int act_qmax, float act_clip) const {
  run_quantized("PackedLinearS4", packed_, x, M, k_, y, info, act_scale, act_qmax, act_clip,
                [&](const int8_t* q, const float* a_scale) {
    gemv_s8s4f32(q, M, a_scale, view(), data_or_null(bias_), y, info);
  });
}

namespace {
// The kernels take a scale per row; a static scale is one, broadcast into the thread's scratch.
const float* static_row_scales(const detail::ScratchArray<float>& scales, int64_t M, float a_scale) {
  std::fill(scales.data(), scales.data() + M, a_scale);
  return scales.data();
}
}  // namespace

void PackedLinearS8::run_static(const int8_t* q, int64_t M, float a_scale, float* y, RunInfo* info) const {
  QF_REQUIRE(packed_.defined(), "kernels/cpu: PackedLinearS8::run_static on an empty (default) object");
  const detail::ScratchArray<float> scales(detail::Scratch::kActivationScales, M);
  gemv_s8s8f32(q, M, static_row_scales(scales, M, a_scale), view(), w_scale_.data_ptr<float>(), data_or_null(bias_), y,
               info);
}

void PackedLinearS4::run_static(const int8_t* q, int64_t M, float a_scale, float* y, RunInfo* info) const {
  QF_REQUIRE(packed_.defined(), "kernels/cpu: PackedLinearS4::run_static on an empty (default) object");
  const detail::ScratchArray<float> scales(detail::Scratch::kActivationScales, M);
  gemv_s8s4f32(q, M, static_row_scales(scales, M, a_scale), view(), data_or_null(bias_), y, info);
}

at::Tensor PackedLinearS4::run(const at::Tensor& x, RunInfo* info, ActScale act_scale) const {
  return on_rows(x, k_, n_, "PackedLinearS4",
                 [&](const float* rows, int64_t m, float* y) { run(rows, m, y, info, act_scale); });
}

at::Tensor PackedLinearS4::run_weight_only(const at::Tensor& x, RunInfo* info) const {
  QF_REQUIRE(packed_.defined(), "kernels/cpu: PackedLinearS4::run_weight_only on an empty object");
  return on_rows(x, k_, n_, "PackedLinearS4", [&](const float* rows, int64_t m, float* y) {
    linear_f32s4f32(rows, m, view(), data_or_null(bias_), y, info);
  });
}

at::Tensor PackedLinearS4::run_decode(const at::Tensor& x, RunInfo* info) const {
  QF_REQUIRE(packed_.defined(), "kernels/cpu: PackedLinearS4::run_decode on an empty object");
  return on_rows(x, k_, n_, "PackedLinearS4", [&](const float* rows, int64_t m, float* y) {
    linear_q8b32s4f32(rows, m, view(), data_or_null(bias_), y, info);
  });
}

// ---------------------------------------------------------------------------------------------
namespace {

// [N, G] scales and zero points blocked as [Np / 16][G][16] (0 in padding).
template <typename T, typename F>
at::Tensor blocked_meta(int64_t N, int64_t G, at::ScalarType dtype, const F& value) {
  const int64_t np = round_up(N, kS8BlockN);
  at::Tensor out = at::zeros({np * G}, dtype);
  T* p = reinterpret_cast<T*>(out.data_ptr());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t g = 0; g < G; ++g) p[((n / kS8BlockN) * G + g) * kS8BlockN + n % kS8BlockN] = value(n * G + g);
  return out;
}

}  // namespace

PackedLinearS8G::PackedLinearS8G(const at::Tensor& weight, const at::Tensor& w_scale, const at::Tensor& w_zero,
                                 int64_t group_size, const at::Tensor& bias) {
  QF_REQUIRE(weight.defined() && weight.dim() == 2 && weight.scalar_type() == at::kChar,
             "kernels/cpu: PackedLinearS8G weight must be int8 [N, K], got ",
             weight.defined() ? shape_str(weight) : "undefined");
  n_ = weight.size(0);
  k_ = weight.size(1);
  QF_REQUIRE(n_ > 0 && k_ > 0 && group_size > 0, "kernels/cpu: PackedLinearS8G weight ", shape_str(weight),
             " or group_size ", group_size, " is empty");
  // No K limit: the q8 kernels' integer sums are per 32-block, the exact path has none.
  group_size_ = std::min(group_size, k_);
  groups_ = num_groups(k_, group_size_);
  QF_REQUIRE(w_scale.defined() && w_scale.numel() == n_ * groups_, "kernels/cpu: PackedLinearS8G w_scale has shape ",
             w_scale.defined() ? shape_str(w_scale) : "undefined", ", expected [", n_, ", ", groups_, "]");
  const at::Tensor s = w_scale.to(at::kFloat).reshape({n_ * groups_}).contiguous();
  QF_REQUIRE(at::isfinite(s).all().item<bool>(), "kernels/cpu: PackedLinearS8G has a NaN or inf group scale");
  const float* sp = s.data_ptr<float>();
  if (w_zero.defined() && !at::eq(w_zero, 0).all().item<bool>()) {
    QF_REQUIRE(w_zero.numel() == n_ * groups_, "kernels/cpu: PackedLinearS8G w_zero has shape ", shape_str(w_zero),
               ", expected [", n_, ", ", groups_, "]");
    const at::Tensor z = w_zero.to(at::kInt).reshape({n_ * groups_}).contiguous();
    QF_REQUIRE(z.ge(-128).all().item<bool>() && z.le(127).all().item<bool>(),
               "kernels/cpu: PackedLinearS8G zero points must lie in [-128, 127]");
    const int32_t* zp = z.data_ptr<int32_t>();
    zeros_ = blocked_meta<int8_t>(n_, groups_, at::kChar, [&](int64_t i) { return static_cast<int8_t>(zp[i]); });
  }
  bool fp16 = true;
  Fp16Bits bits = 0;
  for (int64_t i = 0; i < n_ * groups_ && fp16; ++i) fp16 = fp16_bits_exact(sp[i], &bits);
  if (fp16) {
    scales16_ = blocked_meta<Fp16Bits>(n_, groups_, at::kShort, [&](int64_t i) {
      fp16_bits_exact(sp[i], &bits);
      return bits;
    });
  } else {
    scales32_ = blocked_meta<float>(n_, groups_, at::kFloat, [&](int64_t i) { return sp[i]; });
  }
  const at::Tensor w = weight.contiguous();
  const int64_t np = round_up(n_, kS8BlockN), kp = round_up(k_, kS8BlockK);
  packed_ = at::empty({np * kp}, at::kChar);
  std::vector<int32_t> colsum(static_cast<size_t>(np));  // the n16k4 packer's sums, unused here
  pack_s8_n16k4_reference(w.data_ptr<int8_t>(), n_, k_, packed_.data_ptr<int8_t>(), colsum.data());
  bias_ = checked_bias(bias, n_, "PackedLinearS8G");
}

S8GroupView PackedLinearS8G::view() const {
  S8GroupView v;
  v.data = packed_.data_ptr<int8_t>();
  v.scales16 = scales16_.defined() ? scale_bits(scales16_) : nullptr;
  v.scales32 = scales32_.defined() ? scales32_.data_ptr<float>() : nullptr;
  v.zeros = zeros_.defined() ? zeros_.data_ptr<int8_t>() : nullptr;
  v.n = n_;
  v.k = k_;
  v.kp = round_up(k_, kS8BlockK);
  v.group_size = group_size_;
  v.groups = groups_;
  return v;
}

int64_t PackedLinearS8G::bytes() const {
  return tensor_bytes(packed_) + tensor_bytes(scales16_) + tensor_bytes(scales32_) + tensor_bytes(zeros_) +
         tensor_bytes(bias_);
}

at::Tensor PackedLinearS8G::weight() const {
  QF_REQUIRE(packed_.defined(), "kernels/cpu: PackedLinearS8G is empty");
  at::Tensor w = at::empty({n_, k_}, at::kChar);
  unpack_s8_n16k4_reference(packed_.data_ptr<int8_t>(), n_, k_, w.data_ptr<int8_t>());
  return w;
}

at::Tensor PackedLinearS8G::run_weight_only(const at::Tensor& x, RunInfo* info) const {
  QF_REQUIRE(packed_.defined(), "kernels/cpu: PackedLinearS8G::run_weight_only on an empty object");
  return on_rows(x, k_, n_, "PackedLinearS8G", [&](const float* rows, int64_t m, float* y) {
    linear_f32s8gf32(rows, m, view(), data_or_null(bias_), y, info);
  });
}

at::Tensor PackedLinearS8G::run_decode(const at::Tensor& x, RunInfo* info) const {
  QF_REQUIRE(packed_.defined(), "kernels/cpu: PackedLinearS8G::run_decode on an empty object");
  return on_rows(x, k_, n_, "PackedLinearS8G", [&](const float* rows, int64_t m, float* y) {
    linear_q8b32s8gf32(rows, m, view(), data_or_null(bias_), y, info);
  });
}

}  // namespace qforge::kernels

// The fused per-token ops of the decode path (kernels/cpu/token_ops.h): every table entry equals
// the reference bit for bit; against the ATen ops they replace, RoPE is bit-equal, RMSNorm and the
// causal softmax stay within the stated ulp bounds; a Llama's forward with them (no autograd)
// stays within 1e-5 of the ATen forward (autograd on), and so does its KV-cache decode.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "framework/core/error.h"
#include "framework/models/activation.h"
#include "framework/models/gpt2.h"
#include "framework/models/kv_cache.h"
#include "framework/models/llama.h"
#include "framework/nn/layer_norm.h"
#include "framework/nn/linear.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/token_ops.h"
#include "kernels/cpu/token_ops_exp.h"

namespace qforge::kernels {
namespace {

bool usable(Isa isa) {
  std::string why;
  return isa_usable(isa, &why);
}

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && std::memcmp(a.data_ptr<float>(), b.data_ptr<float>(), a.numel() * sizeof(float)) == 0;
}

// ATen's RMSNorm (nn::RMSNorm's unfused lines) and HF's masked softmax, the ops the kernels replace.
at::Tensor aten_rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  return w * (x * at::rsqrt(x.pow(2).mean(-1, true) + eps));
}
at::Tensor aten_softmax(const at::Tensor& w, int64_t past, int64_t window, double scale) {
  const int64_t T = w.size(-2), S = w.size(-1);
  const at::Tensor ones = at::ones({T, S}, at::kBool);
  at::Tensor visible = ones.tril(past);
  if (window > 0) visible = visible.logical_and(ones.triu(past - window + 1));
  return at::softmax(at::where(visible, w * scale, at::full({}, std::numeric_limits<float>::lowest())), -1);
}

TEST(GgufTokenOps, EveryTableEntryEqualsTheReferenceBitForBit) {
  at::manual_seed(1);
  for (int64_t dim : {7, 64, 100, 2048}) {
    const at::Tensor x = at::randn({3, dim}), r = at::randn({3, dim}), w = at::randn({dim});
    for (bool residual : {true, false}) {  // without: nn::RMSNorm::forward's call (r = h = nullptr)
      float* rp = residual ? r.data_ptr<float>() : nullptr;
      at::Tensor h0 = at::zeros_like(x), y0 = at::empty_like(x);
      rms_norm_reference({x.data_ptr<float>(), rp, residual ? h0.data_ptr<float>() : nullptr, w.data_ptr<float>(),
                          y0.data_ptr<float>(), 3, dim, 1e-5f});
      for (const auto& e : rms_norm_kernels()) {
        if (!e.run || !usable(e.isa)) continue;
        at::Tensor h = at::zeros_like(x), y = at::empty_like(x);
        e.run({x.data_ptr<float>(), rp, residual ? h.data_ptr<float>() : nullptr, w.data_ptr<float>(),
               y.data_ptr<float>(), 3, dim, 1e-5f});
        EXPECT_TRUE(same_bits(h, h0) && same_bits(y, y0)) << e.name << " dim " << dim << " residual " << residual;
      }
    }
  }
  for (int64_t dim : {7, 64, 100, 768}) {
    const at::Tensor x = at::randn({3, dim}) * 2 + 0.5, r = at::randn({3, dim}), w = at::randn({dim}), b = at::randn({dim});
    for (bool residual : {true, false}) {  // without: LayerNormImpl::forward_fused's call
      float* rp = residual ? r.data_ptr<float>() : nullptr;
      at::Tensor h0 = at::zeros_like(x), y0 = at::empty_like(x);
      layer_norm_reference({x.data_ptr<float>(), rp, residual ? h0.data_ptr<float>() : nullptr, w.data_ptr<float>(),
                            b.data_ptr<float>(), y0.data_ptr<float>(), 3, dim, 1e-5f});
      for (const auto& e : layer_norm_kernels()) {
        if (!e.run || !usable(e.isa)) continue;
        at::Tensor h = at::zeros_like(x), y = at::empty_like(x);
        e.run({x.data_ptr<float>(), rp, residual ? h.data_ptr<float>() : nullptr, w.data_ptr<float>(),
               b.data_ptr<float>(), y.data_ptr<float>(), 3, dim, 1e-5f});
        EXPECT_TRUE(same_bits(h, h0) && same_bits(y, y0)) << e.name << " dim " << dim << " residual " << residual;
      }
    }
  }
  for (int64_t n : {1, 15, 16, 17, 100, 3072, 70001}) {  // 70 001: several tasks of 32 768, the last clipped
    at::Tensor x = at::randn({n}) * 4;
    const float extremes[] = {0.0f, -0.0f, 30.0f, -30.0f, 1e-20f, -1e-20f, 200.0f, -200.0f, 3e38f, -3e38f};
    for (int64_t i = 0; i < n && i < 10; ++i) x[i * (n / 10 > 0 ? n / 10 : 1)] = extremes[i];
    at::Tensor ref = at::empty_like(x);
    gelu_tanh_reference({x.data_ptr<float>(), ref.data_ptr<float>(), n});
    ASSERT_TRUE(at::isfinite(ref).all().item<bool>()) << "n " << n;
    for (const auto& e : gelu_tanh_kernels()) {
      if (!e.run || !usable(e.isa)) continue;
      at::Tensor y = at::full_like(x, std::nanf(""));
      e.run({x.data_ptr<float>(), y.data_ptr<float>(), n});
      EXPECT_TRUE(same_bits(y, ref)) << e.name << " n " << n;
      at::Tensor in_place = x.clone();  // y may be x
      e.run({in_place.data_ptr<float>(), in_place.data_ptr<float>(), n});
      EXPECT_TRUE(same_bits(in_place, ref)) << e.name << " in place, n " << n;
    }
  }
  {  // NaN stays NaN, +inf gives +inf and -inf NaN (-inf · 0), as ATen's formula does
    const float in[] = {std::nanf(""), std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()};
    for (const auto& e : gelu_tanh_kernels()) {
      if (!e.run || !usable(e.isa)) continue;
      float out[3];
      e.run({in, out, 3});
      EXPECT_TRUE(std::isnan(out[0]) && out[1] == in[1] && std::isnan(out[2])) << e.name;
    }
  }
  for (int64_t dim : {10, 64, 128}) {
    const at::Tensor x = at::randn({5, 4, dim}), cos = at::randn({5, dim}), sin = at::randn({5, dim});
    at::Tensor ref = x.clone();
    rope_reference({ref.data_ptr<float>(), cos.data_ptr<float>(), sin.data_ptr<float>(), 5, 4, dim, 5});
    for (const auto& e : rope_kernels()) {
      if (!e.run || !usable(e.isa)) continue;
      at::Tensor y = x.clone();
      e.run({y.data_ptr<float>(), cos.data_ptr<float>(), sin.data_ptr<float>(), 5, 4, dim, 5});
      EXPECT_TRUE(same_bits(y, ref)) << e.name << " dim " << dim;
    }
  }
  for (auto [T, S, window] : {std::tuple{1, 1, 0}, {1, 37, 0}, {6, 40, 0}, {4, 300, 17}, {1, 4096, 0}}) {
    const at::Tensor s = at::randn({3, T, S}) * 4;
    at::Tensor ref = s.clone();
    causal_softmax_reference({ref.data_ptr<float>(), 3, T, S, S - T, window, 0.125f});
    for (const auto& e : causal_softmax_kernels()) {
      if (!e.run || !usable(e.isa)) continue;
      at::Tensor p = s.clone();
      e.run({p.data_ptr<float>(), 3, T, S, S - T, window, 0.125f});
      EXPECT_TRUE(same_bits(p, ref)) << e.name << " T " << T << " S " << S;
    }
  }
}

// Bounds against ATen (float32): RoPE 0 (bit-equal); RMSNorm |Δy| <= 1e-6 |y| + 1e-7 max |y| (the
// sum of squares in another order, a few ulp); softmax |Δp| <= 1e-6 p + 1e-9 (exp within 2 ulp,
// another summation order).
TEST(GgufTokenOps, AgainstTheAtenOpsTheyReplace) {
  at::manual_seed(2);
  for (int64_t dim : {64, 2048}) {
    const at::Tensor x = at::randn({4, dim}) * 3, r = at::randn({4, dim}), w = at::rand({dim}) + 0.5;
    at::Tensor h = at::empty_like(x), y = at::empty_like(x);
    rms_norm_f32({x.data_ptr<float>(), r.data_ptr<float>(), h.data_ptr<float>(), w.data_ptr<float>(), y.data_ptr<float>(),
                  4, dim, 1e-5f});
    EXPECT_TRUE(at::equal(h, x + r));
    const at::Tensor ref = aten_rms_norm(x + r, w, 1e-5);
    const at::Tensor bound = 1e-6 * ref.abs() + 1e-7 * ref.abs().max();
    EXPECT_TRUE(((y - ref).abs() <= bound).all().item<bool>()) << "dim " << dim << ": " << (y - ref).abs().max();
    at::Tensor y1 = at::empty_like(x);  // no residual, as nn::RMSNorm::forward calls it
    rms_norm_f32({x.data_ptr<float>(), nullptr, nullptr, w.data_ptr<float>(), y1.data_ptr<float>(), 4, dim, 1e-5f});
    const at::Tensor ref1 = aten_rms_norm(x, w, 1e-5);
    EXPECT_TRUE(((y1 - ref1).abs() <= 1e-6 * ref1.abs() + 1e-7 * ref1.abs().max()).all().item<bool>())
        << "dim " << dim << " without residual: " << (y1 - ref1).abs().max();
  }
  // LayerNorm: |Δy| <= 1e-6 |y| + 1e-6 max |y| against at::layer_norm (other summation orders).
  for (int64_t dim : {24, 768, 2048}) {
    const at::Tensor x = at::randn({4, dim}) * 3 + 1, r = at::randn({4, dim}), w = at::rand({dim}) + 0.5,
                     b = at::randn({dim});
    at::Tensor h = at::empty_like(x), y = at::empty_like(x);
    layer_norm_f32({x.data_ptr<float>(), r.data_ptr<float>(), h.data_ptr<float>(), w.data_ptr<float>(),
                    b.data_ptr<float>(), y.data_ptr<float>(), 4, dim, 1e-5f});
    EXPECT_TRUE(at::equal(h, x + r));
    const at::Tensor ref = at::layer_norm(x + r, {dim}, w, b, 1e-5);
    EXPECT_TRUE(((y - ref).abs() <= 1e-6 * ref.abs() + 1e-6 * ref.abs().max()).all().item<bool>())
        << "dim " << dim << ": " << (y - ref).abs().max();
  }
  // GELU (tanh form): against the formula in double, |Δy| <= 1e-6 (1 + |u|) |y| + 2e-38 |x| (u's
  // few-ulp error is scaled by 2|u| in e where e carries y, for u < 0; e is 0 below exp(-87));
  // against at::gelu(x, "tanh"),
  // |Δy| <= 1e-6 |y| + 1.2e-7 |x| (ATen's 1 + tanh u loses |x| · 2^-24 to cancellation as tanh u
  // nears -1, which the kernel's form does not).
  {
    const at::Tensor x = at::cat({at::randn({4096}) * 3, at::linspace(-12, 12, 2001)});
    at::Tensor y = at::empty_like(x);
    gelu_tanh_f32({x.data_ptr<float>(), y.data_ptr<float>(), x.numel()});
    const at::Tensor xd = x.to(at::kDouble);
    const at::Tensor u = 0.7978845608028654 * (xd + 0.044715 * xd.pow(3));
    const at::Tensor exact = xd / (1 + at::exp(-2 * u));  // = x (1 + tanh u) / 2, no cancellation in double either
    const at::Tensor err = (y.to(at::kDouble) - exact).abs();
    EXPECT_TRUE((err <= 1e-6 * (1 + u.abs()) * exact.abs() + 2e-38 * xd.abs()).all().item<bool>())
        << (err / exact.abs()).max();
    const at::Tensor aten = at::gelu(x, "tanh");
    EXPECT_TRUE(((y - aten).abs() <= 1e-6 * aten.abs() + 1.2e-7 * x.abs()).all().item<bool>()) << (y - aten).abs().max();
    EXPECT_TRUE(at::equal(models::apply_activation("gelu_new", x), y)) << "GPT-2's activation runs the kernel";
    const at::Tensor xg = x.clone().requires_grad_(true);
    EXPECT_TRUE(models::apply_activation("gelu_new", xg).requires_grad()) << "autograd keeps ATen's op";
  }
  const at::Tensor x = at::randn({2, 3, 4, 64}), cos = at::randn({3, 64}), sin = at::randn({3, 64});
  at::Tensor y = x.clone();
  rope_f32({y.data_ptr<float>(), cos.data_ptr<float>(), sin.data_ptr<float>(), 6, 4, 64, 3});
  const at::Tensor xt = x.transpose(1, 2);  // [B, heads, T, D] as the model rotates it
  const at::Tensor rot = at::cat({-xt.narrow(-1, 32, 32), xt.narrow(-1, 0, 32)}, -1);
  EXPECT_TRUE(at::equal(y.transpose(1, 2), xt * cos + rot * sin));
  // Tested up to a 4096-key cache (the bound is stated for this range).
  for (auto [T, S, window] : {std::tuple{1, 48, 0}, {12, 12, 0}, {5, 64, 9}, {16, 4096, 0}, {1, 4096, 100}}) {
    const at::Tensor s = at::randn({8, T, S}) * 6;
    at::Tensor p = s.clone();
    causal_softmax_f32({p.data_ptr<float>(), 8, T, S, S - T, window, 0.125f});
    const at::Tensor ref = aten_softmax(s, S - T, window, 0.125);
    EXPECT_TRUE(((p - ref).abs() <= 1e-6 * ref + 1e-9).all().item<bool>()) << "T " << T << " S " << S << ": "
                                                                           << (p - ref).abs().max();
  }
}

// The decode attention over cache views: keys and values as strided [B, KV, S, D] slices of a
// larger store (a cache's reserve), grouped-query rows, sliding windows, D off the 16 lanes.
struct AttentionCase {
  int64_t B, KV, rep, T, S, D, window;
};
struct AttentionOperands {
  at::Tensor q, k, v;  // q [B, KV, rep * T, D] dense; k, v views of [B, KV, S + 5, D + 3] stores
};
AttentionOperands attention_operands(const AttentionCase& c) {
  AttentionOperands o;
  o.q = at::randn({c.B, c.KV, c.rep * c.T, c.D}) * 2;
  o.k = at::randn({c.B, c.KV, c.S + 5, c.D + 3}).narrow(2, 0, c.S).narrow(3, 0, c.D);
  o.v = at::randn({c.B, c.KV, c.S + 5, c.D + 3}).narrow(2, 0, c.S).narrow(3, 0, c.D);
  return o;
}
// Runs `kernel` on the case's operands (scores and out start as NaN); returns out.
at::Tensor run_attention(const AttentionCase& c, const AttentionOperands& o,
                         const std::function<void(const AttentionProblem&)>& kernel) {
  const at::Tensor scores = at::full({c.B * c.KV, c.rep * c.T, c.S}, std::nanf(""));
  const at::Tensor out = at::full({c.B, c.KV, c.rep * c.T, c.D}, std::nanf(""));
  AttentionProblem p;
  p.q = o.q.data_ptr<float>(), p.k = o.k.data_ptr<float>(), p.v = o.v.data_ptr<float>();
  p.scores = scores.data_ptr<float>(), p.out = out.data_ptr<float>();
  p.groups = c.B * c.KV, p.heads = c.KV, p.rows = c.rep * c.T, p.T = c.T, p.S = c.S, p.D = c.D;
  p.past = c.S - c.T, p.window = c.window, p.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.D)));
  p.k_batch_stride = o.k.stride(0), p.k_head_stride = o.k.stride(1), p.k_row_stride = o.k.stride(2);
  p.v_batch_stride = o.v.stride(0), p.v_head_stride = o.v.stride(1), p.v_row_stride = o.v.stride(2);
  kernel(p);
  return out;
}
// Decode-size cases, then prefill-size ones (row counts off the 4-row blocks, D past 64, windows
// narrower than a block's spread); both ops run all of them.
const AttentionCase kAttentionCases[] = {
    {1, 12, 1, 1, 48, 64, 0}, {2, 2, 4, 3, 20, 6, 0},    {1, 8, 4, 1, 300, 64, 17},  {2, 3, 2, 16, 40, 20, 0},
    {1, 1, 1, 1, 1, 128, 0},  {1, 2, 3, 5, 64, 33, 9},   {1, 2, 4, 40, 40, 64, 0},   {1, 2, 3, 37, 50, 20, 9},
    {2, 1, 1, 70, 130, 80, 0}, {1, 1, 2, 64, 600, 128, 0}, {1, 3, 1, 33, 33, 16, 2}};

// The two attention ops: kernel tables, references and dispatchers.
struct AttentionOp {
  const KernelTable<AttentionProblem>& table;
  void (*reference)(const AttentionProblem&);
  void (*run)(const AttentionProblem&, RunInfo*);
};
std::vector<AttentionOp> attention_ops() {
  return {{attention_kernels(), attention_reference, attention_f32},
          {attention_prefill_kernels(), attention_prefill_reference, attention_prefill_f32}};
}

TEST(GgufTokenOps, AttentionEntriesEqualTheReferenceBitForBit) {
  at::manual_seed(5);
  for (const AttentionOp& op : attention_ops()) {
    for (const AttentionCase& c : kAttentionCases) {
      const AttentionOperands o = attention_operands(c);
      const at::Tensor y0 = run_attention(c, o, op.reference);
      EXPECT_FALSE(y0.isnan().any().item<bool>());
      for (const auto& e : op.table) {
        if (!e.run || !usable(e.isa)) continue;
        EXPECT_TRUE(same_bits(run_attention(c, o, e.run), y0)) << e.name << " T " << c.T << " S " << c.S << " D " << c.D;
      }
    }
  }
}

// q read where it lies and the context written token-major (AttentionProblem's q_* / out_*
// strides): q a view of a [B, T, KV · rep, D + 3] buffer (query head kv · rep + r of position t),
// out [B, T, KV · rep, D + 1] (the padding column stays NaN), for the cases whose rows are evenly
// spaced there (rep = 1 or T = 1). Every entry, the reference included, gives the contiguous
// reference's context bit for bit.
TEST(GgufTokenOps, AttentionReadsStridedQueriesAndWritesTokenMajorContextBitForBit) {
  at::manual_seed(15);
  for (const AttentionOp& op : attention_ops()) {
    for (const AttentionCase& c : kAttentionCases) {
      if (c.rep > 1 && c.T > 1) continue;
      const int64_t Hq = c.KV * c.rep, rows = c.rep * c.T;
      AttentionOperands o = attention_operands(c);
      const at::Tensor qbuf = at::randn({c.B, c.T, Hq, c.D + 3}) * 2;
      const std::vector<int64_t> q_strides = {c.T * Hq * (c.D + 3), c.rep * (c.D + 3), c.T == 1 ? c.D + 3 : Hq * (c.D + 3), 1};
      const at::Tensor qv = qbuf.as_strided({c.B, c.KV, rows, c.D}, q_strides);
      o.q = qv.contiguous();
      const at::Tensor y0 = run_attention(c, o, op.reference);
      for (const auto& e : op.table) {
        if (!e.run || !usable(e.isa)) continue;
        const at::Tensor out = at::full({c.B, c.T, Hq, c.D + 1}, std::nanf(""));
        run_attention(c, o, [&](const AttentionProblem& dense) {
          AttentionProblem p = dense;
          p.q = qv.data_ptr<float>();
          p.q_batch_stride = q_strides[0], p.q_head_stride = q_strides[1], p.q_row_stride = q_strides[2];
          p.out = out.data_ptr<float>();
          p.out_batch_stride = c.T * Hq * (c.D + 1), p.out_head_stride = c.rep * (c.D + 1);
          p.out_row_stride = c.T == 1 ? c.D + 1 : Hq * (c.D + 1);
          e.run(p);
        });
        // [B, T, KV, rep, D] -> [B, KV, rep, T, D] = [B, KV, rows, D] (row r · T + t).
        const at::Tensor ctx = out.narrow(3, 0, c.D).view({c.B, c.T, c.KV, c.rep, c.D}).permute({0, 2, 3, 1, 4})
                                   .reshape({c.B, c.KV, rows, c.D});
        EXPECT_TRUE(same_bits(ctx.contiguous(), y0)) << e.name << " B " << c.B << " T " << c.T << " S " << c.S << " D " << c.D;
        EXPECT_TRUE(out.select(3, c.D).isnan().all().item<bool>()) << e.name << " wrote past D";
      }
    }
  }
  // Rows closer than D would overlap: refused.
  float buf[64] = {};
  AttentionProblem bad;
  bad.q = bad.k = bad.v = bad.scores = bad.out = buf;
  bad.groups = 1, bad.rows = 2, bad.T = 2, bad.S = 2, bad.D = 4, bad.k_row_stride = bad.v_row_stride = 4;
  bad.out_row_stride = 3;
  EXPECT_THROW(attention_f32(bad), Error);
  bad.out_row_stride = 8;
  EXPECT_NO_THROW(attention_f32(bad));
}

// fused_decode_attention_tokens: fused_decode_attention's context permuted to [B, T, H · D], bit for
// bit, q a strided view of a fused projection; undefined for grouped rows at T > 1.
TEST(GgufTokenOps, TokenMajorDecodeAttentionIsTheFusedContextPermuted) {
  at::manual_seed(16);
  at::NoGradGuard ng;
  for (const auto& [B, T, H] : std::vector<std::array<int64_t, 3>>{{1, 1, 12}, {2, 3, 4}, {2, 1, 2}}) {
    const int64_t D = 64, S = 9 + T;
    const at::Tensor qkv = at::randn({B, T, 3 * H * D});
    const at::Tensor q = qkv.narrow(2, 0, H * D).view({B, T, H, D}).permute({0, 2, 1, 3});
    const at::Tensor k = at::randn({B, H, S, D}), v = at::randn({B, H, S, D});
    const at::Tensor tokens = models::fused_decode_attention_tokens(q, k, v, T, 0, 0.125);
    const at::Tensor ctx = models::fused_decode_attention(q, k, v, T, 0, 0.125);
    ASSERT_TRUE(tokens.defined() && ctx.defined());
    EXPECT_EQ(tokens.sizes(), (at::IntArrayRef{B, T, H * D}));
    EXPECT_TRUE(same_bits(tokens, ctx.permute({0, 2, 1, 3}).reshape({B, T, H * D}).contiguous()));
  }
  const at::Tensor q = at::randn({1, 2, 2 * 3, 8}), k = at::randn({1, 2, 5, 8});  // rep 2, T 3
  EXPECT_FALSE(models::fused_decode_attention_tokens(q, k, k, 3, 0, 0.125).defined());
  EXPECT_TRUE(models::fused_decode_attention_tokens(q.narrow(2, 0, 2), k, k, 1, 0, 0.125).defined());
}

// Against the ops it replaces (the two float matmuls and HF's masked softmax, as Llama's grouped
// rows read them): |Δ| <= 2e-6 max |out| (another summation order and exp within 2 ulp).
TEST(GgufTokenOps, AttentionAgainstTheMatmulsAndSoftmaxItReplaces) {
  at::manual_seed(6);
  for (const AttentionOp& op : attention_ops()) {
    for (const AttentionCase& c : kAttentionCases) {
      const AttentionOperands o = attention_operands(c);
      const at::Tensor y = run_attention(c, o, [&](const AttentionProblem& p) { op.run(p, nullptr); });
      const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
      const at::Tensor w = at::matmul(o.q, o.k.transpose(-1, -2)).view({c.B * c.KV * c.rep, c.T, c.S});
      const at::Tensor p = aten_softmax(w, c.S - c.T, c.window, scale).view({c.B, c.KV, c.rep * c.T, c.S});
      const at::Tensor ref = at::matmul(p, o.v);
      EXPECT_LE((y - ref).abs().max().item<double>(), 2e-6 * ref.abs().max().item<double>())
          << op.table.front().name << " T " << c.T << " S " << c.S << " D " << c.D << " window " << c.window;
    }
    // Refused with valid pointers: rows not a multiple of T, a cache shorter than the query.
    float buf[32] = {};
    AttentionProblem bad;
    bad.q = bad.k = bad.v = bad.scores = bad.out = buf;
    bad.groups = 1, bad.rows = 2, bad.T = 2, bad.S = 2, bad.D = 4, bad.k_row_stride = bad.v_row_stride = 4;
    EXPECT_NO_THROW(op.run(bad, nullptr));
    bad.rows = 3;
    EXPECT_THROW(op.run(bad, nullptr), Error);
    bad.rows = 2, bad.S = 1;
    EXPECT_THROW(op.run(bad, nullptr), Error);
  }
}

TEST(GgufTokenOps, SoftmaxExpIsWithinTwoUlp) {
  double worst = 0;
  for (float t = -87.0f; t <= 0.0f; t += 0.00731f) {
    const double e = std::exp(static_cast<double>(t));
    worst = std::max(worst, std::abs(detail::exp_nonpositive(t) - e) / e);
  }
  EXPECT_LT(worst, 2.5e-7);  // 2 ulp of float (2^-22 = 2.4e-7)
  EXPECT_EQ(detail::exp_nonpositive(0.0f), 1.0f);
  EXPECT_EQ(detail::exp_nonpositive(-88.0f), 0.0f);
  EXPECT_EQ(detail::exp_nonpositive(-std::numeric_limits<float>::infinity()), 0.0f);
}

// A model's no-grad forward (fused ops) against its recorded one (autograd: the ATen ops), within
// 1e-5 of the logits' range and not bit-equal (the fused ops ran); then a 5-token prompt and one
// token at a time through a cache, against the fused forward.
template <class Model>
void expect_fused_forward_and_decode(Model& m, const at::Tensor& ids) {
  const at::Tensor aten = m->forward(ids);
  EXPECT_TRUE(aten.requires_grad());
  at::NoGradGuard ng;
  const at::Tensor fused = m->forward(ids);
  const double scale = aten.abs().max().item<double>();
  EXPECT_LT((fused - aten.detach()).abs().max().item<double>(), 1e-5 * scale);
  EXPECT_FALSE(at::equal(fused, aten.detach())) << "the fused ops did not run";
  models::KvCache cache;
  std::vector<at::Tensor> steps = {m->forward(ids.narrow(1, 0, 5), &cache)};
  for (int64_t t = 5; t < ids.size(1); ++t) steps.push_back(m->forward(ids.narrow(1, t, 1), &cache));
  EXPECT_LT((at::cat(steps, 1) - fused).abs().max().item<double>(), 1e-5 * scale);
}

TEST(GgufTokenOps, LlamaWithFusedOpsMatchesTheAtenForwardAndDecodesLikeItsFullForward) {
  models::LlamaConfig c;
  c.vocab_size = 64, c.hidden_size = 64, c.intermediate_size = 128, c.num_hidden_layers = 2;
  c.num_attention_heads = 4, c.num_key_value_heads = 2, c.tie_word_embeddings = false;
  at::manual_seed(7);
  models::LlamaForCausalLM m(c);
  m->eval();
  expect_fused_forward_and_decode(m, at::randint(0, 64, {2, 12}, at::kLong));
  // Longer than kWeightOnlyMaxM: the no-grad forward takes the prefill attention (AVX-512).
  const at::Tensor ids = at::randint(0, 64, {1, 40}, at::kLong);
  expect_fused_forward_and_decode(m, ids);
  // A 20-token chunk after 20 cached ones (a prefill at past > 0) against the full forward.
  at::NoGradGuard ng;
  const at::Tensor full = m->forward(ids);
  models::KvCache cache;
  m->forward(ids.narrow(1, 0, 20), &cache);
  const at::Tensor chunk = m->forward(ids.narrow(1, 20, 20), &cache);
  EXPECT_LT((chunk - full.narrow(1, 20, 20)).abs().max().item<double>(), 1e-5 * full.abs().max().item<double>());
}

// The prefill attention runs only where an ISA entry serves it: capped below AVX-512 the model
// function declines (its scalar reference would be slower than the matmuls), the decode one still runs.
TEST(GgufTokenOps, PrefillAttentionDeclinesWhereOnlyItsReferenceWouldRun) {
  if (!usable(Isa::kAvx512)) GTEST_SKIP() << "no AVX-512 here: the decline is the only path";
  at::manual_seed(8);
  at::NoGradGuard ng;
  const at::Tensor q = at::randn({1, 2, 40, 16}), k = at::randn({1, 2, 40, 16}), v = at::randn({1, 2, 40, 16});
  EXPECT_TRUE(models::fused_prefill_attention(q, k, v, 40, 0, 0.25).defined());
  const Isa before = max_isa();
  set_max_isa(Isa::kAvx2);
  const bool prefill = models::fused_prefill_attention(q, k, v, 40, 0, 0.25).defined();
  const bool decode = models::fused_decode_attention(q.narrow(2, 0, 4), k, v, 4, 0, 0.25).defined();
  // A Llama's 40-token forward: capped, its other fused ops give the AVX-512 entries' bits, so a
  // difference is the prefill attention, which ran uncapped only.
  models::LlamaConfig c;
  c.vocab_size = 64, c.hidden_size = 64, c.intermediate_size = 128, c.num_hidden_layers = 2;
  c.num_attention_heads = 4, c.num_key_value_heads = 2;
  models::LlamaForCausalLM m(c);
  m->eval();
  const at::Tensor ids = at::randint(0, 64, {1, 40}, at::kLong);
  const at::Tensor capped = m->forward(ids);
  set_max_isa(before);
  EXPECT_FALSE(prefill);
  EXPECT_TRUE(decode);
  const at::Tensor fused = m->forward(ids);
  EXPECT_FALSE(at::equal(fused, capped)) << "the prefill attention did not run";
  EXPECT_LT((fused - capped).abs().max().item<double>(), 1e-5 * capped.abs().max().item<double>());
}

// GPT-2 takes the fused softmax of decode-size calls too: head_dim 6, so 1/√6 · scores is not
// bit for bit HF's scores / √6 and only the few-ulp bound holds; and its LayerNorms (ln_2 with the
// attention's residual add) and GELU through their kernels (no autograd).
TEST(GgufTokenOps, Gpt2WithTheFusedSoftmaxMatchesTheAtenForwardAndDecodesLikeItsFullForward) {
  models::Gpt2Config c;
  c.vocab_size = 50, c.n_positions = 32, c.n_embd = 24, c.n_layer = 2, c.n_head = 4;
  at::manual_seed(11);
  models::Gpt2LMHeadModel m(c);
  m->eval();
  expect_fused_forward_and_decode(m, at::randint(0, 50, {2, 12}, at::kLong));
  // Past kWeightOnlyMaxM only the prefill attention is fused, and only where an ISA entry runs it.
  if (usable(Isa::kAvx512)) expect_fused_forward_and_decode(m, at::randint(0, 50, {1, 24}, at::kLong));
  at::NoGradGuard ng;
  // A prompt longer than kWeightOnlyMaxM runs the prefill kernel (AVX-512; else the ATen ops),
  // decoding on from it the decode one.
  const at::Tensor long_ids = at::randint(0, 50, {1, 24}, at::kLong);
  const at::Tensor full = m->forward(long_ids);
  models::Gpt2KvCache long_cache;
  std::vector<at::Tensor> parts = {m->forward(long_ids.narrow(1, 0, 20), &long_cache)};
  for (int64_t t = 20; t < 24; ++t) parts.push_back(m->forward(long_ids.narrow(1, t, 1), &long_cache));
  EXPECT_LT((at::cat(parts, 1) - full).abs().max().item<double>(), 1e-5 * full.abs().max().item<double>());
}

// nn::LayerNorm: forward() stays ATen's; forward_fused / forward_residual run the kernel without
// autograd (then the output quantizer, none here) and ATen's ops with it.
TEST(GgufTokenOps, LayerNormFusedForwardsRunTheKernelOnlyWithoutAutograd) {
  at::manual_seed(12);
  nn::LayerNorm ln(torch::nn::LayerNormOptions({40}).eps(1e-5));
  {
    at::NoGradGuard ng;
    ln->weight.uniform_(0.5, 1.5);
    ln->bias.normal_();
  }
  const at::Tensor x = at::randn({2, 3, 40}), r = at::randn({2, 3, 40});
  const at::Tensor aten = ln->forward(x + r);
  EXPECT_TRUE(aten.requires_grad());
  const auto [h_grad, y_grad] = ln->forward_residual(x, r);
  EXPECT_TRUE(y_grad.requires_grad() && at::equal(y_grad, aten)) << "with autograd: ATen's ops";
  at::NoGradGuard ng;
  EXPECT_TRUE(at::equal(ln->forward(x + r), aten.detach())) << "forward() is ATen's";
  const auto [h, y] = ln->forward_residual(x, r);
  EXPECT_TRUE(at::equal(h, x + r));
  at::Tensor expected = at::empty({6, 40});
  const at::Tensor hc = (x + r).contiguous(), w = ln->weight.detach(), b = ln->bias.detach();
  layer_norm_reference({hc.data_ptr<float>(), nullptr, nullptr, w.data_ptr<float>(), b.data_ptr<float>(),
                        expected.data_ptr<float>(), 6, 40, 1e-5f});
  EXPECT_TRUE(same_bits(y.reshape({6, 40}).contiguous(), expected)) << "the kernel ran";
  EXPECT_TRUE(same_bits(ln->forward_fused(x + r).reshape({6, 40}).contiguous(), expected));
  EXPECT_LT((y - aten.detach()).abs().max().item<double>(), 1e-5);
  // Where the kernel does not apply, forward()'s ATen result: no affine parameters, two normalized
  // dimensions.
  nn::LayerNorm plain(torch::nn::LayerNormOptions({40}).elementwise_affine(false));
  EXPECT_TRUE(at::equal(plain->forward_fused(x), plain->forward(x)));
  nn::LayerNorm two(torch::nn::LayerNormOptions({3, 40}));
  EXPECT_TRUE(at::equal(two->forward_fused(x), two->forward(x)));
  EXPECT_TRUE(at::equal(two->forward_residual(x, r).second, two->forward(x + r)));
}

// A q projection narrower than heads x head_dim: the in-place RoPE kernel would write past it, so
// the forward refuses it by name first (fused path, no autograd).
TEST(GgufTokenOps, NarrowProjectionIsRefusedBeforeTheRopeKernelRuns) {
  models::LlamaConfig c;
  c.vocab_size = 64, c.hidden_size = 64, c.intermediate_size = 128, c.num_hidden_layers = 1;
  c.num_attention_heads = 4, c.num_key_value_heads = 2;
  models::LlamaForCausalLM m(c);
  m->eval();
  auto& attn = *m->model->layers->ptr(0)->as<models::LlamaDecoderLayerImpl>()->self_attn;
  attn.q_proj = nn::Linear(attn.replace_module("q_proj", nn::Linear(torch::nn::LinearOptions(64, 48).bias(false))));
  at::NoGradGuard ng;
  std::string error;
  try {
    m->forward(at::zeros({1, 3}, at::kLong));
  } catch (const Error& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("projection [1, 3, 48] is not [B, T, 64]"), std::string::npos) << error;
}

}  // namespace
}  // namespace qforge::kernels

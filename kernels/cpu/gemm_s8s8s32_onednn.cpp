// oneDNN matmul wrapper for the large-M int8 GEMM. Every oneDNN object is held by its C++ API
// class (RAII); no create/destroy pairs by hand.
#include "kernels/cpu/gemm_s8s8s32_onednn.h"

#include <oneapi/dnnl/dnnl.hpp>

#include <array>
#include <map>
#include <mutex>
#include <vector>

#include "framework/core/error.h"
#include "kernels/cpu/contention.h"
#include "kernels/cpu/workspace.h"

namespace qforge::kernels::detail {

using dnnl::memory;

namespace {

// oneDNN's fast (brgemm) matmul needs M at creation time; the weight format it prefers does not
// depend on M, so it is queried once with this M and every later primitive is created for the
// actual M with that fixed weight format.
constexpr int64_t kNominalM = 256;
// Primitives kept per distinct M (cleared when exceeded; creation costs about a millisecond).
constexpr size_t kMaxCachedPrimitives = 64;

}  // namespace

// Named (not anonymous) so OneDnnS8Weights may hold it in a unity build without
// -Wsubobject-linkage.
struct OneDnnPrimitive {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul matmul;
};

class OneDnnS8Weights {
 public:
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  memory::desc weights_md;
  memory weights;  // packed, in weights_md
  int64_t n = 0, k = 0;
  std::string impl;  // implementation chosen for kNominalM
  mutable std::mutex mutex;
  mutable std::map<int64_t, std::shared_ptr<const OneDnnPrimitive>> primitives;  // by M
};

namespace {

dnnl::matmul::primitive_desc make_pd(const dnnl::engine& engine, int64_t M, int64_t N, int64_t K,
                                     const memory::desc& wei) {
  const memory::desc src({M, K}, memory::data_type::s8, memory::format_tag::ab);
  const memory::desc dst({M, N}, memory::data_type::s32, memory::format_tag::ab);
  dnnl::primitive_attr attr;
  // User scratchpad: each run() brings its own, so concurrent runs of one primitive are safe.
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
#if DNNL_VERSION_MAJOR >= 3
  return dnnl::matmul::primitive_desc(engine, src, wei, dst, attr);
#else
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, wei, dst), attr, engine);
#endif
}

}  // namespace

std::shared_ptr<const OneDnnS8Weights> onednn_pack_s8(const int8_t* W, int64_t N, int64_t K,
                                                     std::string* status) {
  auto w = std::make_shared<OneDnnS8Weights>();
  try {
    const memory::desc any({K, N}, memory::data_type::s8, memory::format_tag::any);
    const dnnl::matmul::primitive_desc pd = make_pd(w->engine, kNominalM, N, K, any);
    w->impl = pd.impl_info_str();
    w->weights_md = pd.weights_desc();
    w->weights = memory(w->weights_md, w->engine);
    // W is [N, K] row-major, i.e. the K x N matrix oneDNN wants in format "ba".
    memory user({{K, N}, memory::data_type::s8, memory::format_tag::ba}, w->engine,
                const_cast<int8_t*>(W));
    dnnl::stream stream(w->engine);
    dnnl::reorder(user, w->weights).execute(stream, user, w->weights);
    stream.wait();
  } catch (const dnnl::error& e) {
    if (status != nullptr) *status = std::string("oneDNN matmul unavailable: ") + e.what();
    return nullptr;
  }
  w->n = N;
  w->k = K;
  if (status != nullptr) status->clear();
  return w;
}

namespace {
std::shared_ptr<const OneDnnPrimitive> primitive_for(const OneDnnS8Weights& w, int64_t M) {
  std::lock_guard<std::mutex> lock(w.mutex);
  auto it = w.primitives.find(M);
  if (it != w.primitives.end()) return it->second;
  if (w.primitives.size() >= kMaxCachedPrimitives) w.primitives.clear();
  auto p = std::make_shared<OneDnnPrimitive>();
  p->pd = make_pd(w.engine, M, w.n, w.k, w.weights_md);
  p->matmul = dnnl::matmul(p->pd);
  w.primitives.emplace(M, p);
  return p;
}
}  // namespace

void onednn_gemm_s8s8s32(const OneDnnS8Weights& w, const int8_t* A, int64_t M, int32_t* C) {
  QF_CHECK(M > 0 && A != nullptr && C != nullptr);
  const std::shared_ptr<const OneDnnPrimitive> prim = primitive_for(w, M);
  dnnl::stream stream(w.engine);
  memory src({{M, w.k}, memory::data_type::s8, memory::format_tag::ab}, w.engine,
             const_cast<int8_t*>(A));
  memory dst({{M, w.n}, memory::data_type::s32, memory::format_tag::ab}, w.engine, C);
  const memory::desc scratch_md = prim->pd.scratchpad_desc();
  const ScratchArray<uint8_t> scratch_bytes(Scratch::kOneDnnScratchpad, static_cast<int64_t>(scratch_md.get_size()));
  memory scratch(scratch_md, w.engine, scratch_bytes.data());
  probe_openmp_team();             // the stall guard cannot time oneDNN's own barrier (contention.h)
  const SerialOpenMpScope serial;  // one thread while it backs off
  prim->matmul.execute(stream, {{DNNL_ARG_SRC, src},
                            {DNNL_ARG_WEIGHTS, w.weights},
                            {DNNL_ARG_DST, dst},
                            {DNNL_ARG_SCRATCHPAD, scratch}});
  stream.wait();
}

int64_t onednn_bytes(const OneDnnS8Weights& w) {
  return static_cast<int64_t>(w.weights_md.get_size());
}

std::string onednn_impl(const OneDnnS8Weights& w) { return w.impl; }

struct OneDnnConvPrimitive {
  dnnl::convolution_forward::primitive_desc pd;
  dnnl::convolution_forward conv;
};

class OneDnnConvS8 {
 public:
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  memory::desc weights_md;
  memory weights;  // reordered once, in weights_md
  ConvGeometry nominal;
  std::string impl;  // implementation chosen for the nominal geometry
  mutable std::mutex mutex;
  // Primitives by (batch, in_h, in_w) (cleared when exceeded); nullptr: oneDNN has none for that
  // input size with these weights, or only its reference implementation (why in `refused`).
  mutable std::map<std::array<int64_t, 3>, std::shared_ptr<const OneDnnConvPrimitive>> primitives;
  mutable std::map<std::array<int64_t, 3>, std::string> refused;
};

namespace {

dnnl::convolution_forward::primitive_desc make_conv_pd(const dnnl::engine& engine, const ConvGeometry& g,
                                                       const memory::desc& wei) {
  using tag = memory::format_tag;
  using dt = memory::data_type;
  const memory::desc src({g.batch, g.in_channels, g.in_h, g.in_w}, dt::s8, tag::nhwc);
  const memory::desc dst({g.batch, g.out_channels, g.out_h(), g.out_w()}, dt::s32, tag::nhwc);
  const memory::dims strides{g.stride_h, g.stride_w}, pads{g.pad_h, g.pad_w};
  const memory::dims dilates{g.dilation_h - 1, g.dilation_w - 1};  // oneDNN counts the gaps
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
#if DNNL_VERSION_MAJOR >= 3
  return dnnl::convolution_forward::primitive_desc(engine, dnnl::prop_kind::forward_inference,
                                                   dnnl::algorithm::convolution_direct, src, wei, dst, strides, dilates,
                                                   pads, pads, attr);
#else
  return dnnl::convolution_forward::primitive_desc(
      dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, src, wei,
                                      dst, strides, dilates, pads, pads),
      attr, engine);
#endif
}

bool same_filter(const ConvGeometry& a, const ConvGeometry& b) {
  return a.in_channels == b.in_channels && a.out_channels == b.out_channels && a.groups == b.groups &&
         a.kernel_h == b.kernel_h &&
         a.kernel_w == b.kernel_w && a.stride_h == b.stride_h && a.stride_w == b.stride_w && a.pad_h == b.pad_h &&
         a.pad_w == b.pad_w && a.dilation_h == b.dilation_h && a.dilation_w == b.dilation_w;
}

}  // namespace

std::shared_ptr<const OneDnnConvS8> onednn_conv_s8(const int8_t* W, const ConvGeometry& nominal, std::string* status) {
  check_conv_geometry(nominal);
  auto c = std::make_shared<OneDnnConvS8>();
  c->nominal = nominal;
  try {
    // [N, C / groups, kh, kw]; grouped: the same bytes as oneDNN's goihw [G, N / G, C / G, kh, kw].
    const int64_t G = nominal.groups;
    const memory::dims wei_dims =
        G == 1 ? memory::dims{nominal.out_channels, nominal.in_channels, nominal.kernel_h, nominal.kernel_w}
               : memory::dims{G, nominal.out_channels / G, nominal.in_channels / G, nominal.kernel_h, nominal.kernel_w};
    const memory::desc any(wei_dims, memory::data_type::s8, memory::format_tag::any);
    const dnnl::convolution_forward::primitive_desc pd = make_conv_pd(c->engine, nominal, any);
    c->impl = pd.impl_info_str();
    c->weights_md = pd.weights_desc();
    c->weights = memory(c->weights_md, c->engine);
    memory user({wei_dims, memory::data_type::s8, G == 1 ? memory::format_tag::oihw : memory::format_tag::goihw},
                c->engine, const_cast<int8_t*>(W));
    dnnl::stream stream(c->engine);
    dnnl::reorder(user, c->weights).execute(stream, user, c->weights);
    stream.wait();
  } catch (const dnnl::error& e) {
    if (status != nullptr) *status = std::string("oneDNN int8 convolution unavailable: ") + e.what();
    return nullptr;
  }
  if (status != nullptr) status->clear();
  return c;
}

namespace {

std::shared_ptr<const OneDnnConvPrimitive> conv_primitive(const OneDnnConvS8& c, const ConvGeometry& g,
                                                          std::string* why) {
  std::shared_ptr<const OneDnnConvPrimitive> prim;
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    const std::array<int64_t, 3> key{g.batch, g.in_h, g.in_w};
    auto it = c.primitives.find(key);
    if (it != c.primitives.end()) {
      prim = it->second;
      const auto r = c.refused.find(key);
      if (prim == nullptr && why != nullptr && r != c.refused.end()) *why = r->second;
    } else {
      if (c.primitives.size() >= kMaxCachedPrimitives) {
        c.primitives.clear();
        c.refused.clear();
      }
      std::string reason;
      try {
        auto p = std::make_shared<OneDnnConvPrimitive>();
        p->pd = make_conv_pd(c.engine, g, c.weights_md);
        // For some input sizes oneDNN offers only its reference implementation with the packed
        // weight format (ref_int8: about a second per call for MobileNetV2's 4x4 1x1 layers at
        // batch 256, where im2col takes milliseconds): refused, as at packing, and cached so.
        const std::string impl = p->pd.impl_info_str();
        if (impl.rfind("ref", 0) == 0) {
          reason = "oneDNN offers only its reference implementation (" + impl + ") for this input size";
        } else {
          p->conv = dnnl::convolution_forward(p->pd);
          prim = p;
        }
      } catch (const dnnl::error& e) {
        reason = std::string("oneDNN has no primitive for this input size: ") + e.what();
      }
      c.primitives.emplace(key, prim);
      if (prim == nullptr) {
        c.refused[key] = reason;
        if (why != nullptr) *why = reason;
      }
    }
  }
  if (prim == nullptr && why != nullptr && why->empty()) *why = "oneDNN has no primitive for this input size";
  return prim;
}

}  // namespace

std::shared_ptr<const OneDnnConvPrimitive> onednn_conv_primitive(const OneDnnConvS8& c, const ConvGeometry& g,
                                                                 std::string* why) {
  QF_REQUIRE(same_filter(g, c.nominal), "kernels/cpu: onednn_conv_primitive: geometry differs from the packed filter's");
  return conv_primitive(c, g, why);
}

bool onednn_conv_s8s8s32(const OneDnnConvS8& c, const ConvGeometry& g, const int8_t* x_nhwc, int32_t* y_nhwc,
                         std::string* why) {
  QF_REQUIRE(same_filter(g, c.nominal), "kernels/cpu: onednn_conv_s8s8s32: geometry differs from the packed filter's");
  QF_CHECK(x_nhwc != nullptr && y_nhwc != nullptr);
  const std::shared_ptr<const OneDnnConvPrimitive> prim = conv_primitive(c, g, why);
  if (prim == nullptr) return false;
  onednn_conv_run(c, *prim, x_nhwc, y_nhwc);
  return true;
}

void onednn_conv_run(const OneDnnConvS8& c, const OneDnnConvPrimitive& p, const int8_t* x_nhwc, int32_t* y_nhwc) {
  QF_CHECK(x_nhwc != nullptr && y_nhwc != nullptr);
  const OneDnnConvPrimitive* prim = &p;
  dnnl::stream stream(c.engine);
  memory src(prim->pd.src_desc(), c.engine, const_cast<int8_t*>(x_nhwc));
  memory dst(prim->pd.dst_desc(), c.engine, y_nhwc);
  const memory::desc scratch_md = prim->pd.scratchpad_desc();
  const ScratchArray<uint8_t> scratch_bytes(Scratch::kOneDnnScratchpad, static_cast<int64_t>(scratch_md.get_size()));
  memory scratch(scratch_md, c.engine, scratch_bytes.data());
  probe_openmp_team();             // the stall guard cannot time oneDNN's own barrier (contention.h)
  const SerialOpenMpScope serial;  // one thread while it backs off
  prim->conv.execute(stream, {{DNNL_ARG_SRC, src},
                              {DNNL_ARG_WEIGHTS, c.weights},
                              {DNNL_ARG_DST, dst},
                              {DNNL_ARG_SCRATCHPAD, scratch}});
  stream.wait();
}

std::string onednn_impl(const OneDnnConvS8& c) { return c.impl; }

std::string onednn_impl_for(const OneDnnConvS8& c, const ConvGeometry& g) {
  QF_REQUIRE(same_filter(g, c.nominal), "kernels/cpu: onednn_impl_for: geometry differs from the packed filter's");
  try {
    return make_conv_pd(c.engine, g, c.weights_md).impl_info_str();
  } catch (const dnnl::error&) {
    return "";
  }
}

int64_t onednn_bytes(const OneDnnConvS8& c) { return static_cast<int64_t>(c.weights_md.get_size()); }

}  // namespace qforge::kernels::detail

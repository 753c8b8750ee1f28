// Scheme resolution per layer.
#include "framework/api/scheme.h"

#include <fnmatch.h>

#include <algorithm>
#include <sstream>

#include "framework/core/enum_names.h"
#include "framework/core/error.h"
#include "framework/nn/conv.h"
#include "framework/nn/embedding.h"
#include "framework/nn/linear.h"
#include "framework/nn/norm_layer.h"

namespace qforge {

namespace {
constexpr NamedValue<AttentionScales> kAttentionScalesNames[] = {{AttentionScales::kPerTensor, "per_tensor"},
                                                                  {AttentionScales::kPerHead, "per_head"}};
}  // namespace

const char* to_string(AttentionScales s) { return name_of(kAttentionScalesNames, s); }
AttentionScales attention_scales_from_name(const std::string& name) {
  return value_of(kAttentionScalesNames, name, "attention scales");
}
std::vector<std::string> attention_scales_names() { return names_of(kAttentionScalesNames); }

// Default group size of sub-8-bit weights (quanto's and GPTQ's usual choice).
constexpr int64_t kDefaultGroupSize = 128;

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"  // initialises the ignored Scheme::strict
Scheme::Scheme(QType weight_qtype) : weights(weight_qtype) {
  if (weight_qtype.is_integer() && weight_qtype.bits < 8) {
    weight_granularity = Granularity::kPerGroup;
    group_size = kDefaultGroupSize;
  }
  if (weight_qtype.is_float()) weight_granularity = Granularity::kPerChannel;
  if (weight_qtype.is_microscaling()) {  // the block is the format's, not a choice
    weight_granularity = Granularity::kPerGroup;
    group_size = weight_qtype.block_size;
  }
}
#pragma GCC diagnostic pop

bool pattern_matches(const std::string& pattern, const std::string& path) {
  return fnmatch(pattern.c_str(), path.c_str(), 0) == 0;
}

namespace {
// Size of the dimension per-group quantization splits (Linear in_features, Embedding dim).
int64_t grouped_dim(const QuantizableLayer& layer) {
  if (const auto* l = dynamic_cast<const nn::LinearImpl*>(&layer)) return l->options.in_features();
  if (const auto* e = dynamic_cast<const nn::EmbeddingImpl*>(&layer)) return e->options.embedding_dim();
  return -1;
}

// Microscaling blocks run along a Linear/Embedding input dimension, with the format's block size;
// anything else is refused (no per-channel fallback exists for these formats).
void check_microscaling(const std::string& path, const QuantizableLayer& layer, const QType& w, Granularity wg,
                        int64_t gs) {
  QF_REQUIRE(wg == Granularity::kPerGroup && gs == w.block_size, path, ": ", w.name, " scales blocks of ",
             w.block_size, " elements, fixed by the format; the scheme asks ", to_string(wg),
             wg == Granularity::kPerGroup ? detail::str_cat(" with group_size ", gs) : std::string());
  const int64_t dim = grouped_dim(layer);
  QF_REQUIRE(dim > 0 && dim % w.block_size == 0, path, ": ", w.name, " needs a Linear or Embedding input dimension",
             " that is a multiple of ", w.block_size, "; this ", layer.layer_type(),
             dim > 0 ? detail::str_cat(" has ", dim) : std::string(" has no such dimension"),
             " (keep it float with a rule)");
}
}  // namespace

std::optional<LayerScheme> Scheme::resolve(const std::string& path, const QuantizableLayer& layer,
                                           int* matched_rule, std::string* note) const {
  std::optional<QType> w = weights;
  Granularity wg = weight_granularity;
  int64_t gs = group_size;
  ActivationMode act = activations;
  AttentionScales attention = attention_scales;
  *matched_rule = -1;
  for (size_t i = 0; i < rules.size(); ++i) {
    const LayerRule& r = rules[i];
    if (!pattern_matches(r.pattern, path)) continue;
    *matched_rule = static_cast<int>(i);
    if (r.keep_float) return std::nullopt;
    if (r.weights) w = r.weights;
    // A rule naming a microscaling qtype gets its block unless it asks otherwise (then refused below).
    if (r.weights && r.weights->is_microscaling() && !r.weight_granularity && !r.group_size) {
      wg = Granularity::kPerGroup;
      gs = r.weights->block_size;
    }
    if (r.weight_granularity) wg = *r.weight_granularity;
    if (r.group_size) gs = *r.group_size;
    if (r.activations) act = *r.activations;
    if (r.attention_scales) attention = *r.attention_scales;
    break;
  }
  const std::string type = layer.layer_type();
  const bool norm = dynamic_cast<const nn::NormLayer*>(&layer) != nullptr;
  const bool weightless = norm || type == "MatMul";
  if (type == "Embedding") act = ActivationMode::kNone;
  if ((type == "Conv1d" || type == "Conv2d") && act == ActivationMode::kDynamicPerToken) {
    act = ActivationMode::kStatic;
    *note = "dynamic per-token activations do not apply to convolutions; using static";
  }
  if (norm && act == ActivationMode::kDynamicPerToken) act = ActivationMode::kNone;
  if (weightless && act == ActivationMode::kNone) return std::nullopt;

  LayerScheme ls;
  if (w && !weightless) {
    QuantizerConfig c;
    c.spec.qtype = *w;
    // Codebook levels have no zero point: the symmetric flag does not apply.
    c.spec.symmetric = !w->is_codebook() && (weight_symmetric || w->is_float() || w->is_microscaling());
    c.spec.granularity = wg;
    c.spec.axis = 0;
    c.lsq = weight_lsq && !w->is_codebook();
    if (weight_lsq && w->is_codebook()) *note = "LSQ does not apply to codebook weights; their levels train instead";
    if (w->is_microscaling()) check_microscaling(path, layer, *w, wg, gs);
    if (wg == Granularity::kPerGroup) {
      const int64_t dim = grouped_dim(layer);
      if (dim < 0 || gs <= 0 || dim % gs != 0) {
        *note = dim < 0 ? type + " weights are quantized per channel (groups apply to Linear/Embedding)"
                        : detail::str_cat("dimension ", dim, " is not a multiple of group_size ", gs,
                                          "; using per_channel");
        c.spec.granularity = Granularity::kPerChannel;
      } else {
        c.spec.group_size = gs;
      }
    }
    ls.weights = c;
  }
  ls.activations = act;
  if (act != ActivationMode::kNone) {
    QuantizerConfig a;
    const bool dynamic = act == ActivationMode::kDynamicPerToken;
    // Dynamic rows are symmetric signed grids (qint8, or W4A4's qint4); any other qtype is qint8 there.
    a.spec.qtype = dynamic && !QuantizerImpl::dynamic_qtype_supported(activation_qtype) ? qint8 : activation_qtype;
    a.spec.symmetric = dynamic || activation_symmetric || activation_qtype.is_float();
    a.spec.narrow_range = a.spec.symmetric && (a.spec.qtype == qint8 || dynamic);
    a.observer = observer;
    a.observer_options = observer_options;
    a.lsq = activation_lsq && act == ActivationMode::kStatic;
    if (dynamic) a.clip_ratio = activation_clip_ratio;
    if (type == "MatMul" && act == ActivationMode::kStatic && attention == AttentionScales::kPerHead) {
      // One scale per head: the heads axis of [batch, heads, tokens, features] operands, observed
      // by the per-channel twin of the scheme's observer.
      a.spec.granularity = Granularity::kPerChannel;
      a.spec.axis = kAttentionHeadAxis;
      a.observer = per_channel_observer_kind(observer);
      a.observer_options.ch_axis = kAttentionHeadAxis;
    }
    ls.activation = a;
  }
  if (!ls.weights && ls.activations == ActivationMode::kNone) return std::nullopt;
  ls.note = *note;
  return ls;
}

bool Scheme::asks_activations(ActivationMode mode) const {
  return activations == mode ||
         std::any_of(rules.begin(), rules.end(), [mode](const LayerRule& r) { return r.activations == mode; });
}

bool Scheme::asks_attention_scales(AttentionScales scales) const {
  return attention_scales == scales ||
         std::any_of(rules.begin(), rules.end(), [scales](const LayerRule& r) { return r.attention_scales == scales; });
}

std::string Scheme::to_string() const {
  std::ostringstream os;
  os << "weights=" << (weights ? weights->name : "float");
  if (weights) {
    os << " " << qforge::to_string(weight_granularity);
    if (weight_granularity == Granularity::kPerGroup) os << "(" << group_size << ")";
    if (weight_lsq) os << " lsq";
  }
  os << " activations=" << qforge::to_string(activations);
  if (activations == ActivationMode::kStatic) os << " " << activation_qtype.name << " observer=" << observer;
  if (activations == ActivationMode::kDynamicPerToken && QuantizerImpl::dynamic_qtype_supported(activation_qtype))
    os << " " << activation_qtype.name;
  if (activations == ActivationMode::kDynamicPerToken && activation_clip_ratio != 1.0f)
    os << " clip=" << activation_clip_ratio;
  if (attention_scales != AttentionScales::kPerTensor) os << " attention=" << qforge::to_string(attention_scales);
  if (!rules.empty()) os << " rules=" << rules.size();
  return os.str();
}

}  // namespace qforge

// Quantization-point attributes, written and read in one place.
#include "framework/io/quantizer_attrs.h"

#include "framework/core/error.h"

namespace qforge::io {

void write_quantizer_attrs(const h5::Group& g, const std::string& observer_kind, const ObserverOptions& options,
                           const QSpec& spec) {
  g.set_attr("observer_kind", observer_kind);
  // Only the options this kind reads (a min/max point has no bins, a histogram no averaging constant).
  const ObserverOptionUse use = observer_option_use(observer_kind, options);
  if (use.averaging_constant) g.set_attr("averaging_constant", options.averaging_constant);
  if (use.channel) {
    g.set_attr("ch_axis", options.ch_axis);
    g.set_attr("observer_group_size", options.group_size);
  }
  if (use.histogram) {
    g.set_attr("method", to_string(options.method));
    g.set_attr("bins", options.bins);
    g.set_attr("upsample_rate", options.upsample_rate);
  }
  if (use.percentile) g.set_attr("percentile", options.percentile);
  g.set_attr("qtype", spec.qtype.name);
  g.set_attr("bits", spec.qtype.bits);
  g.set_attr("granularity", to_string(spec.granularity));
  g.set_attr("axis", spec.axis);
  g.set_attr("group_size", spec.group_size);
  g.set_attr("symmetric", spec.symmetric);
  g.set_attr("narrow_range", spec.narrow_range);
  g.set_attr("reduce_range", spec.reduce_range);
  if (spec.qtype.is_integer()) {
    // Informational: the integer range the qparams were computed for.
    g.set_attr("quant_min", spec.quant_min());
    g.set_attr("quant_max", spec.quant_max());
  }
}

void read_quantizer_attrs(const h5::Group& g, std::string* observer_kind, ObserverOptions* options, QSpec* spec) {
  *observer_kind = g.attr_string("observer_kind");
  // Options a kind does not read may be absent (files before version 2 wrote them all).
  const ObserverOptions defaults;
  *options = defaults;
  if (g.has_attr("averaging_constant")) options->averaging_constant = g.attr_double("averaging_constant");
  if (g.has_attr("ch_axis")) options->ch_axis = g.attr_int("ch_axis");
  if (g.has_attr("observer_group_size")) options->group_size = g.attr_int("observer_group_size");
  if (g.has_attr("method")) options->method = histogram_method_from_name(g.attr_string("method"));
  if (g.has_attr("percentile")) options->percentile = g.attr_double("percentile");
  if (g.has_attr("bins")) options->bins = g.attr_int("bins");
  if (g.has_attr("upsample_rate")) options->upsample_rate = g.attr_int("upsample_rate");
  spec->qtype = qtype_from_name(g.attr_string("qtype"));
  QF_REQUIRE(g.attr_int("bits") == spec->qtype.bits, "attribute bits ", g.attr_int("bits"), " disagrees with qtype ",
             spec->qtype.name);
  spec->granularity = granularity_from_name(g.attr_string("granularity"));
  spec->axis = g.attr_int("axis");
  spec->group_size = g.attr_int("group_size");
  spec->symmetric = g.attr_int("symmetric") != 0;
  spec->narrow_range = g.attr_int("narrow_range") != 0;
  spec->reduce_range = g.attr_int("reduce_range") != 0;
  spec->validate();
}

bool same_options(const ObserverOptions& a, const ObserverOptions& b, const std::string& kind) {
  const ObserverOptionUse u = observer_option_use(kind, a);
  return (!u.averaging_constant || a.averaging_constant == b.averaging_constant) &&
         (!u.channel || (a.ch_axis == b.ch_axis && a.group_size == b.group_size)) &&
         (!u.histogram || (a.method == b.method && a.bins == b.bins && a.upsample_rate == b.upsample_rate)) &&
         (!u.percentile || a.percentile == b.percentile);
}

}  // namespace qforge::io

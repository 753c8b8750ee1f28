// Calibration dumps: HDF5 write/read and merge through the observers.
#include "framework/io/calibration_dump.h"

#include <ATen/ATen.h>

#include "framework/core/error.h"
#include "framework/io/atomic_file.h"
#include "framework/io/format.h"
#include "framework/io/hdf5.h"

namespace qforge::io {

namespace {

void write_entry(const h5::Group& g, const CalibrationEntry& e) {
  g.set_attr("observer_kind", e.observer_kind);
  g.set_attr("averaging_constant", e.options.averaging_constant);
  g.set_attr("ch_axis", e.options.ch_axis);
  g.set_attr("observer_group_size", e.options.group_size);
  g.set_attr("method", to_string(e.options.method));
  g.set_attr("percentile", e.options.percentile);
  g.set_attr("bins", e.options.bins);
  g.set_attr("upsample_rate", e.options.upsample_rate);
  g.set_attr("qtype", e.spec.qtype.name);
  g.set_attr("bits", e.spec.qtype.bits);
  g.set_attr("granularity", to_string(e.spec.granularity));
  g.set_attr("axis", e.spec.axis);
  g.set_attr("group_size", e.spec.group_size);
  g.set_attr("symmetric", e.spec.symmetric);
  g.set_attr("narrow_range", e.spec.narrow_range);
  g.set_attr("reduce_range", e.spec.reduce_range);
  if (e.spec.qtype.is_integer()) {
    // Informational: the integer range the qparams were computed for.
    g.set_attr("quant_min", e.spec.quant_min());
    g.set_attr("quant_max", e.spec.quant_max());
  }
  const h5::Group state = g.create_group("state");
  for (const auto& [name, t] : e.state) state.write_tensor(name, t);
  if (e.qparams.defined()) {
    const h5::Group qp = g.create_group("qparams");
    qp.write_tensor("scale", e.qparams.scale.to(at::kFloat));
    qp.write_tensor("zero_point", e.qparams.zero_point.to(at::kInt));
  }
}

CalibrationEntry read_entry(const h5::Group& g) {
  CalibrationEntry e;
  const std::string where = g.file_path() + ": group '" + g.path() + "'";
  try {
    e.observer_kind = g.attr_string("observer_kind");
    e.options.averaging_constant = g.attr_double("averaging_constant");
    e.options.ch_axis = g.attr_int("ch_axis");
    e.options.group_size = g.attr_int("observer_group_size");
    e.options.method = histogram_method_from_name(g.attr_string("method"));
    e.options.percentile = g.attr_double("percentile");
    e.options.bins = g.attr_int("bins");
    e.options.upsample_rate = g.attr_int("upsample_rate");
    e.spec.qtype = qtype_from_name(g.attr_string("qtype"));
    e.spec.granularity = granularity_from_name(g.attr_string("granularity"));
    e.spec.axis = g.attr_int("axis");
    e.spec.group_size = g.attr_int("group_size");
    e.spec.symmetric = g.attr_int("symmetric") != 0;
    e.spec.narrow_range = g.attr_int("narrow_range") != 0;
    e.spec.reduce_range = g.attr_int("reduce_range") != 0;
    e.spec.validate();
    const h5::Group state = g.open_group("state");
    for (const std::string& name : state.children()) e.state[name] = state.read_tensor(name);
    // Validates the state against its kind (names, dtypes, shapes) before anyone relies on it.
    e.make_observer();
    if (g.has("qparams")) {
      const h5::Group qp = g.open_group("qparams");
      e.qparams = make_qparams(e.spec, qp.read_tensor("scale"), qp.read_tensor("zero_point"));
    }
  } catch (const Error& err) {
    const std::string msg = err.what();
    // Errors from h5:: already name the file; others (observer, qparams) get the group added.
    if (msg.find(g.file_path()) != std::string::npos) throw;
    throw Error("framework/io: " + where + ": " + msg);
  }
  return e;
}

bool same_options(const ObserverOptions& a, const ObserverOptions& b) {
  return a.averaging_constant == b.averaging_constant && a.ch_axis == b.ch_axis &&
         a.group_size == b.group_size && a.method == b.method && a.percentile == b.percentile &&
         a.bins == b.bins && a.upsample_rate == b.upsample_rate;
}

bool same_spec(const QSpec& a, const QSpec& b) {
  return a.qtype == b.qtype && a.granularity == b.granularity && a.axis == b.axis &&
         a.group_size == b.group_size && a.symmetric == b.symmetric &&
         a.narrow_range == b.narrow_range && a.reduce_range == b.reduce_range;
}

}  // namespace

std::unique_ptr<Observer> CalibrationEntry::make_observer() const {
  std::unique_ptr<Observer> o = qforge::make_observer(observer_kind, options);
  o->load_state(state);
  return o;
}

CalibrationEntry make_calibration_entry(const Observer& observer, const ObserverOptions& options,
                                        const QSpec& spec) {
  CalibrationEntry e;
  e.observer_kind = observer.kind();
  e.options = options;
  e.spec = spec;
  for (const auto& [name, t] : observer.state()) e.state[name] = t.detach().cpu().clone();
  if (observer.has_data()) e.qparams = observer.qparams(spec);
  return e;
}

void save_calibration_dump(const std::string& path, const CalibrationDump& dump) {
  AtomicFile out(path);
  {
    h5::File f = h5::File::create(out.temp_path());
    const h5::Group root = f.root();
    write_format(root, kCalibrationFormat, kCalibrationFormatVersion);
    for (const auto& [module, points] : dump) {
      QF_REQUIRE(!module.empty(), "framework/io: calibration dump: empty module path");
      const h5::Group mg = root.create_group(module);
      for (const auto& [point, entry] : points) write_entry(mg.create_group(point), entry);
    }
    f.close();
  }
  out.commit();
}

CalibrationDump load_calibration_dump(const std::string& path) {
  const h5::File f = h5::File::open(path);
  const h5::Group root = f.root();
  check_format(root, kCalibrationFormat, kCalibrationFormatVersion);
  CalibrationDump dump;
  for (const std::string& module : root.children()) {
    const h5::Group mg = root.open_group(module);
    for (const std::string& point : mg.children()) dump[module][point] = read_entry(mg.open_group(point));
  }
  return dump;
}

CalibrationDump merge_calibration_dumps(const std::vector<CalibrationDump>& dumps) {
  // (module, point) -> merged observer and the entry describing it.
  std::map<std::pair<std::string, std::string>,
           std::pair<CalibrationEntry, std::unique_ptr<Observer>>> acc;
  for (size_t i = 0; i < dumps.size(); ++i) {
    for (const auto& [module, points] : dumps[i]) {
      for (const auto& [point, e] : points) {
        const std::string where = "framework/io: merge: '" + module + "/" + point + "'";
        auto it = acc.find({module, point});
        if (it == acc.end()) {
          acc.emplace(std::make_pair(module, point), std::make_pair(e, e.make_observer()));
          continue;
        }
        const CalibrationEntry& first = it->second.first;
        QF_REQUIRE(first.observer_kind == e.observer_kind, where, ": observer kind ",
                   first.observer_kind, " differs from ", e.observer_kind, " in dump ", i);
        QF_REQUIRE(same_options(first.options, e.options), where,
                   ": observer options differ in dump ", i);
        QF_REQUIRE(same_spec(first.spec, e.spec), where, ": spec ", first.spec.to_string(),
                   " differs from ", e.spec.to_string(), " in dump ", i);
        try {
          it->second.second->merge(*e.make_observer());
        } catch (const Error& err) {
          throw Error(where + " (dump " + std::to_string(i) + "): " + err.what());
        }
      }
    }
  }
  CalibrationDump out;
  for (auto& [key, value] : acc) {
    auto& [entry, observer] = value;
    out[key.first][key.second] = make_calibration_entry(*observer, entry.options, entry.spec);
  }
  return out;
}

}  // namespace qforge::io

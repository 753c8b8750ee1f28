// Calibration dumps: HDF5 write/read and merge through the observers.
#include "framework/io/calibration_dump.h"
#include "framework/io/quantizer_attrs.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "framework/core/error.h"
#include "framework/format/atomic_file.h"
#include "framework/io/format.h"
#include "framework/format/hdf5.h"

namespace qforge::io {

namespace {

// The layer-errors group of a model's root layer (module path ""), which cannot name a group.
constexpr const char* kRootLayerName = "__root__";

void write_entry(const h5::Group& g, const CalibrationEntry& e) {
  write_quantizer_attrs(g, e.observer_kind, e.options, e.spec);
  const h5::Group state = g.create_group("state");
  for (const auto& [name, t] : e.state) state.write_tensor(name, t);
  // Derived, for readers (never read back): a histogram's bin edges, min + i (max - min) / bins,
  // beside the state group (which holds exactly the observer's state).
  const auto mn = e.state.find("min"), mx = e.state.find("max"), h = e.state.find("histogram");
  if (mn != e.state.end() && mx != e.state.end() && h != e.state.end()) {
    const int64_t bins = h->second.size(-1);
    const at::Tensor lo = mn->second.to(at::kDouble).unsqueeze(-1), hi = mx->second.to(at::kDouble).unsqueeze(-1);
    const at::Tensor i = at::arange(bins + 1, at::kDouble);
    g.write_tensor("bin_edges", (lo + (hi - lo) * i / static_cast<double>(bins)).to(at::kFloat));
  }
  if (e.qparams.codebook.defined()) {
    // Codebook weights: the float16 levels; the range they cover is their min / max.
    const h5::Group qp = g.create_group("qparams");
    const at::Tensor cb = e.qparams.codebook.to(at::kFloat);
    qp.write_tensor("codebook", cb.to(at::kHalf));
    qp.write_tensor("clip_min", std::get<0>(cb.min(-1)));
    qp.write_tensor("clip_max", std::get<0>(cb.max(-1)));
  } else if (e.qparams.defined()) {
    const h5::Group qp = g.create_group("qparams");
    qp.write_tensor("scale", e.qparams.scale.to(at::kFloat));
    qp.write_tensor("zero_point", e.qparams.zero_point.to(at::kInt));
    // Derived, for readers: the range the grid covers (values outside it clip).
    const QSpec& sp = e.qparams.spec;
    const at::Tensor s = e.qparams.scale.to(at::kDouble), z = e.qparams.zero_point.to(at::kDouble);
    const double top = sp.qtype.is_float() ? sp.qtype.max_finite : static_cast<double>(sp.quant_max());
    const double bottom = sp.qtype.is_float() ? -sp.qtype.max_finite : static_cast<double>(sp.quant_min());
    qp.write_tensor("clip_min", ((bottom - z) * s).to(at::kFloat));
    qp.write_tensor("clip_max", ((top - z) * s).to(at::kFloat));
  }
}

CalibrationEntry read_entry(const h5::Group& g) {
  CalibrationEntry e;
  const std::string where = g.file_path() + ": group '" + g.path() + "'";
  try {
    read_quantizer_attrs(g, &e.observer_kind, &e.options, &e.spec);
    const h5::Group state = g.open_group("state");
    for (const std::string& name : state.children()) e.state[name] = state.read_tensor(name);
    // Validates the state against its kind (names, dtypes, shapes) before anyone relies on it.
    e.make_observer();
    if (g.has("qparams")) {
      const h5::Group qp = g.open_group("qparams");
      if (e.spec.qtype.is_codebook()) {
        const at::Tensor cb = qp.read_tensor("codebook").to(at::kFloat);
        QF_REQUIRE(cb.dim() >= 1 && cb.size(-1) == e.spec.qtype.levels() && at::isfinite(cb).all().item<bool>(),
                   "a ", e.spec.qtype.name, " codebook must hold ", e.spec.qtype.levels(),
                   " finite levels per row, got shape ", cb.sizes());
        e.qparams = QParams{e.spec, {}, {}, cb};
      } else {
        e.qparams = make_qparams(e.spec, qp.read_tensor("scale"), qp.read_tensor("zero_point"));
      }
    }
  } catch (const Error& err) {
    const std::string msg = err.what();
    // Errors from h5:: already name the file; others (observer, qparams) get the group added.
    if (msg.find(g.file_path()) != std::string::npos) throw;
    throw Error("framework/io: " + where + ": " + msg);
  }
  return e;
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

namespace {

void write_imatrix_group(const h5::Group& root, const Imatrix& imatrix) {
  const h5::Group ig = root.create_group(kImatrixGroup);
  for (const auto& [layer, e] : imatrix) {
    const h5::Group lg = ig.create_group(layer.empty() ? kRootLayerName : layer);
    lg.write_tensor("sum_sq", e.sum_sq.to(at::kDouble));
    if (e.sum.defined()) lg.write_tensor("sum", e.sum.to(at::kDouble));
    lg.set_attr("count", e.count);
  }
}

}  // namespace

void save_calibration_dump(const std::string& path, const CalibrationDump& dump, const SearchSensitivities* search,
                           const LayerErrorTable* errors, const Imatrix* imatrix) {
  AtomicFile out(path);
  {
    h5::File f = h5::File::create(out.temp_path());
    const h5::Group root = f.root();
    write_format(root, kCalibrationFormat, kCalibrationFormatVersion);
    if (search) {
      const h5::Group sg = root.create_group(kSearchGroup);
      sg.set_attr("key", search->key);
      for (const auto& [layer, values] : search->values) {
        const h5::Group lg = sg.create_group(layer);
        const auto t = search->traces.find(layer);
        lg.set_attr("hessian_trace", t == search->traces.end() ? 0.0 : t->second);
        for (const auto& [candidate, v] : values) lg.set_attr("s:" + candidate, v);
      }
    }
    if (errors) {
      const h5::Group eg = root.create_group(kLayerErrorsGroup);
      eg.set_attr("batches", errors->batches);
      for (size_t rank = 0; rank < errors->layers.size(); ++rank) {
        const LayerErrorRecord& l = errors->layers[rank];
        const h5::Group lg = eg.create_group(l.path.empty() ? kRootLayerName : l.path);
        lg.set_attr("rank", static_cast<int64_t>(rank));
        lg.set_attr("type", l.type);
        lg.set_attr("note", l.note);
        for (const auto& [name, v] : l.values) lg.set_attr(name, v);
      }
    }
    if (imatrix) write_imatrix_group(root, *imatrix);
    for (const auto& [module, points] : dump) {
      QF_REQUIRE(!module.empty(), "framework/io: calibration dump: empty module path");
      QF_REQUIRE(module != kSearchGroup && module != kLayerErrorsGroup && module != kImatrixGroup,
                 "framework/io: calibration dump: module path '",
                 module, "' is reserved");
      const h5::Group mg = root.create_group(module);
      for (const auto& [point, entry] : points) write_entry(mg.create_group(point), entry);
    }
    f.close();
  }
  out.commit();
}

namespace {

CalibrationDump read_dump(const std::string& path) {
  const h5::File f = h5::File::open(path);
  const h5::Group root = f.root();
  check_format(root, kCalibrationFormat, kCalibrationFormatVersion);
  CalibrationDump dump;
  for (const std::string& module : root.children()) {
    if (module == kSearchGroup || module == kLayerErrorsGroup || module == kImatrixGroup) continue;
    const h5::Group mg = root.open_group(module);
    for (const std::string& point : mg.children()) dump[module][point] = read_entry(mg.open_group(point));
  }
  return dump;
}

}  // namespace

// Dumps come from elsewhere (search.sensitivities_from, qdump, another machine's run): a crash of
// the HDF5 library on a crafted one is an error here (docs/formats.md, untrusted inputs).
CalibrationDump load_calibration_dump(const std::string& path) {
  return h5::read_untrusted(path, [&] { return read_dump(path); });
}

// One of the dump's optional groups (kSearchGroup, kLayerErrorsGroup) read by `read`; nullopt
// when the dump has none. The file is checked as load_calibration_dump checks it.
template <class T, class Read>
std::optional<T> read_optional_group(const std::string& path, const char* group, Read&& read) {
  return h5::read_untrusted(path, [&]() -> std::optional<T> {
    const h5::File f = h5::File::open(path);
    const h5::Group root = f.root();
    check_format(root, kCalibrationFormat, kCalibrationFormatVersion);
    if (!root.has(group)) return std::nullopt;
    return read(root.open_group(group));
  });
}

std::optional<SearchSensitivities> load_search_sensitivities(const std::string& path) {
  return read_optional_group<SearchSensitivities>(path, kSearchGroup, [](const h5::Group& sg) {
    SearchSensitivities s;
    s.key = sg.attr_string("key");
    for (const std::string& layer : sg.children()) {
      const h5::Group lg = sg.open_group(layer);
      s.traces[layer] = lg.attr_double("hessian_trace");
      auto& values = s.values[layer];
      for (const std::string& a : lg.attr_names())
        if (a.rfind("s:", 0) == 0) values[a.substr(2)] = lg.attr_double(a);
    }
    return s;
  });
}

std::optional<LayerErrorTable> load_layer_errors(const std::string& path) {
  return read_optional_group<LayerErrorTable>(path, kLayerErrorsGroup, [](const h5::Group& eg) {
    LayerErrorTable t;
    t.batches = eg.attr_int("batches");
    std::vector<std::pair<int64_t, LayerErrorRecord>> ranked;
    for (const std::string& layer : eg.children()) {
      const h5::Group lg = eg.open_group(layer);
      LayerErrorRecord r;
      r.path = layer == std::string(kRootLayerName) ? "" : layer;
      r.type = lg.attr_string("type");
      r.note = lg.attr_string("note");
      for (const std::string& a : lg.attr_names())
        if (a != "rank" && a != "type" && a != "note") r.values[a] = lg.attr_double(a);
      ranked.emplace_back(lg.attr_int("rank"), std::move(r));
    }
    std::stable_sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (auto& [rank, r] : ranked) t.layers.push_back(std::move(r));
    return t;
  });
}

std::optional<Imatrix> load_imatrix(const std::string& path) {
  return read_optional_group<Imatrix>(path, kImatrixGroup, [&path](const h5::Group& ig) {
    Imatrix m;
    for (const std::string& layer : ig.children()) {
      const h5::Group lg = ig.open_group(layer);
      ImatrixEntry e;
      e.sum_sq = lg.read_tensor("sum_sq").to(at::kDouble);
      if (lg.has("sum")) e.sum = lg.read_tensor("sum").to(at::kDouble);
      e.count = lg.attr_int("count");
      const std::string where = "framework/io: " + path + ": " + kImatrixGroup + "/" + layer;
      QF_REQUIRE(e.sum_sq.dim() == 1 && e.sum_sq.numel() > 0, where, ": sum_sq must be a vector, got ", e.sum_sq.sizes());
      QF_REQUIRE(!e.sum.defined() || e.sum.sizes() == e.sum_sq.sizes(), where, ": sum and sum_sq differ in shape");
      QF_REQUIRE(at::isfinite(e.sum_sq).all().item<bool>() && (e.sum_sq >= 0).all().item<bool>(), where,
                 ": sum_sq must be finite and >= 0");
      QF_REQUIRE(e.count > 0, where, ": count must be > 0, got ", e.count);
      m[layer == std::string(kRootLayerName) ? "" : layer] = std::move(e);
    }
    return m;
  });
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
        QF_REQUIRE(same_options(first.options, e.options, e.observer_kind), where,
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
    CalibrationEntry merged = make_calibration_entry(*observer, entry.options, entry.spec);
    // Never hand back a dump its own loader refuses (e.g. histogram counts that overflowed to inf).
    try {
      merged.make_observer();
    } catch (const Error& e) {
      throw Error("framework/io: merged calibration of " + key.first + "/" + key.second + " would not load: " + e.what());
    }
    out[key.first][key.second] = std::move(merged);
  }
  return out;
}

}  // namespace qforge::io

// Calibration dumps: the observers' statistics and the qparams they give, per module path and
// quantization point ("encoder.layer.3" / "weight", "input", ...), written after calibration and
// loaded later to skip it, or merged across data shards and runs with the observers' own merge.
// HDF5 layout (docs/formats.md):
//   /                      format="qforge.calibration", format_version=1, qforge_version
//   /<module>/<point>/     observer kind + options and the QSpec as attributes
//       state/<name>       observer state tensors (min, max, histogram, count, nonfinite_count)
//       qparams/scale      float32, qparams/zero_point int32 (absent when the observer saw nothing)
//   /__search__/           optional: the mixed-precision search's sensitivities, attribute key
//       <layer path>/      attributes hessian_trace and "s:<candidate>" (float64 sensitivity)
//   /__imatrix__/          optional: the importance matrix (framework/core/imatrix.h)
//       <layer path>/      sum_sq, sum (float64 [K]), attribute count
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "framework/core/imatrix.h"
#include "framework/core/qparams.h"
#include "observers/observer.h"

namespace qforge::io {

// One quantization point's calibration.
struct CalibrationEntry {
  std::string observer_kind;  // Observer::kind()
  ObserverOptions options;    // as the observer was made
  QSpec spec;                 // the grid the qparams are for
  std::map<std::string, at::Tensor> state;  // Observer::state()
  QParams qparams;            // undefined when the observer saw no finite value

  // A fresh observer of this kind and options holding `state`.
  std::unique_ptr<Observer> make_observer() const;
};

// module path -> quantization point -> entry.
using CalibrationDump = std::map<std::string, std::map<std::string, CalibrationEntry>>;

// Snapshot of `observer` (state copied) with the qparams it gives for `spec`, when it has data.
CalibrationEntry make_calibration_entry(const Observer& observer, const ObserverOptions& options,
                                        const QSpec& spec);

// What a mixed-precision search measured, kept in the dump so that a second search with another
// budget recomputes nothing. `key` names what the numbers depend on (method, its settings, the
// weights and the calibration data); a reader compares it before reusing anything.
struct SearchSensitivities {
  std::string key;
  std::map<std::string, double> traces;                          // layer path -> Tr(H)/n
  std::map<std::string, std::map<std::string, double>> values;   // layer path -> candidate -> sensitivity
};
inline constexpr const char* kSearchGroup = "__search__";

// The numeric suite's per-layer errors (framework/ptq/numeric_suite.h), kept in the dump so that
// `qdump errors` can list them: values by name (weight_sqnr_db, own_sqnr_db, own_relative_mse,
// accumulated_sqnr_db, accumulated_relative_mse, clipped_fraction, nonfinite_inputs, rows; NaN:
// not measured, +inf: exact), layers worst first.
struct LayerErrorRecord {
  std::string path, type, note;
  std::map<std::string, double> values;
};
struct LayerErrorTable {
  int64_t batches = 0;
  std::vector<LayerErrorRecord> layers;  // worst first
};
inline constexpr const char* kLayerErrorsGroup = "__layer_errors__";

inline constexpr const char* kImatrixGroup = "__imatrix__";

// Writes `dump` (and `search`, `errors`, `imatrix`, when given) crash-safely (temporary file +
// fsync + rename).
void save_calibration_dump(const std::string& path, const CalibrationDump& dump,
                           const SearchSensitivities* search = nullptr, const LayerErrorTable* errors = nullptr,
                           const Imatrix* imatrix = nullptr);
// The importance matrix of a dump; nullopt when it has none. Throws for sums of the wrong shape,
// negative or non-finite Σx², or counts < 1.
std::optional<Imatrix> load_imatrix(const std::string& path);
// The numeric suite's table of a dump; nullopt when it has none.
std::optional<LayerErrorTable> load_layer_errors(const std::string& path);
// The search's sensitivities of a dump; nullopt when it has none. Throws like
// load_calibration_dump for files that are not calibration dumps.
std::optional<SearchSensitivities> load_search_sensitivities(const std::string& path);

// Reads a dump. Throws qforge::Error naming the file and group for foreign, truncated,
// corrupted or newer-version files, and for states the observer kind rejects.
CalibrationDump load_calibration_dump(const std::string& path);

// Merges dumps (from data shards or separate runs): for every (module, point), the observers are
// restored and folded together with Observer::merge and the qparams recomputed. Entries present in
// only some dumps are merged over those. Throws when two dumps disagree on kind, options or spec.
CalibrationDump merge_calibration_dumps(const std::vector<CalibrationDump>& dumps);

}  // namespace qforge::io

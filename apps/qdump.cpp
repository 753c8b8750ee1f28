// qdump: inspect, merge and compare qforge's HDF5 files (calibration dumps and checkpoints; any
// HDF5 file for show and diff).
//   qdump show FILE [PATH]        tree below PATH with attributes and summary statistics
//        [--depth N] [--grep RE]  N levels only; only objects whose path matches RE
//   qdump merge A B ... -o OUT    merge calibration dumps through the observers' merge
//   qdump diff A B [--atol X]     structural and numeric differences; exit 1 when they differ
//   qdump errors DUMP [--top N]   the numeric suite's per-layer errors of a run, worst first
//                                 (the layer column as wide as the longest name)
#include <ATen/ATen.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "framework/core/error.h"
#include "framework/core/utf8.h"
#include "framework/io/calibration_dump.h"
#include "framework/io/checkpoint.h"
#include "framework/format/hdf5.h"
#include "framework/api/quantized_tensor.h"

namespace qforge::io {
namespace {

std::string shape_string(at::IntArrayRef s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    case at::kBool: return "bool";
    case at::kChar: return "int8";
    case at::kByte: return "uint8";
    case at::kShort: return "int16";
    case at::kInt: return "int32";
    case at::kLong: return "int64";
    default: return c10::toString(t);
  }
}

std::string fmt(double v) {
  std::ostringstream os;
  os.precision(6);
  os << v;
  return os.str();
}

// "min .. max mean std", plus NaN/inf counts, for a tensor of any dtype.
std::string summary(const at::Tensor& t) {
  if (t.numel() == 0) return "empty";
  if (t.scalar_type() == at::kBool) return std::to_string(t.sum().item<int64_t>()) + " true";
  const at::Tensor d = t.to(at::kDouble).reshape({-1});
  const at::Tensor finite = d.masked_select(at::isfinite(d));
  std::ostringstream os;
  if (finite.numel() > 0) {
    os << "min " << fmt(finite.min().item<double>()) << " max " << fmt(finite.max().item<double>())
       << " mean " << fmt(finite.mean().item<double>());
    if (finite.numel() > 1) os << " std " << fmt(finite.std().item<double>());
  }
  const int64_t nan = at::isnan(d).sum().item<int64_t>();
  const int64_t inf = at::isinf(d).sum().item<int64_t>();
  if (nan) os << " nan " << nan;
  if (inf) os << " inf " << inf;
  return os.str();
}

// The first `n` bytes of printable() text, cut before a UTF-8 character or a \xNN escape it would
// split (printable() escapes every backslash, so each one starts a 4-byte escape).
std::string cut_printable(const std::string& p, size_t n) {
  if (p.size() <= n || n == 0) return p.substr(0, n);
  size_t cut = utf8_cut_before(p, n);
  const size_t slash = cut > 0 ? p.rfind('\\', cut - 1) : std::string::npos;
  if (slash != std::string::npos && slash + 4 > cut) cut = slash;
  return p.substr(0, cut);
}

// Names, attributes and notes come from the file: printed through printable() (framework/core/utf8.h)
// so no byte of a crafted file reaches the terminal as a control sequence.
std::string attrs_text(const h5::Object& o, const std::string& indent) {
  std::string out;
  for (const std::string& a : o.attr_names()) {
    std::string v = o.attr_to_string(a);
    for (char& c : v) if (c == '\n') c = ' ';  // multi-line text (a recipe) on one line
    v = printable(v);
    if (v.size() > 120) v = cut_printable(v, 117) + "...";
    out += indent + "@" + printable(a) + " = " + v + "\n";
  }
  return out;
}

std::string dataset_text(const h5::Dataset& ds, const std::string& name, const std::string& indent) {
  const h5::DatasetInfo info = ds.info();
  return indent + printable(name) + "  " + dtype_name(info.dtype) + " " + shape_string(info.shape) + "  " +
         summary(ds.read()) + "\n";
}

// A checkpoint's quantized group: one line with what it dequantizes to.
std::string quantized_text(const h5::Group& g, const std::string& indent) {
  const QuantizedTensor q = io::read_quantized_group(g, "qdump");
  return indent + "= dequantized " + shape_string(q.shape) + "  " + summary(q.dequantize()) + "\n";
}

// What `qdump show --depth N --grep PATTERN` keeps: objects at most `depth` levels below the shown
// group (0: all), whose path in the file ("/parameters/fc1/weight") or that path with dots for
// slashes ("parameters.fc1.weight") contains a match of `grep` (ECMAScript regex), with the groups
// leading to them.
struct ShowFilter {
  int64_t depth = 0;
  std::optional<std::regex> grep;
  int64_t shown = 0, total = 0;  // objects printed / walked, for the closing count

  bool matches(const std::string& path) const {
    if (!grep) return true;
    std::string dotted = path.substr(1);
    std::replace(dotted.begin(), dotted.end(), '/', '.');
    return std::regex_search(path, *grep) || std::regex_search(dotted, *grep);
  }
  bool cuts() const { return depth > 0 || grep.has_value(); }
};

// A group at the --depth limit: one line saying how much lies below, when it or anything below
// it matches --grep.
std::string cut_group_text(const h5::Group& g, const std::string& path, const std::string& line, ShowFilter& f) {
  int64_t below = 0;
  bool any = f.matches(path);
  g.visit([&](const std::string& p, h5::ObjectType, int) {
    ++below;
    if (!any) any = f.matches(path + "/" + p);
  });
  f.total += below;
  if (!any) return {};
  return line + "  (" + std::to_string(below) + " objects below, not shown: --depth " + std::to_string(f.depth) + ")\n";
}

// The text for the children of `g` (at `path`, `level` levels below the shown group; 1 for its
// children); "" when nothing below matches. `seen`: object addresses already walked, so a
// hard-link cycle (or a group linked twice) is printed once. Level-1 pieces are printed as soon as
// they are ready, so a large file starts showing before its whole walk.
std::string children_text(const h5::Group& g, const std::string& path, int64_t level, std::set<uint64_t>& seen,
                          ShowFilter& f) {
  std::string out;
  const std::string indent(static_cast<size_t>(2 * level), ' ');
  for (const std::string& name : g.children()) {
    const std::string child_path = path + "/" + name;
    const bool match = f.matches(child_path);
    std::string piece;
    ++f.total;
    switch (g.child_type(name)) {
      case h5::ObjectType::kGroup: {
        const h5::Group child = g.open_group(name);
        const std::string line = indent + printable(name) + "/";
        if (!seen.insert(child.address()).second) {
          if (match) piece = line + "  (hard link to a group shown above; not repeated)\n";
        } else if (f.depth > 0 && level >= f.depth) {
          piece = cut_group_text(child, child_path, line, f);
        } else {
          std::string inner = children_text(child, child_path, level + 1, seen, f);
          if (match) {
            const bool quantized = child.has_attr("encoding") && child.attr_string("encoding") == "quantized";
            inner = attrs_text(child, indent + "  ") + inner;
            if (quantized) inner += quantized_text(child, indent + "  ");
          }
          if (match || !inner.empty()) piece = line + "\n" + inner;
        }
        break;
      }
      case h5::ObjectType::kDataset:
        if (match) {
          const h5::Dataset ds = g.open_dataset(name);
          piece = dataset_text(ds, name, indent) + attrs_text(ds, indent + "  ");
        }
        break;
      default:
        if (match) piece = indent + printable(name) + "  (other object)\n";
    }
    if (!piece.empty()) ++f.shown;
    if (level == 1) std::fputs(piece.c_str(), stdout);
    else out += piece;
  }
  return out;
}

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> parts;
  std::stringstream ss(path);
  for (std::string p; std::getline(ss, p, '/');) {
    if (!p.empty()) parts.push_back(p);
  }
  return parts;
}

// Resolves `path` below the root: HDF5 names separated by '/', or the dotted module path users
// see in describe() ("fc1.input", "blocks.0.conv.weight_quantizer"), whose groups may themselves
// contain dots ("blocks.0.conv"): at each level the longest child name that is the path or a
// prefix of it ending at '.' or '/' is taken.
int show(const std::string& file, const std::string& path, ShowFilter filter) {
  const h5::File f = h5::File::open(file);
  h5::Group g = f.root();
  std::string rest = path;
  while (!rest.empty() && rest.front() == '/') rest.erase(0, 1);
  while (!rest.empty()) {
    std::string best;
    for (const std::string& c : g.children())
      if ((rest == c || (rest.size() > c.size() && rest.compare(0, c.size(), c) == 0 &&
                         (rest[c.size()] == '.' || rest[c.size()] == '/'))) &&
          c.size() > best.size())
        best = c;
    if (best.empty()) {
      std::string children;
      for (const std::string& c : g.children()) children += (children.empty() ? "" : ", ") + printable(c);
      throw qforge::Error("qdump show: " + printable(file) + " has no '" + printable(rest) + "' under " + printable(g.path()) +
                          (children.empty() ? std::string(" (it is empty)") : " (children: " + children + ")"));
    }
    rest.erase(0, best.size());
    while (!rest.empty() && (rest.front() == '.' || rest.front() == '/')) rest.erase(0, 1);
    if (g.child_type(best) == h5::ObjectType::kDataset) {
      if (!rest.empty()) throw qforge::Error("qdump show: " + g.path() + "/" + best + " is a dataset; nothing below it");
      const h5::Dataset ds = g.open_dataset(best);
      std::fputs((dataset_text(ds, ds.path(), "") + attrs_text(ds, "  ")).c_str(), stdout);
      return 0;
    }
    g = g.open_group(best);
  }
  std::printf("%s: %s\n", printable(file).c_str(), printable(g.path()).c_str());
  if (!filter.grep) std::fputs(attrs_text(g, "  ").c_str(), stdout);
  std::set<uint64_t> seen{g.address()};
  const std::string base = g.path() == "/" ? "" : g.path();
  std::fputs(children_text(g, base, 1, seen, filter).c_str(), stdout);
  if (!filter.grep && g.has_attr("encoding") && g.attr_string("encoding") == "quantized")
    std::fputs(quantized_text(g, "  ").c_str(), stdout);
  if (filter.cuts())
    std::printf("(%lld of %lld objects shown%s%s)\n", static_cast<long long>(filter.shown),
                static_cast<long long>(filter.total), filter.depth > 0 ? ", --depth " : "",
                filter.depth > 0 ? std::to_string(filter.depth).c_str() : "");
  return 0;
}

int merge(const std::vector<std::string>& inputs, const std::string& out) {
  std::vector<CalibrationDump> dumps;
  for (const std::string& in : inputs) dumps.push_back(load_calibration_dump(in));
  const CalibrationDump merged = merge_calibration_dumps(dumps);
  save_calibration_dump(out, merged);
  size_t points = 0;
  for (const auto& [m, p] : merged) points += p.size();
  std::printf("merged %zu dumps: %zu modules, %zu quantization points -> %s\n", dumps.size(),
              merged.size(), points, out.c_str());
  return 0;
}

// Every object below `g`: relative path -> type.
std::map<std::string, h5::ObjectType> objects(const h5::Group& g) {
  std::map<std::string, h5::ObjectType> m;
  m["/"] = h5::ObjectType::kGroup;
  g.visit([&](const std::string& p, h5::ObjectType t, int) { m["/" + p] = t; });
  return m;
}

template <typename Fn>
void with_object(const h5::Group& root, const std::string& path, Fn&& fn) {
  const std::vector<std::string> parts = split_path(path);
  if (parts.empty()) {
    fn(static_cast<const h5::Object&>(root), nullptr);
    return;
  }
  std::vector<h5::Group> chain;
  chain.reserve(parts.size());  // no reallocation: `g` points into it
  const h5::Group* g = &root;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    chain.push_back(g->open_group(parts[i]));
    g = &chain.back();
  }
  if (g->child_type(parts.back()) == h5::ObjectType::kDataset) {
    const h5::Dataset ds = g->open_dataset(parts.back());
    fn(static_cast<const h5::Object&>(ds), &ds);
  } else {
    const h5::Group leaf = g->open_group(parts.back());
    fn(static_cast<const h5::Object&>(leaf), nullptr);
  }
}

int diff(const std::string& a_path, const std::string& b_path, double atol) {
  const h5::File fa = h5::File::open(a_path), fb = h5::File::open(b_path);
  const h5::Group ra = fa.root(), rb = fb.root();
  const auto a = objects(ra), b = objects(rb);
  int differences = 0;
  for (const auto& [p, t] : a) {
    if (!b.count(p)) {
      std::printf("- %s (only in %s)\n", printable(p).c_str(), printable(a_path).c_str());
      ++differences;
    }
  }
  for (const auto& [p, t] : b) {
    if (!a.count(p)) {
      std::printf("+ %s (only in %s)\n", printable(p).c_str(), printable(b_path).c_str());
      ++differences;
    }
  }
  for (const auto& [p, t] : a) {
    auto it = b.find(p);
    if (it == b.end()) continue;
    if (it->second != t) {
      std::printf("~ %s: a group in one file, a dataset in the other\n", printable(p).c_str());
      ++differences;
      continue;
    }
    // Attributes, then data.
    std::map<std::string, std::string> attrs_a, attrs_b;
    at::Tensor ta, tb;
    with_object(ra, p, [&](const h5::Object& o, const h5::Dataset* ds) {
      for (const std::string& n : o.attr_names()) attrs_a[n] = o.attr_to_string(n);
      if (ds) ta = ds->read();
    });
    with_object(rb, p, [&](const h5::Object& o, const h5::Dataset* ds) {
      for (const std::string& n : o.attr_names()) attrs_b[n] = o.attr_to_string(n);
      if (ds) tb = ds->read();
    });
    for (const auto& [n, v] : attrs_a) {
      auto jt = attrs_b.find(n);
      if (jt == attrs_b.end()) {
        std::printf("~ %s @%s: only in %s (%s)\n", printable(p).c_str(), printable(n).c_str(), printable(a_path).c_str(),
                    printable(v).c_str());
        ++differences;
      } else if (jt->second != v && n != "qforge_version") {
        std::printf("~ %s @%s: %s vs %s\n", printable(p).c_str(), printable(n).c_str(), printable(v).c_str(),
                    printable(jt->second).c_str());
        ++differences;
      }
    }
    for (const auto& [n, v] : attrs_b) {
      if (!attrs_a.count(n)) {
        std::printf("~ %s @%s: only in %s (%s)\n", printable(p).c_str(), printable(n).c_str(), printable(b_path).c_str(),
                    printable(v).c_str());
        ++differences;
      }
    }
    if (!ta.defined()) continue;
    if (ta.scalar_type() != tb.scalar_type() || ta.sizes() != tb.sizes()) {
      std::printf("~ %s: %s %s vs %s %s\n", printable(p).c_str(), dtype_name(ta.scalar_type()).c_str(),
                  shape_string(ta.sizes()).c_str(), dtype_name(tb.scalar_type()).c_str(),
                  shape_string(tb.sizes()).c_str());
      ++differences;
      continue;
    }
    if (ta.numel() == 0) continue;
    const at::Tensor da = ta.to(at::kDouble), db = tb.to(at::kDouble);
    // NaN equals NaN here: a dump that saw the same NaNs is the same dump.
    const at::Tensor both_nan = at::logical_and(at::isnan(da), at::isnan(db));
    const at::Tensor delta = at::where(both_nan, at::zeros_like(da), (da - db).abs());
    const at::Tensor differs = at::logical_or(delta.gt(atol), delta.isnan());
    const int64_t n = differs.sum().item<int64_t>();
    if (n > 0) {
      std::printf("~ %s: %lld of %lld elements differ, max |a-b| %s\n", printable(p).c_str(),
                  static_cast<long long>(n), static_cast<long long>(ta.numel()),
                  fmt(delta.masked_select(differs).max().item<double>()).c_str());
      ++differences;
    }
  }
  if (differences == 0) std::printf("no differences\n");
  return differences == 0 ? 0 : 1;
}

// `s` (printable() text) padded with spaces to `width` terminal columns.
std::string pad(const std::string& s, size_t width) { return s + std::string(width - std::min(width, utf8_columns(s)), ' '); }

// The numeric suite's table (qtrain keeps it in RUN/calibration.h5), worst first.
int errors(const std::string& file, int64_t top) {
  const std::optional<LayerErrorTable> t = load_layer_errors(file);
  if (!t) {
    std::fprintf(stderr, "qdump errors: %s has no per-layer errors (written by qtrain runs that quantized a model)\n",
                 file.c_str());
    return 1;
  }
  auto value = [](const LayerErrorRecord& l, const char* name) {
    const auto it = l.values.find(name);
    return it == l.values.end() ? std::nan("") : it->second;
  };
  auto db = [](double v) -> std::string {
    if (std::isnan(v)) return "-";
    if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f", v);
    return buf;
  };
  // A count stored as a double: NaN (a foreign or damaged table) or missing prints "-".
  auto count = [](double v) -> std::string {
    if (!std::isfinite(v) || v < 0 || v > 9.0e18) return "-";
    return std::to_string(static_cast<long long>(std::llround(v)));
  };
  // Column widths from the longest name and type: full names stay greppable and every row aligned.
  std::vector<std::string> names, types;
  size_t name_w = 5, type_w = 4;
  for (const LayerErrorRecord& l : t->layers) {
    names.push_back(l.path.empty() ? "(root)" : printable(l.path));
    types.push_back(printable(l.type));
    name_w = std::max(name_w, utf8_columns(names.back()));
    type_w = std::max(type_w, utf8_columns(types.back()));
  }
  std::printf("%s: per-layer error over %lld calibration batches, worst first (SQNR dB; own = float inputs,\n"
              "accumulated = the quantized model's inputs)\n",
              printable(file).c_str(), static_cast<long long>(t->batches));
  std::printf("%s %s %8s %8s %8s %9s %9s  %s\n", pad("layer", name_w).c_str(), pad("type", type_w).c_str(), "weight", "own", "accum", "clipped%",
              "nonfinite", "note");
  for (size_t i = 0; i < t->layers.size(); ++i) {
    if (top > 0 && static_cast<int64_t>(i) >= top) break;
    const LayerErrorRecord& l = t->layers[i];
    const double clipped = value(l, "clipped_fraction");
    char clip[32] = "-";
    if (!std::isnan(clipped)) std::snprintf(clip, sizeof clip, "%.3f", 100.0 * clipped);
    std::printf("%s %s %8s %8s %8s %9s %9s  %s\n", pad(names[i], name_w).c_str(), pad(types[i], type_w).c_str(),
                db(value(l, "weight_sqnr_db")).c_str(), db(value(l, "own_sqnr_db")).c_str(),
                db(value(l, "accumulated_sqnr_db")).c_str(), clip, count(value(l, "nonfinite_inputs")).c_str(),
                printable(l.note).c_str());
  }
  return 0;
}

}  // namespace
}  // namespace qforge::io

int main(int argc, char** argv) {
  CLI::App app{"qdump: inspect, merge and compare qforge HDF5 dumps and checkpoints"};
  app.require_subcommand(1);

  std::string show_file, show_path = "/";
  CLI::App* show = app.add_subcommand("show", "print the tree below PATH with attributes and statistics");
  show->add_option("file", show_file, "HDF5 file")->required();
  show->add_option("path", show_path, "group or dataset inside the file (default /)");
  int64_t show_depth = 0;
  std::string show_grep;
  // Checked after parsing: CLI11's range check prints its range as 0 to 1.797693e+308.
  CLI::Option* depth_opt = show->add_option("--depth", show_depth,
                                            "show N levels below PATH (1: its children); deeper groups print one line "
                                            "with how many objects they hold (as tree -L N)");
  show->add_option("--grep", show_grep,
                   "show only objects whose path (\"/parameters/fc1/weight\", or dotted \"parameters.fc1.weight\") "
                   "matches this regular expression, with the groups that lead to them");

  std::vector<std::string> merge_inputs;
  std::string merge_out;
  CLI::App* merge = app.add_subcommand("merge", "merge calibration dumps (observers' merge)");
  merge->add_option("inputs", merge_inputs, "calibration dumps")->required()->expected(1, -1);
  merge->add_option("-o,--output", merge_out, "merged dump to write")->required();

  std::string diff_a, diff_b;
  double atol = 0.0;
  CLI::App* diff = app.add_subcommand("diff", "compare two files; exit status 1 when they differ");
  diff->add_option("a", diff_a)->required();
  diff->add_option("b", diff_b)->required();
  diff->add_option("--atol", atol, "ignore numeric differences up to this absolute value");

  std::string errors_file;
  int64_t errors_top = 0;
  CLI::App* errors = app.add_subcommand("errors", "the numeric suite's per-layer errors of a run's calibration dump, worst first");
  errors->add_option("file", errors_file, "calibration dump (RUN/calibration.h5)")->required();
  errors->add_option("--top", errors_top, "show only the N worst layers (0: all)")->check(CLI::NonNegativeNumber);

  CLI11_PARSE(app, argc, argv);
  if (diff->parsed() && !(std::isfinite(atol) && atol >= 0)) {
    // NaN would compare false everywhere ("no differences"), a negative one would call identical
    // files different.
    std::fprintf(stderr, "qdump diff: --atol must be a finite number >= 0, got %g\n", atol);
    return 2;
  }
  if (depth_opt->count() > 0 && show_depth < 1) {
    std::fprintf(stderr, "qdump show: --depth must be >= 1, got %lld\n", static_cast<long long>(show_depth));
    return 2;
  }
  qforge::io::ShowFilter show_filter;
  show_filter.depth = show_depth;
  if (!show_grep.empty()) {
    try {
      show_filter.grep.emplace(show_grep, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      std::fprintf(stderr, "qdump show: --grep '%s' is not a regular expression: %s\n",
                   qforge::printable(show_grep).c_str(), e.what());
      return 2;
    }
  }
  std::string files = show_file + errors_file;
  for (const std::string& f : merge_inputs) files += (files.empty() ? "" : ", ") + f;
  if (diff->parsed()) files = diff_a + ", " + diff_b;
  try {
    // qdump reads files from anywhere: a crash of the HDF5 library on a crafted one ends a child
    // process and is reported here as an error (docs/formats.md).
    return qforge::io::h5::run_isolated(files, [&] {
      if (show->parsed()) return qforge::io::show(show_file, show_path, show_filter);
      if (merge->parsed()) return qforge::io::merge(merge_inputs, merge_out);
      if (errors->parsed()) return qforge::io::errors(errors_file, errors_top);
      if (diff->parsed()) return qforge::io::diff(diff_a, diff_b, atol);
      return 0;
    });
  } catch (const std::exception& e) {
    // Errors quote file names and contents: each line through printable().
    std::string msg = e.what(), line;
    std::istringstream lines(msg);
    std::string out;
    while (std::getline(lines, line)) out += (out.empty() ? "" : "\n") + qforge::printable(line);
    std::fprintf(stderr, "qdump: %s\n", out.c_str());
    return 2;
  }
}

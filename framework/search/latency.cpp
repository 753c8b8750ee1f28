// Cold-cache timing of frozen layers and the per-machine latency cache.
#include "framework/search/latency.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "framework/core/error.h"
#include "framework/core/isa.h"
#include "framework/format/atomic_file.h"
#include "framework/format/input_file.h"
#include "framework/nn/conv.h"
#include "framework/nn/embedding.h"
#include "framework/nn/linear.h"

namespace qforge::search {

namespace fs = std::filesystem;

namespace {

constexpr const char* kCacheFormat = "qforge-latency-cache";
constexpr int kCacheVersion = 1;

std::string shape_string(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? "," : "") + std::to_string(s[i]);
  return out + "]";
}

int64_t parse_cache_size(const std::string& text) {
  // sysfs writes e.g. "32768K" or "32M".
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (...) {
    return 0;
  }
  const std::string unit = text.substr(used, 1);
  if (unit == "K") v <<= 10;
  if (unit == "M") v <<= 20;
  return v;
}

// A buffer written over before each cold timed call: twice the largest cache, at least 64 MiB,
// at most 1 GiB.
std::vector<char>& eviction_buffer() {
  static std::vector<char> buf = [] {
    const int64_t llc = last_level_cache_bytes();
    const int64_t bytes = std::clamp<int64_t>(2 * llc, int64_t{64} << 20, int64_t{1} << 30);
    return std::vector<char>(static_cast<size_t>(bytes), 0);
  }();
  return buf;
}

void evict_caches() {
  std::vector<char>& buf = eviction_buffer();
  static char round = 0;
  ++round;
  // One write per 64-byte line is enough to claim every line of the caches.
  for (size_t i = 0; i < buf.size(); i += 64) buf[i] = round;
  // Keep the writes from being optimised away.
  asm volatile("" : : "r"(buf.data()) : "memory");
}

at::Tensor forward_of(QuantizableLayer& layer, const at::Tensor& x) {
  torch::nn::Module& m = layer.module();
  if (auto* l = dynamic_cast<nn::LinearImpl*>(&m)) return l->forward(x);
  if (auto* c = dynamic_cast<nn::Conv2dImpl*>(&m)) return c->forward(x);
  if (auto* c = dynamic_cast<nn::Conv1dImpl*>(&m)) return c->forward(x);
  if (auto* e = dynamic_cast<nn::EmbeddingImpl*>(&m)) return e->forward(x);
  throw Error(std::string("latency: no single-input forward to time for layer type ") + layer.layer_type());
}

}  // namespace

bool timeable(const QuantizableLayer& layer) {
  const torch::nn::Module& m = layer.module();
  return dynamic_cast<const nn::LinearImpl*>(&m) || dynamic_cast<const nn::Conv2dImpl*>(&m) ||
         dynamic_cast<const nn::Conv1dImpl*>(&m) || dynamic_cast<const nn::EmbeddingImpl*>(&m);
}

const std::string& cpu_model_name() {
  static const std::string name = [] {
    std::ifstream in("/proc/cpuinfo");
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("model name", 0) != 0) continue;
      const size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string v = line.substr(colon + 1);
      v.erase(0, v.find_first_not_of(" \t"));
      while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.pop_back();
      if (!v.empty()) return v;
    }
    return std::string("unknown cpu");
  }();
  return name;
}

int64_t last_level_cache_bytes() {
  int64_t best = 0;
  for (int index = 0; index < 8; ++index) {
    std::ifstream in("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/size");
    std::string text;
    if (!(in >> text)) continue;
    best = std::max(best, parse_cache_size(text));
  }
  return best;
}

std::string default_latency_cache_path() {
  if (const char* p = std::getenv("QFORGE_LATENCY_CACHE"); p && *p) return p;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return (fs::path(x) / "qforge" / "latency.json").string();
  if (const char* h = std::getenv("HOME"); h && *h) return (fs::path(h) / ".cache" / "qforge" / "latency.json").string();
  return {};
}

LatencyCache::LatencyCache(std::string path) : path_(std::move(path)) {
  std::error_code unreadable;  // a directory this user cannot search reads as no cache; save() says why
  if (path_.empty() || !fs::exists(path_, unreadable)) return;
  io::require_regular_file(path_, "latency cache");
  std::ifstream in(path_);
  nlohmann::json j;
  try {
    in >> j;
  } catch (const std::exception& e) {
    throw Error("latency cache " + path_ + " is not valid JSON (" + e.what() +
                "); delete it or point search.latency_cache elsewhere");
  }
  QF_REQUIRE(j.is_object() && j.value("format", std::string()) == kCacheFormat && j.contains("entries") &&
                 j["entries"].is_object(),
             "latency cache ", path_, " is not a qforge latency cache (no \"format\": \"", kCacheFormat,
             "\" with \"entries\"); delete it or point search.latency_cache elsewhere");
  QF_REQUIRE(j.value("version", 0) == kCacheVersion, "latency cache ", path_, " has version ", j.value("version", 0),
             ", this qforge reads version ", kCacheVersion, "; delete it to re-measure");
  for (const auto& [k, v] : j["entries"].items()) {
    QF_REQUIRE(v.is_number() && v.get<double>() >= 0, "latency cache ", path_, ": entry '", k,
               "' is not a non-negative number of milliseconds");
    entries_[k] = v.get<double>();
  }
}

std::optional<double> LatencyCache::find(const std::string& key) const {
  const auto it = entries_.find(key);
  if (it == entries_.end()) {
    ++misses_;
    return std::nullopt;
  }
  ++hits_;
  return it->second;
}

void LatencyCache::put(const std::string& key, double ms) {
  entries_[key] = ms;
  dirty_ = true;
}

namespace {

// The file a path names once its symbolic links are followed (a dangling link: the file it
// would create); an atomic rename onto the link itself would replace the link with a file.
fs::path link_target(const fs::path& path) {
  constexpr int kMaxLinks = 40;  // as the kernel's ELOOP limit
  fs::path p = path;
  for (int hops = 0; fs::is_symlink(p); ++hops) {
    QF_REQUIRE(hops < kMaxLinks, "too many levels of symbolic links at ", path.string());
    const fs::path to = fs::read_symlink(p);
    p = to.is_absolute() ? to : p.parent_path() / to;
  }
  return p;
}

}  // namespace

std::string LatencyCache::save() const {
  if (path_.empty() || !dirty_) return {};
  try {
    const fs::path target = link_target(path_);
    const fs::path dir = target.parent_path();
    if (!dir.empty()) fs::create_directories(dir);
    const nlohmann::json j = {{"format", kCacheFormat}, {"version", kCacheVersion}, {"entries", entries_}};
    io::write_text_atomically(target.string(), j.dump(1) + "\n");
  } catch (const std::exception& e) {
    return "latency cache " + path_ + " could not be written (" + e.what() + "): the " +
           std::to_string(entries_.size()) + " latencies are not kept for the next search; set "
           "search.latency_cache to a writable file, or to off";
  }
  return {};
}

std::string latency_key(const QuantizableLayer& layer, const std::vector<int64_t>& weight_shape,
                        const QuantizableLayer::InputRecord& input, const std::string& candidate) {
  std::ostringstream os;
  os << cpu_model_name() << "|threads=" << at::get_num_threads() << "|" << isa_name(usable_isa()) << "|"
     << layer.layer_type() << "|w" << shape_string(weight_shape) << "|x" << shape_string(input.shape) << ":"
     << c10::toString(input.dtype) << "|" << candidate << "|" << layer.report().kernel;
  return os.str();
}

at::Tensor synthetic_input(const QuantizableLayer::InputRecord& input, int64_t index_limit) {
  QF_REQUIRE(!input.shape.empty(), "latency: the layer saw no input to take a shape from");
  if (at::isIntegralType(input.dtype, /*includeBool=*/false))
    return at::randint(0, std::max<int64_t>(1, index_limit), input.shape, at::TensorOptions().dtype(input.dtype));
  return at::randn(input.shape, at::TensorOptions().dtype(input.dtype));
}

double time_ms(const std::function<void()>& fn, const LatencyOptions& o) {
  QF_REQUIRE(o.repeats >= 1, "latency: repeats must be at least 1, got ", o.repeats);
  fn();  // warm-up: lazy packing, allocator, thread pool
  std::vector<double> ms;
  for (int r = 0; r < o.repeats; ++r) {
    if (o.cold) evict_caches();
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  return ms[ms.size() / 2];
}

double time_forward_ms(QuantizableLayer& layer, const at::Tensor& input, const LatencyOptions& o) {
  at::NoGradGuard no_grad;
  layer.module().eval();
  return time_ms([&] { QF_CHECK(forward_of(layer, input).defined()); }, o);
}

}  // namespace qforge::search

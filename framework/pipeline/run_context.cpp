// The services a qtrain run gives its stages (run_context.h).
#include "framework/pipeline/run_context.h"

#include <ATen/ATen.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "framework/dist/sync.h"
#include "framework/format/atomic_file.h"
#include "framework/format/input_file.h"
#include "framework/api/quantize.h"
#include "framework/recipe/sha256.h"
#include "framework/report/report_files.h"
#include "framework/search/search.h"

namespace qforge::pipeline {

namespace fs = std::filesystem;

namespace {

// Calls a latency is the median of.
constexpr int kLatencyRepeats = 21;

// The CPU time the whole machine and this process spent so far, and the wall clock.
struct CpuClock {
  double machine_busy_s = 0, own_s = 0, wall_s = 0;
  bool known = false;  // /proc/stat was readable
  static CpuClock now() {
    CpuClock c;
    std::ifstream in("/proc/stat");
    std::string cpu;
    unsigned long long user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
    c.known = static_cast<bool>(in >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal);
    c.machine_busy_s = static_cast<double>(user + nice + system + irq + softirq + steal) /
                       static_cast<double>(::sysconf(_SC_CLK_TCK));
    struct rusage ru {};
    ::getrusage(RUSAGE_SELF, &ru);
    auto secs = [](const timeval& t) { return static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_usec); };
    c.own_s = secs(ru.ru_utime) + secs(ru.ru_stime);
    c.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
    return c;
  }
};

// Cores other processes kept busy between a and b (about 0 on an idle machine; null when
// /proc/stat cannot be read). /proc/stat counts in clock ticks (10 ms), so short spans are coarse.
nlohmann::json other_busy_cores(const CpuClock& a, const CpuClock& b) {
  const double wall = b.wall_s - a.wall_s;
  if (!a.known || !b.known || wall <= 0) return nullptr;
  return std::max(0.0, (b.machine_busy_s - a.machine_busy_s - (b.own_s - a.own_s)) / wall);
}

std::map<std::string, double> metric_map(const train::Metrics& m, const std::string& metric) {
  std::map<std::string, double> out{{"loss", m.loss}};
  if (metric == "accuracy") out["accuracy"] = m.accuracy;
  else out["perplexity"] = m.perplexity;
  return out;
}

}  // namespace

void probe_writable(const std::string& dir_name, const std::string& what) {
  const fs::path dir = dir_name.empty() ? fs::path(".") : fs::path(dir_name);
  std::error_code ec;
  fs::create_directories(dir, ec);
  const fs::path probe = dir / (".qtrain-write-probe-" + std::to_string(::getpid()));
  try {
    io::write_text_atomically(probe.string(), "");
  } catch (const std::exception& e) {
    throw Error(what + ": cannot write into " + dir.string() + " (" + (ec ? ec.message() : std::string(e.what())) + ")");
  }
  fs::remove(probe, ec);
}

RunContext::RunContext(const Recipe& r, const PipelineOptions& opt)
    : recipe(r), options(opt), world(opt.world != nullptr ? *opt.world : one_process_), scheme(r.scheme),
      recipe_text(r.resolved_yaml) {
  // Evaluation batches dealt over the ranks, the metrics added up (train::EvalSplit).
  if (!world.single()) {
    eval_split_.rank = world.rank();
    eval_split_.world_size = world.size();
    eval_split_.all_reduce_sum = [w = &world](at::Tensor& t) { w->all_reduce(t, dist::Reduce::kSum); };
  }
}

bool RunContext::interrupted() const { return options.interrupted && options.interrupted->load(); }

bool RunContext::completed(const std::string& stage) const {
  return std::find(result.completed.begin(), result.completed.end(), stage) != result.completed.end();
}

void RunContext::check_world() const {
  const Recipe& r = recipe;
  QF_REQUIRE(world.single() || r.data.batch_size % world.size() == 0, r.path, ": data.batch_size ",
             r.data.batch_size, " does not split over ", world.size(),
             " ranks (each rank takes batch_size / world_size examples of every step)");
  if (world.single()) return;
  // Overrides included; when the float stage loads a checkpoint, the same bytes on every rank.
  dist::check_agreement(world, "the resolved recipe (with its --set overrides)", r.resolved_yaml);
  std::string stages;
  for (const std::string& s : options.stages) stages += (stages.empty() ? "" : ",") + s;
  dist::check_agreement(world, "--stages", stages.empty() ? "(all)" : stages);
  std::string ckpt = "(none)";
  if (!r.model.checkpoint.empty() && fs::exists(r.model.checkpoint)) {
    io::require_regular_file(r.model.checkpoint, "model.checkpoint");
    std::ifstream in(r.model.checkpoint, std::ios::binary);
    ckpt = "sha256 " + sha256_hex(std::string(std::istreambuf_iterator<char>(in), {}));
  }
  dist::check_agreement(world, "the float checkpoint " + r.model.checkpoint, ckpt);
}

void RunContext::check_out_dir() {
  check_recorded_paths(recipe, options.out_dir);
  probe_writable(options.out_dir, "--out");
  lock_ = std::make_unique<RunLock>(options.out_dir);
  check_run_inputs(recipe, options.out_dir);
}

void RunContext::open_outputs() {
  const std::string& out = options.out_dir;
  fs::create_directories(out);
  // No reader may pair files of two runs (a run stopped midway leaves only its own files), and
  // temporaries of killed writers go too; the recipe's inputs stay.
  const std::vector<std::string> cleared = clear_run_outputs(recipe, out);
  io::write_text_atomically((fs::path(out) / "recipe.resolved.yaml").string(),
                            "# sha256: " + recipe.sha256 + "\n" + recipe.resolved_yaml);
  report = {{"recipe", recipe.path}, {"recipe_sha256", recipe.sha256}, {"metrics", nlohmann::json::object()},
            {"timings_s", nlohmann::json::object()}, {"size_bytes", nlohmann::json::object()},
            {"latency_ms", nlohmann::json::object()},
            {"exported", nlohmann::json::object()}, {"notes", nlohmann::json::array()}};
  if (lock_ && !lock_->note().empty()) note(lock_->note());
  if (!cleared.empty()) {
    std::string list;
    for (const std::string& c : cleared) list += (list.empty() ? "" : ", ") + c;
    note("removed from " + out + " before this run: " + list);
  }
}

std::string RunContext::save(const std::string& path, const std::function<void(const std::string&)>& write) {
  std::string reason;
  const std::string written = io::write_with_fallback(path, write, &reason);
  if (written != path) {
    const std::string text = "could not write " + path + " (" + reason + "); saved to " + written + " instead";
    auto& notes = report["notes"];
    if (std::find(notes.begin(), notes.end(), text) == notes.end()) {
      std::fprintf(stderr, "qtrain: %s\n", text.c_str());
      notes.push_back(text);
    }
  }
  return written;
}

void RunContext::write_report() {
  report["completed_stages"] = result.completed;
  report["interrupted"] = result.interrupted;
  report["timings_s"]["total"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  result.headline = headline_text(report);
  if (!recipe.export_.report) return;  // export.report: false (the previous run's reports are cleared)
  save(options.out_dir, [&](const std::string& dir) {
    fs::create_directories(dir);
    result.report_path = write_report_files(report, recipe, dir);
  });
}

bool RunContext::run_stage(const Stage& stage) {
  const std::string name = stage.name();
  if (interrupted()) {
    result.interrupted = true;
    return false;
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::fprintf(stderr, "qtrain: stage %s\n", name.c_str());
  try {
    stage.run(*this);
    // Every rank leaves every stage with the same model, quantization state included.
    if (!world.single() && task.model) dist::check_replicas(*task.model, world, "after stage '" + name + "'");
  } catch (const StageError&) {
    throw;
  } catch (const std::exception& e) {
    write_report();
    throw StageError(name, e.what());
  }
  report["timings_s"][name] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (interrupted()) {
    result.interrupted = true;
    write_report();
    return false;
  }
  result.completed.push_back(name);
  write_report();
  return true;
}

void RunContext::record(const std::string& stage, const train::Metrics& m) {
  result.metrics[stage] = metric_map(m, task.metric);
  if (task.sliding_perplexity) {
    const models::PerplexityResult p = task.sliding_perplexity();
    result.metrics[stage]["sliding_window_perplexity"] = p.perplexity;
    report["sliding_window_perplexity"] = {{"max_length", p.max_length}, {"stride", p.stride},
                                           {"windows", p.windows}, {"tokens_scored", p.tokens_scored}};
    std::fprintf(stderr, "qtrain: %s sliding-window perplexity %.4f (windows of %lld every %lld tokens, %lld scored)\n",
                 stage.c_str(), p.perplexity, static_cast<long long>(p.max_length), static_cast<long long>(p.stride),
                 static_cast<long long>(p.tokens_scored));
  }
  report["metrics"][stage] = result.metrics[stage];
  std::fprintf(stderr, "qtrain: %s %s %.4f (loss %.4f)\n", stage.c_str(), task.metric.c_str(),
               result.metrics[stage][task.metric], m.loss);
}

train::Metrics RunContext::evaluate(const std::string& label) {
  return train::evaluate(*task.model, *task.test, task.forward, recipe.data.eval_batch_size, label, true, eval_split_);
}

void RunContext::record_latency(const std::string& stage) {
  if (world.rank() != 0) return;  // a figure of rank 0's report: the other ranks time nothing
  at::NoGradGuard no_grad;
  task.model->eval();
  const train::Batch one = task.test->get(at::zeros({1}, at::kLong));
  search::LatencyOptions o;
  o.repeats = kLatencyRepeats;
  nlohmann::json& l = report["latency_ms"];
  const CpuClock t0 = CpuClock::now();
  l[stage] = search::time_ms([&] { task.forward(one); }, o);
  nlohmann::json regime = {{"input_shape", one.input.sizes().vec()},
                           {"batch", one.input.size(0)},
                           {"phase", task.decode_step ? "prefill: the whole sequence in one forward" : "forward"},
                           {"threads", at::get_num_threads()},
                           {"cache", "last-level cache evicted before each call"},
                           {"statistic", "median of " + std::to_string(kLatencyRepeats) + " calls"}};
  if (task.decode_step) {
    regime["sequence"] = one.input.size(1);
    const DecodeStep step = task.decode_step(one.input);
    l["decode_step"][stage] = search::time_ms(step.run, o);
    l["decode_step"]["context"] = step.context;
    l["decode_step"]["cache_after_call"] = step.cache_length();
    l["decode_step"]["phase"] = "decode: one token through a KV cache of `context` tokens, batch 1";
  }
  l["regime"] = regime;
  l["other_busy_cores"][stage] = other_busy_cores(t0, CpuClock::now());
}

void RunContext::before_quantize() {
  if (task.before_quantize && !folded_) task.before_quantize();
  folded_ = true;
}

int64_t RunContext::calibration_examples() const {
  const Recipe& r = recipe;
  return std::min(task.train->size(), r.calibrate.samples > 0 ? r.calibrate.samples : r.calibrate.batches * r.data.batch_size);
}

int64_t RunContext::calibration_batches() const {
  return (calibration_examples() + recipe.data.batch_size - 1) / recipe.data.batch_size;
}

int64_t RunContext::solve_batches() const {
  return recipe.ptq.batches > 0 ? std::min(recipe.ptq.batches, calibration_batches()) : calibration_batches();
}

at::Tensor RunContext::calibration_indices(int64_t b) const {
  const int64_t bs = recipe.data.batch_size;
  return at::arange(b * bs, std::min(calibration_examples(), (b + 1) * bs), at::kLong);
}

at::Tensor RunContext::calibration_batch(int64_t b) { return task.forward(task.train->get(calibration_indices(b))); }

at::Tensor RunContext::calibration_loss(int64_t b) {
  const train::Batch batch = task.train->get(calibration_indices(b));
  return train::cross_entropy(task.forward(batch), batch.target);
}

void RunContext::calibrate(const Scheme& sc) {
  bool static_kv = false;  // a static KV cache set on the model is calibrated by this pass too
  for (const auto& [path, m] : kv_cache_models(*task.model)) static_kv = static_kv || m->kv_cache_scheme().is_static();
  if (sc.activations != ActivationMode::kStatic && !static_kv) return;
  task.model->eval();
  Calibration calib(*task.model);
  report["calibration_examples"] = calibration_examples();
  // Several ranks: batch b on rank b % world_size, then every observer merged over the ranks.
  for (int64_t b = world.rank(); b < calibration_batches(); b += world.size()) calibration_batch(b);
  dist::sync_observers(*task.model, world);
  calib.finish();
}

void RunContext::data_parallel(train::TrainOptions& o, torch::nn::Module& model) {
  if (world.single()) return;
  o.batch_size = recipe.data.batch_size / world.size();
  o.rank = world.rank();
  o.world_size = world.size();
  dist::check_replicas(model, world, "before " + o.label + " training");
  auto averager = std::make_shared<dist::GradientAverager>(model, world);
  o.after_backward = [averager](torch::nn::Module&) { averager->finish(); };
  o.after_epoch = [this, label = o.label](torch::nn::Module& m, int64_t epoch) {
    settle_replicas(m, "after " + label + " epoch " + std::to_string(epoch));
  };
}

void RunContext::settle_replicas(torch::nn::Module& m, const std::string& when) {
  if (world.single()) return;
  dist::broadcast_buffers(m, world);
  dist::broadcast_observers(m, world);  // QAT's observers saw only this rank's shard
  dist::check_replicas(m, world, when);
}

}  // namespace qforge::pipeline

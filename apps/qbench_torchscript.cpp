// qbench_torchscript: whole TorchScript models side by side in one C++ process, each loaded by
// torch::jit::load: qforge's frozen model.pt (its ops registered by linking qforge_jit), a peer's
// converted model (torch.ao's quantized::* ops, run by LibTorch on the quantized engine named by
// --qengine) and the float model. Each (threads, batch) cell loads the models afresh and times
// every model on the same input (uniform [0, 1), seed 0; with --token-ids V, int64 ids uniform in
// [1, V), no padding), under NoGradGuard, warm cache (weights and input stay resident between
// calls, as in a serving loop), after --warmup calls; the timed calls are interleaved model by
// model so a load change on a shared machine reaches every model alike; the median is reported.
// A model whose call throws in a cell is reported as failing there, with its error.
//   qbench_torchscript --model float=f.pt --model torchao=ao.pt --model qforge=q.pt
//       --input 1,28,28 --batch 1,32 --threads 1,2 --runs 50 [--json out.json]
//   qbench_torchscript --model ... --input 32 --token-ids 1396 ...   (a text model's [B, 32] ids)
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/script.h>

#include "kernels/cpu/contention.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include <sys/resource.h>

namespace {

struct Model {
  std::string name, path;
  torch::jit::Module module;
};

Model load(const std::string& spec) {
  const size_t eq = spec.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size())
    throw std::runtime_error("qbench_torchscript: --model '" + spec + "' must be NAME=PATH.pt");
  Model m{spec.substr(0, eq), spec.substr(eq + 1), {}};
  try {
    m.module = torch::jit::load(m.path);
  } catch (const c10::Error& e) {
    throw std::runtime_error("qbench_torchscript: cannot load " + m.path + " (model " + m.name +
                             "): " + e.what_without_backtrace());
  }
  m.module.eval();
  return m;
}

at::QEngine qengine(const std::string& name) {
  const std::vector<std::pair<std::string, at::QEngine>> engines = {
      {"onednn", at::QEngine::ONEDNN}, {"x86", at::QEngine::X86}, {"fbgemm", at::QEngine::FBGEMM},
      {"qnnpack", at::QEngine::QNNPACK}};
  for (const auto& [n, e] : engines) {
    if (n != name) continue;
    const auto& have = at::globalContext().supportedQEngines();
    if (std::find(have.begin(), have.end(), e) == have.end())
      throw std::runtime_error("qbench_torchscript: --qengine " + name + " is not built into this LibTorch");
    return e;
  }
  throw std::runtime_error("qbench_torchscript: --qengine " + name + ": expected onednn, x86, fbgemm or qnnpack");
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

long minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

// One call's milliseconds; *faults grows by the minor page faults it took (memory the allocator
// had returned to the system and the call touched again: costly on VMs, see docs/performance.md).
double call_ms(torch::jit::Module& m, const at::Tensor& x, long* faults) {
  const long f0 = minor_faults();
  const auto t0 = std::chrono::steady_clock::now();
  m.forward({x});
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  *faults += minor_faults() - f0;
  return ms;
}

// The last non-empty line of an error: a TorchScript interpreter error ends with the op's own
// message ("RuntimeError: ...") after the traceback.
std::string last_line(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  const size_t nl = s.rfind('\n');
  return nl == std::string::npos ? s : s.substr(nl + 1);
}

// What a failing call reports: the last line of its error.
std::string error_line(const std::exception& e) {
  const auto* c10 = dynamic_cast<const c10::Error*>(&e);
  return last_line(c10 != nullptr ? c10->what_without_backtrace() : e.what());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"qbench_torchscript: latency of TorchScript models side by side (C++, torch::jit::load)"};
  std::vector<std::string> specs;
  std::vector<int64_t> input, batches{1}, threads{1};
  int runs = 50, warmup = 5;
  int64_t token_ids = 0;
  std::string engine = "onednn", json_path;
  app.add_option("--model", specs, "NAME=PATH.pt, repeatable")->required();
  app.add_option("--input", input, "one example's shape, e.g. 1,28,28")->required()->delimiter(',');
  app.add_option("--token-ids", token_ids, "the input is int64 token ids uniform in [1, V) (0 is padding)")
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 40));
  app.add_option("--batch", batches, "batch sizes")->delimiter(',');
  app.add_option("--threads", threads, "intra-op thread counts")->delimiter(',');
  app.add_option("--runs", runs, "timed calls per model and cell (median)")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "untimed calls first")->check(CLI::NonNegativeNumber);
  app.add_option("--qengine", engine, "LibTorch's quantized engine for a peer's quantized ops");
  app.add_option("--json", json_path, "also write the rows as JSON");
  CLI11_PARSE(app, argc, argv);
  try {
    at::globalContext().setQEngine(qengine(engine));
    std::vector<Model> models;
    for (const std::string& s : specs) models.push_back(load(s));
    at::NoGradGuard no_grad;
    nlohmann::json rows = nlohmann::json::array();
    std::printf("| threads | batch |");
    for (const Model& m : models) std::printf(" %s: ms (page faults per call) |", m.name.c_str());
    std::printf("\n|---|---|");
    for (size_t k = 0; k < models.size(); ++k) std::printf("---|");
    std::printf("\n");
    bool first_cell = true;
    for (int64_t t : threads) {
      qforge::kernels::reset_contention_backoff();  // a back-off of the last count's cells must not outlive it
      at::set_num_threads(static_cast<int>(t));
      for (int64_t b : batches) {
        // Each cell loads the models afresh: torch.ao's onednn int8 convolutions (torch 1.13) fail
        // with "could not create a primitive descriptor for a reorder primitive" when a model
        // called at 2 threads is called again at another batch size, and a fresh load avoids it.
        if (!first_cell)
          for (Model& m : models) m = load(m.name + "=" + m.path);
        first_cell = false;
        std::vector<int64_t> shape{b};
        shape.insert(shape.end(), input.begin(), input.end());
        at::manual_seed(0);
        const at::Tensor x = token_ids ? at::randint(1, token_ids, shape, at::kLong) : at::rand(shape);
        // A model whose call throws in this cell (a peer's quantized engine refusing a shape or
        // thread count) is reported as failing here, with the error, and skipped for the cell.
        std::vector<std::string> failed(models.size());
        for (size_t k = 0; k < models.size(); ++k) {
          try {
            for (int i = 0; i < std::max(warmup, 1); ++i) models[k].module.forward({x});
          } catch (const std::exception& e) {
            failed[k] = error_line(e);
            std::fprintf(stderr, "qbench_torchscript: %s fails at %lld threads, batch %lld: %s\n", models[k].name.c_str(),
                         static_cast<long long>(t), static_cast<long long>(b), failed[k].c_str());
          }
        }
        std::vector<std::vector<double>> ms(models.size());
        std::vector<long> faults(models.size(), 0);
        for (int r = 0; r < runs; ++r)
          for (size_t k = 0; k < models.size(); ++k) {
            if (!failed[k].empty()) continue;
            try {
              ms[k].push_back(call_ms(models[k].module, x, &faults[k]));
            } catch (const std::exception& e) {
              failed[k] = error_line(e);
              std::fprintf(stderr, "qbench_torchscript: %s fails at %lld threads, batch %lld, timed call %d: %s\n",
                           models[k].name.c_str(), static_cast<long long>(t), static_cast<long long>(b), r,
                           failed[k].c_str());
            }
          }
        std::printf("| %lld | %lld |", static_cast<long long>(t), static_cast<long long>(b));
        for (size_t k = 0; k < models.size(); ++k) {
          if (!failed[k].empty()) {
            std::printf(" fails |");
            rows.push_back({{"model", models[k].name}, {"path", models[k].path}, {"threads", t}, {"batch", b},
                            {"error", failed[k]}, {"qengine", engine}});
            continue;
          }
          const double med = median(ms[k]);
          std::printf(" %.3f (%.0f) |", med, static_cast<double>(faults[k]) / runs);
          rows.push_back({{"model", models[k].name}, {"path", models[k].path}, {"threads", t}, {"batch", b},
                          {"median_ms", med}, {"min_ms", *std::min_element(ms[k].begin(), ms[k].end())},
                          {"runs", runs}, {"qengine", engine},
                          {"minor_faults_per_call", static_cast<double>(faults[k]) / runs},
                          {"input", token_ids ? "int64 ids in [1, " + std::to_string(token_ids) + ")" : "uniform [0, 1)"}});
        }
        std::printf("\n");
        std::fflush(stdout);
      }
    }
    if (!json_path.empty()) std::ofstream(json_path) << rows.dump(1) << "\n";
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}

// qtrain: runs a YAML recipe end to end: float model, calibration and PTQ, QAT, freeze, export.
//   qtrain --recipe recipes/bert_int8.yaml [--out DIR] [--set key.path=value ...] [--dry-run]
//          [--stages float,search,calibrate,ptq,qat,freeze,export] [--print-resolved]
//   qtrain --recipe R --export-data FILE   writes the recipe's data splits as its task batches them
//                                          (safetensors; export_task_data in recipe/task.h) and exits
// Exit codes: 0 success, 2 invalid recipe or arguments, 1 failure during a stage (named), 130
// interrupted (Ctrl-C) after writing what was complete.
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <cstdio>

#include <unistd.h>

#include <CLI/CLI.hpp>

#include "framework/pipeline/pipeline.h"
#include "framework/pipeline/run_directory.h"
#include "framework/recipe/task.h"

namespace {

std::atomic<bool> g_interrupted{false};

extern "C" void on_sigint(int) {
  // First Ctrl-C: finish the current stage, write the report, stop. Second: default action.
  if (g_interrupted.exchange(true)) std::signal(SIGINT, SIG_DFL);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"qtrain: quantization recipes from float model to frozen integer model"};
  std::string recipe_path, out_dir, stages_arg, export_data;
  std::vector<std::string> overrides;
  bool dry_run = false, print_resolved = false;
  app.add_option("--recipe", recipe_path, "recipe YAML file")->required();
  app.add_option("--out", out_dir, "output directory (default runs/<recipe name>)");
  app.add_option("--set", overrides, "override a key: key.path=value (repeatable)");
  app.add_flag("--dry-run", dry_run, "validate and print the plan without touching data");
  app.add_flag("--print-resolved", print_resolved, "print the resolved recipe and exit");
  app.add_option("--export-data", export_data,
                 "write the data splits (inputs, labels, mask) to this safetensors file and exit, to train a model "
                 "elsewhere on the same examples");
  app.add_option("--stages", stages_arg, "comma-separated subset of float,search,calibrate,ptq,qat,freeze,export");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  qforge::PipelineOptions opt;
  if (!stages_arg.empty()) {
    std::stringstream ss(stages_arg);
    for (std::string s; std::getline(ss, s, ',');) {
      const auto& all = qforge::selectable_stages();
      if (std::find(all.begin(), all.end(), s) == all.end()) {
        std::string valid;
        for (const auto& v : all) valid += (valid.empty() ? "" : ", ") + v;
        std::fprintf(stderr, "qtrain: unknown stage '%s' (valid: %s)\n", s.c_str(), valid.c_str());
        return 2;
      }
      opt.stages.push_back(s);
    }
  }
  qforge::Recipe recipe;
  try {
    recipe = qforge::load_recipe(recipe_path, overrides);
  } catch (const qforge::RecipeError& e) {
    std::fprintf(stderr, "qtrain: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qtrain: invalid recipe: %s\n", e.what());
    return 2;
  }
  if (print_resolved) {
    std::printf("%s", recipe.resolved_yaml.c_str());
    return 0;
  }
  if (!export_data.empty()) {
    if (dry_run || !stages_arg.empty()) {
      std::fprintf(stderr, "qtrain: --export-data writes the data and runs no stage: drop --dry-run / --stages\n");
      return 2;
    }
    try {
      for (const std::string& line : qforge::export_task_data(recipe, export_data)) std::printf("  %s\n", line.c_str());
      std::printf("qtrain: data written to %s\n", export_data.c_str());
      return 0;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "qtrain: --export-data %s: %s\n", export_data.c_str(), e.what());
      return 1;
    }
  }
  try {
    qforge::check_stages(recipe, opt.stages);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qtrain: %s\n", e.what());
    return 2;
  }
  opt.out_dir = out_dir.empty() ? "runs/" + std::filesystem::path(recipe_path).stem().string() : out_dir;
  opt.dry_run = dry_run;
  opt.interrupted = &g_interrupted;
  std::signal(SIGINT, on_sigint);
  // Under torchrun (WORLD_SIZE > 1) every process is one rank of a data-parallel run; rank 0 owns
  // the output directory and the terminal, the other ranks write into a private temporary
  // directory (removed at the end) and print only their errors, prefixed with their rank.
  qforge::dist::World world;
  std::string private_dir;
  try {
    qforge::dist::WorldOptions wo;  // QFORGE_DIST_TIMEOUT_S overrides the recipe's timeout
    wo.timeout = std::chrono::seconds(recipe.distributed.timeout_s);
    if (!dry_run) world = qforge::dist::World::from_env(wo);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qtrain: %s\n", e.what());
    return 2;
  }
  const std::string who = world.single() ? "qtrain" : "qtrain (" + world.prefix() + ")";
  FILE* errors = stderr;  // where this rank's errors go
  if (!world.single()) {
    opt.world = &world;
    if (world.rank() != 0) {
      try {
        private_dir = qforge::pipeline::make_rank_dir(std::filesystem::temp_directory_path().string());  // $TMPDIR or /tmp
      } catch (const std::exception& e) {
        std::fprintf(stderr, "%s: %s\n", who.c_str(), e.what());
        return 1;
      }
      opt.out_dir = private_dir;
      // Progress bars, stage lines and notes are rank 0's; this rank keeps a stream for its
      // errors (prefixed with its rank) and sends the rest of its output to /dev/null.
      const int err_fd = ::dup(STDERR_FILENO);
      if (err_fd >= 0) errors = ::fdopen(err_fd, "w");
      if (errors == nullptr) errors = stderr;
      std::setvbuf(errors, nullptr, _IONBF, 0);
      if (std::freopen("/dev/null", "w", stdout) == nullptr) std::fprintf(errors, "%s: stdout stays open\n", who.c_str());
      if (errors != stderr && std::freopen("/dev/null", "w", stderr) == nullptr)
        std::fprintf(errors, "%s: stderr stays open\n", who.c_str());
    }
  }
  struct RemoveDir {
    std::string dir;
    ~RemoveDir() {
      std::error_code ec;
      if (!dir.empty()) std::filesystem::remove_all(dir, ec);
    }
  } remove_private{private_dir};
  try {
    const qforge::PipelineResult res = qforge::run_pipeline(recipe, opt);
    world.barrier();  // rank 0 has written every output
    if (dry_run) return 0;
    if (res.report_path.empty()) std::printf("qtrain: no report files (export.report: false)\n");
    else std::printf("qtrain: report written to %s\n", res.report_path.c_str());
    for (const std::string& stage : qforge::metric_stages_in_order(res.metrics)) {
      std::printf("  %-8s", stage.c_str());
      for (const auto& [k, v] : res.metrics.at(stage)) std::printf(" %s=%.4f", k.c_str(), v);
      std::printf("\n");
    }
    std::printf("%s", res.headline.c_str());
    if (res.interrupted) {
      std::fprintf(errors, "%s: interrupted; stages completed before the interrupt are in the report\n", who.c_str());
      return 130;
    }
  } catch (const qforge::RecipeError& e) {
    // Found once the model exists (e.g. a search candidate no layer can take).
    std::fprintf(errors, "%s: %s\n", who.c_str(), e.what());
    world.report_failure(e.what());  // the other ranks' errors name this rank and why
    return 2;
  } catch (const qforge::StageError& e) {
    std::fprintf(errors, "%s: %s\n", who.c_str(), e.what());
    world.report_failure(e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(errors, "%s: failed: %s\n", who.c_str(), e.what());
    world.report_failure(e.what());
    return 1;
  }
  return 0;
}

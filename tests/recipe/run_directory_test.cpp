// The run directory of issue 39: inputs inside --out (item 13), two runs into one --out (items 6
// and 15) and the previous run's reports (item 16).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "framework/pipeline/float_checkpoint.h"
#include "framework/pipeline/pipeline.h"
#include "framework/pipeline/run_directory.h"
#include "framework/recipe/recipe.h"
#include "framework/recipe/sha256.h"
#include "framework/recipe/task.h"
#include "framework/report/report_files.h"
#include "tests/error_of.h"
#include "tests/paths.h"

using namespace qforge;
using qforge::testing::error_of;
namespace fs = std::filesystem;

namespace {

struct TempOut {
  fs::path dir;
  TempOut() {
    std::string tmpl = (fs::temp_directory_path() / "qforge_run_dir_test_XXXXXX").string();
    dir = ::mkdtemp(tmpl.data());
  }
  ~TempOut() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  std::string file(const std::string& name) const { return (dir / name).string(); }
};

void write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

std::string read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

Recipe cnn(const std::vector<std::string>& overrides) {
  return load_recipe(std::string(QFORGE_SOURCE_DIR) + "/recipes/fmnist_cnn_int8.yaml", overrides);
}

// Runs the pipeline with the interrupt already requested: the checks, the lock and the clean-up
// run, then the data stage stops at once (no data is read, nothing is trained).
std::string run_interrupted(const Recipe& r, const std::string& out) {
  static const std::atomic<bool> stop{true};
  PipelineOptions o;
  o.out_dir = out;
  o.interrupted = &stop;
  return error_of([&] { run_pipeline(r, o); });
}

pid_t dead_pid() {
  const pid_t p = ::fork();
  if (p == 0) ::_exit(0);
  ::waitpid(p, nullptr, 0);
  return p;
}

}  // namespace

// Item 13: model.safetensors inside --out was deleted by the clean-up before it was read, and a
// float checkpoint at OUT/model.h5 was overwritten by the export.
TEST(RunDirectory, Issue39Item13InputsInsideOutAreNeverClearedOrOverwritten) {
  TempOut out;
  const std::string weights = out.file("model.safetensors");
  write(weights, "input weights");
  write(out.file("report.json"), "previous run");
  const Recipe keep = cnn({"model.checkpoint=" + out.file("fp32.h5"), "model.safetensors=" + weights});
  EXPECT_EQ(error_of([&] { pipeline::check_run_inputs(keep, out.dir.string()); }), "");
  const std::vector<std::string> cleared = pipeline::clear_run_outputs(keep, out.dir.string());
  EXPECT_EQ(read(weights), "input weights");
  EXPECT_EQ(cleared, std::vector<std::string>{"report.json"});
  // An input the run would write over is an error before the first stage; nothing is touched.
  write(out.file("report.json"), "previous run");
  const Recipe clash = cnn({"model.checkpoint=" + out.file("fp32.h5"), "model.safetensors=" + weights,
                            "export.safetensors=true"});
  std::string e = run_interrupted(clash, out.dir.string());
  EXPECT_NE(e.find("model.safetensors " + weights + " is also model.safetensors, which this run writes into --out"),
            std::string::npos) << e;
  EXPECT_EQ(read(weights), "input weights");
  EXPECT_EQ(read(out.file("report.json")), "previous run");
  // The float checkpoint at OUT/model.h5 would be replaced by the quantized export.
  write(out.file("model.h5"), "float weights");
  e = run_interrupted(cnn({"model.checkpoint=" + out.file("model.h5")}), out.dir.string());
  EXPECT_NE(e.find("model.checkpoint " + out.file("model.h5") + " is also model.h5"), std::string::npos) << e;
  EXPECT_EQ(read(out.file("model.h5")), "float weights");
  // Without the export it is an input like any other: kept.
  EXPECT_EQ(run_interrupted(cnn({"model.checkpoint=" + out.file("model.h5"), "export.checkpoint=false"}),
                            out.dir.string()),
            "");
  EXPECT_EQ(read(out.file("model.h5")), "float weights");
  // The same file under another spelling (a symbolic link) is the same input.
  fs::create_directory_symlink(out.dir, out.file("alias"));
  e = run_interrupted(cnn({"model.checkpoint=" + out.file("alias/model.h5")}), out.dir.string());
  EXPECT_NE(e.find("is also model.h5"), std::string::npos) << e;
}

// Items 6 and 15: two runs into one --out at once mixed their files (one crashed); the second is
// now refused naming the first's pid, and a lock left by a killed run is taken over, said so.
TEST(RunDirectory, Issue39Items6And15SecondRunIntoOneOutIsRefused) {
  TempOut out;
  int ready[2], release[2];
  ASSERT_EQ(::pipe(ready), 0);
  ASSERT_EQ(::pipe(release), 0);
  const pid_t holder = ::fork();
  if (holder == 0) {
    int code = 0;
    try {
      pipeline::RunLock lock(out.dir.string());
      (void)!::write(ready[1], "x", 1);
      char c;
      (void)!::read(release[0], &c, 1);
    } catch (...) {
      code = 1;
    }
    ::_exit(code);
  }
  char c;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  const std::string held = "is in use by another qtrain run (pid " + std::to_string(holder) + ", lock file ";
  std::string e = error_of([&] { pipeline::RunLock second(out.dir.string()); });
  EXPECT_NE(e.find(held), std::string::npos) << e;
  write(out.file("report.json"), "the other run's report");
  e = run_interrupted(cnn({"model.checkpoint=" + out.file("fp32.h5")}), out.dir.string());
  EXPECT_NE(e.find(held), std::string::npos) << e;
  EXPECT_EQ(read(out.file("report.json")), "the other run's report");  // nothing of the holder's touched
  ASSERT_EQ(::write(release[1], "x", 1), 1);
  int status = 0;
  ::waitpid(holder, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_FALSE(fs::exists(out.file(pipeline::RunLock::kFileName)));  // released and removed
  {
    pipeline::RunLock mine(out.dir.string());
    EXPECT_EQ(mine.note(), "");
    EXPECT_EQ(read(mine.path()), std::to_string(::getpid()) + "\n");
  }
  // A run killed with SIGKILL leaves its lock file: the next run takes it over and says so.
  const pid_t dead = dead_pid();
  write(out.file(pipeline::RunLock::kFileName), std::to_string(dead) + "\n");
  pipeline::RunLock taken(out.dir.string());
  EXPECT_NE(taken.note().find("left by pid " + std::to_string(dead) + " (which no longer runs"), std::string::npos)
      << taken.note();
  for (int fd : {ready[0], ready[1], release[0], release[1]}) ::close(fd);
}

// On a filesystem without locks (flock fails with ENOLCK) a run goes on, warning that concurrent
// runs are not detected, instead of refusing every run.
TEST(RunDirectory, Issue39Items6And15FilesystemWithoutLocksWarnsAndGoesOn) {
  TempOut out;
  pipeline::RunLock::LockFn no_locks = [](int, int) {
    errno = ENOLCK;
    return -1;
  };
  std::unique_ptr<pipeline::RunLock> lock;
  ASSERT_NO_THROW(lock = std::make_unique<pipeline::RunLock>(out.dir.string(), no_locks));
  EXPECT_NE(lock->note().find("concurrent runs are not detected on this filesystem (cannot lock " + lock->path() +
                              ": " + std::strerror(ENOLCK) + ")"),
            std::string::npos) << lock->note();
  EXPECT_EQ(read(lock->path()), std::to_string(::getpid()) + "\n");
  lock.reset();
  EXPECT_FALSE(fs::exists(out.file(pipeline::RunLock::kFileName)));
  // A lock held by another is still refused.
  pipeline::RunLock::LockFn held = [](int, int) {
    errno = EWOULDBLOCK;
    return -1;
  };
  EXPECT_NE(error_of([&] { pipeline::RunLock second(out.dir.string(), held); }).find("is in use by another qtrain run"),
            std::string::npos);
}

// A recipe read from a pipe (/dev/stdin, <(...)) was read before the checks: it is not refused as
// a non-regular input, while a FIFO as another input still is.
TEST(RunDirectory, Issue39Item21ARecipeFromAPipeIsNotRefused) {
  TempOut out;
  Recipe r = cnn({});
  r.path = out.file("recipe.fifo");
  ASSERT_EQ(::mkfifo(r.path.c_str(), 0600), 0);
  EXPECT_NO_THROW(pipeline::check_run_inputs(r, out.file("run")));
  r.model.checkpoint = r.path;
  EXPECT_NE(error_of([&] { pipeline::check_run_inputs(r, out.file("run")); }).find(" is a FIFO, not a regular file"),
            std::string::npos);
}

// Item 16: report.html (and the other reports) of a previous run survived a run stopped before
// its first report; every output of a previous run is now cleared at the start.
TEST(RunDirectory, Issue39Item16PreviousReportsAreClearedAtTheStart) {
  TempOut out;
  for (const std::string& name : pipeline::run_output_names()) write(out.file(name), "previous run");
  EXPECT_EQ(run_interrupted(cnn({"model.checkpoint=" + out.file("fp32.h5")}), out.dir.string()), "");
  for (const char* name : {"report.json", "report.md", "report.html", "recipe.searched.yaml", "model.h5",
                           "calibration.h5", "model.safetensors", "model.onnx"})
    EXPECT_FALSE(fs::exists(out.file(name))) << name;
  EXPECT_NE(read(out.file("recipe.resolved.yaml")), "previous run");  // this run's
  EXPECT_FALSE(fs::exists(out.file(pipeline::RunLock::kFileName)));
}

// Item 4: the shipped recipes' float checkpoint is keyed by the settings that trained it (two
// trainings never share a file), and a dry run refuses a checkpoint trained differently, as the
// run would.
TEST(FloatCheckpoint, Issue39Item4DefaultPathIsKeyedBySettingsAndTheDryRunReportsAMismatch) {
  const Recipe one = cnn({"train.epochs=1"}), two = cnn({"train.epochs=2"}), again = cnn({"train.epochs=1"});
  EXPECT_EQ(one.model.checkpoint, "runs/checkpoints/cnn_fmnist_fp32-" + float_key(one) + ".h5");
  EXPECT_EQ(float_key(one), sha256_hex(float_provenance(one).dump()).substr(0, 12));
  EXPECT_NE(one.model.checkpoint, two.model.checkpoint);
  EXPECT_EQ(one.model.checkpoint, again.model.checkpoint);
  EXPECT_NE(cnn({"train.lr=0.5"}).model.checkpoint, cnn({}).model.checkpoint);
  EXPECT_EQ(cnn({"qat.epochs=3"}).model.checkpoint, cnn({}).model.checkpoint);  // not a float setting
  // The resolved recipe keeps the {float_key} token: rerunning it expands it the same way.
  EXPECT_NE(one.resolved_yaml.find(std::string("fmnist_fp32-") + kFloatKeyToken), std::string::npos);

  TempOut out;
  const std::string ckpt = out.file("fp32.h5");
  Task t = make_task(one, /*with_data=*/false);
  pipeline::save_float_checkpoint(*t.model, ckpt, one);
  PipelineOptions dry;
  dry.dry_run = true;
  const std::string e = error_of([&] { run_pipeline(cnn({"train.epochs=2", "model.checkpoint=" + ckpt}), dry); });
  EXPECT_NE(e.find("holds float weights trained differently"), std::string::npos) << e;
  EXPECT_NE(e.find("train.epochs: checkpoint 1, this recipe 2"), std::string::npos) << e;
  EXPECT_EQ(error_of([&] { run_pipeline(cnn({"train.epochs=1", "model.checkpoint=" + ckpt}), dry); }), "");
}

// Item 4: model.config_file's contents, not only its name, key the float checkpoint: an edited
// config.json trains a different model.
TEST(FloatCheckpoint, Issue39Item4ConfigFileContentsKeyTheFloatCheckpoint) {
  TempOut out;
  const std::string config = out.file("config.json");
  write(config, R"({"hidden_size": 64})");
  const Recipe a = cnn({"model.config_file=" + config});
  EXPECT_EQ(float_provenance(a).at("model.config_file.sha256"), sha256_hex(R"({"hidden_size": 64})"));
  write(config, R"({"hidden_size": 96})");
  const Recipe b = cnn({"model.config_file=" + config});
  EXPECT_NE(a.model.checkpoint, b.model.checkpoint);
  EXPECT_FALSE(float_provenance(cnn({})).contains("model.config_file.sha256"));
  fs::remove(config);
  EXPECT_NE(error_of([&] { cnn({"model.config_file=" + config}); }).find("cannot be read"), std::string::npos);
}

// Item 18: a path that is not UTF-8 aborted the run after the work with a raw
// json.exception.type_error.316; now it is refused before anything is created, naming the path in
// printable form, and text from foreign files is escaped in the reports.
TEST(RunDirectory, Issue39Item18NonUtf8PathsAreRefusedAtTheStartAndForeignTextIsEscaped) {
  TempOut out;
  const std::string bad_out = out.file("run-\xff\xfe");
  const std::string e = run_interrupted(cnn({"model.checkpoint=" + out.file("fp32.h5")}), bad_out);
  EXPECT_NE(e.find("--out \"" + out.file("run-\\xFF\\xFE") + "\" is not valid UTF-8"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(bad_out));
  const std::string ckpt = run_interrupted(cnn({"model.checkpoint=" + out.file("fp\xc3(32.h5")}), out.file("run"));
  EXPECT_NE(ckpt.find("model.checkpoint \"" + out.file("fp\\xC3(32.h5") + "\" is not valid UTF-8"), std::string::npos)
      << ckpt;
  // Valid UTF-8 passes as it is (é, 日本).
  EXPECT_EQ(run_interrupted(cnn({"model.checkpoint=" + out.file("fp32-\xc3\xa9.h5")}), out.file("\xe6\x97\xa5\xe6\x9c\xac")), "");
  // A foreign key reaching a report: escaped, and the JSON dumps.
  const nlohmann::json j = {{"search", {{"key\xff", "value\x80\x1b[31m"}}}, {"ok", "caf\xc3\xa9"}};
  const nlohmann::json safe = safe_for_report(j);
  EXPECT_NO_THROW((void)safe.dump());
  ASSERT_TRUE(safe.at("search").contains("key\\xFF")) << safe.dump();
  EXPECT_EQ(safe.at("search").at("key\\xFF"), "value\\x80\\x1B[31m");
  EXPECT_EQ(safe.at("ok"), "caf\xc3\xa9");
}

// Item 22: a SIGKILLed rank left its /tmp/qtrain-rank-* folder behind; the next rank to start
// removes this user's folders whose pid no longer runs, and keeps the others.
TEST(RunDirectory, Issue39Item22RankFoldersOfKilledRanksAreRemoved) {
  TempOut tmp;
  const fs::path stale = tmp.dir / ("qtrain-rank-" + std::to_string(dead_pid()) + "-abc123");
  const fs::path live = tmp.dir / ("qtrain-rank-" + std::to_string(::getpid()) + "-def456");
  const fs::path unnamed = tmp.dir / "qtrain-rank-Xy12ab";  // no pid in the name: not judged
  for (const fs::path& d : {stale, live, unnamed}) fs::create_directories(d / "sub");
  write((stale / "sub" / "report.json").string(), "left by a killed rank");
  std::vector<std::string> removed;
  const std::string mine = pipeline::make_rank_dir(tmp.dir.string(), &removed);
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(live));
  EXPECT_TRUE(fs::exists(unnamed));
  EXPECT_EQ(removed, std::vector<std::string>{stale.filename().string()});
  EXPECT_EQ(fs::path(mine).parent_path(), tmp.dir);
  EXPECT_EQ(fs::path(mine).filename().string().rfind("qtrain-rank-" + std::to_string(::getpid()) + "-", 0), 0u) << mine;
  struct stat st {};
  ASSERT_EQ(::stat(mine.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  EXPECT_NE(error_of([] { pipeline::make_rank_dir("/proc/qforge-no-such-dir"); }).find("cannot create a private output directory"),
            std::string::npos);
}

// Item 22: export.report: false was ignored; a run with it writes no report file (and clears the
// previous run's, as every run does). The float stage loads a checkpoint: no training.
TEST(RunDirectory, Issue39Item22ExportReportFalseWritesNoReport) {
  TempOut out;
  const std::string ckpt = out.file("fp32.h5");
  const std::vector<std::string> set{"model.checkpoint=" + ckpt, "data.max_eval_examples=64"};
  {
    const Recipe r = cnn(set);
    Task t = make_task(r, /*with_data=*/false);
    pipeline::save_float_checkpoint(*t.model, ckpt, r);
  }
  PipelineOptions o;
  o.stages = {"float"};
  o.out_dir = out.file("with");
  EXPECT_EQ(error_of([&] { run_pipeline(cnn(set), o); }), "");
  EXPECT_TRUE(fs::exists(out.file("with/report.json")));
  std::vector<std::string> off = set;
  off.emplace_back("export.report=false");
  o.out_dir = out.file("without");
  fs::create_directories(o.out_dir);
  write(out.file("without/report.json"), "previous run");
  EXPECT_EQ(error_of([&] { run_pipeline(cnn(off), o); }), "");
  for (const char* f : {"report.json", "report.md", "report.html"})
    EXPECT_FALSE(fs::exists(out.file(std::string("without/") + f))) << f;
}

// Item 22: a 20 MB key from a foreign file was copied whole into all three reports; a report keeps
// the first kReportTextKept bytes of any string or key longer than kMaxReportText.
TEST(RunDirectory, Issue39Item22HugeForeignTextIsCutInReports) {
  const std::string huge(20 << 20, 'k');
  const nlohmann::json safe = safe_for_report({{"search", {{huge, huge}}}, {"short", std::string(kMaxReportText, 's')}});
  const std::string cut = huge.substr(0, kReportTextKept) + "... (20971520 bytes; cut for the report)";
  ASSERT_TRUE(safe["search"].contains(cut));
  EXPECT_EQ(safe["search"][cut], cut);
  EXPECT_EQ(safe["short"].get<std::string>().size(), kMaxReportText);  // at the bound: whole
  EXPECT_LT(safe.at("search").dump().size(), 1000u);
}

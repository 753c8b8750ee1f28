// The run directory (--out) of a qtrain run: one run at a time writes into it (a lock file naming
// the holder's pid), the previous run's outputs are cleared before this run writes anything, and
// the files the recipe reads are never cleared or overwritten: an input that is also an output of
// the run is an error before the first stage.
#pragma once

#include <string>
#include <vector>

#include "framework/recipe/recipe.h"

namespace qforge::pipeline {

// Every file a run may write into --out, by name (reports, resolved and searched recipes, the
// exported model files).
const std::vector<std::string>& run_output_names();

// The names of run_output_names() this recipe's run writes.
std::vector<std::string> written_output_names(const Recipe& r);

// A file the recipe reads: its recipe key ("model.checkpoint", "recipe" for the recipe file) and
// path. model.checkpoint is one whether or not it exists yet (a run that trains writes it).
struct RunInput {
  std::string key;
  std::string path;
};
std::vector<RunInput> run_inputs(const Recipe& r);

// Before the first stage: every input that exists is a regular file, and none is a file this run
// writes (an output in `out_dir`, or the float checkpoint). Throws qforge::Error naming both.
void check_run_inputs(const Recipe& r, const std::string& out_dir);
// Fails, naming it in printable form, for a path the reports record (--out, the recipe, its
// inputs) that is not valid UTF-8: before anything is created, not when report.json is written.
void check_recorded_paths(const Recipe& r, const std::string& out_dir);

// Removes the previous run's outputs from `out_dir` (and killed writers' temporaries), keeping
// every input of the recipe; returns the names removed.
std::vector<std::string> clear_run_outputs(const Recipe& r, const std::string& out_dir);

// The private output directory of a rank other than 0 under torchrun (removed when it ends):
// <tmp>/qtrain-rank-<pid>-XXXXXX (qtrain's <tmp>: $TMPDIR, else /tmp), made by mkdtemp (mode 0700). A SIGKILLed rank cannot remove
// its own, so folders of that form owned by this user whose pid no longer runs are removed
// first (their names appended to `removed` when given). Throws naming `tmp` when none can be made.
std::string make_rank_dir(const std::string& tmp, std::vector<std::string>* removed = nullptr);

// `<dir>/.qtrain.lock`, held (flock) for the object's lifetime and holding the holder's pid. A
// second run into the same directory is refused naming that pid; a lock file left by a run that
// was killed is taken over (note() says so). The file is removed when the lock is released.
class RunLock {
 public:
  static constexpr const char* kFileName = ".qtrain.lock";
  // `lock` stands for flock(2) (nullptr: flock itself; tests pass a failing one). A lock error
  // other than "held by another" (a filesystem without locks) is a warning and a note, not a
  // refusal; so is failing to write the pid.
  using LockFn = int (*)(int fd, int operation);
  explicit RunLock(const std::string& dir, LockFn lock = nullptr);
  ~RunLock();
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

  const std::string& path() const { return path_; }
  // What the report should say about taking the lock ("" when nothing was left behind).
  const std::string& note() const { return note_; }

 private:
  std::string path_;
  std::string note_;
  int fd_ = -1;
};

}  // namespace qforge::pipeline

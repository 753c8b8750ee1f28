// The run directory's lock, outputs and inputs (run_directory.h).
#include "framework/pipeline/run_directory.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "framework/core/error.h"
#include "framework/core/utf8.h"
#include "framework/format/atomic_file.h"
#include "framework/format/input_file.h"
#include "framework/pipeline/stage_registry.h"
#include "framework/report/report_files.h"

namespace qforge::pipeline {

namespace fs = std::filesystem;

namespace {

// The same file, whether or not it exists yet (symbolic links and ".." resolved).
bool same_file(const std::string& a, const std::string& b) {
  std::error_code ec;
  if (fs::exists(a, ec) && fs::exists(b, ec)) return fs::equivalent(a, b, ec);
  const fs::path ca = fs::weakly_canonical(fs::absolute(a, ec), ec);
  const fs::path cb = fs::weakly_canonical(fs::absolute(b, ec), ec);
  return !ec && ca == cb;
}

bool is_input(const Recipe& r, const fs::path& p) {
  for (const RunInput& in : run_inputs(r))
    if (same_file(in.path, p.string())) return true;
  return false;
}

}  // namespace

const std::vector<std::string>& run_output_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n(std::begin(kReportFileNames), std::end(kReportFileNames));
    for (const char* f : {"recipe.resolved.yaml", "recipe.searched.yaml", "model.h5", "calibration.h5",
                          "model.safetensors", "model.onnx", "tokenizer.json", "tokenizer.model",
                          "model.pt", "model.gguf"})
      n.emplace_back(f);
    return n;
  }();
  return names;
}

std::vector<std::string> written_output_names(const Recipe& r) {
  std::vector<std::string> out(std::begin(kReportFileNames), std::end(kReportFileNames));
  out.emplace_back("recipe.resolved.yaml");
  if (search_stage().applies(r)) out.emplace_back("recipe.searched.yaml");
  if (export_stage().applies(r)) {
    const Recipe::Export& e = r.export_;
    if (e.checkpoint) out.emplace_back("model.h5");
    if (e.calibration_dump) out.emplace_back("calibration.h5");
    if (e.safetensors) out.emplace_back("model.safetensors");
    if (e.onnx) out.emplace_back("model.onnx");
    if (e.gguf.enabled) out.emplace_back("model.gguf");
    if (r.data.tokenizer_vocab_size > 0) out.emplace_back("tokenizer.json");
    if (e.torchscript && !r.model.torchscript.empty()) out.emplace_back("model.pt");
  }
  return out;
}

std::vector<RunInput> run_inputs(const Recipe& r) {
  std::vector<RunInput> in;
  if (!r.path.empty()) in.push_back({"recipe", r.path});
  if (!r.model.checkpoint.empty()) in.push_back({"model.checkpoint", r.model.checkpoint});
  if (!r.model.safetensors.empty()) in.push_back({"model.safetensors", r.model.safetensors});
  if (!r.model.config_file.empty()) in.push_back({"model.config_file", r.model.config_file});
  if (!r.data.tokenizer_file.empty()) in.push_back({"data.tokenizer.file", r.data.tokenizer_file});
  if (!r.model.torchscript.empty()) in.push_back({"model.torchscript", r.model.torchscript});
  if (!r.data.file.empty()) in.push_back({"data.file", r.data.file});
  if (!r.search.sensitivities_from.empty()) in.push_back({"search.sensitivities_from", r.search.sensitivities_from});
  if (!r.search.latency_cache.empty() && r.search.latency_cache != "off")
    in.push_back({"search.latency_cache", r.search.latency_cache});
  return in;
}

void check_recorded_paths(const Recipe& r, const std::string& out_dir) {
  std::vector<RunInput> recorded = run_inputs(r);
  recorded.push_back({"--out", out_dir});
  for (const RunInput& in : recorded) {
    const size_t bad = find_invalid_utf8(in.path);
    QF_REQUIRE(bad == std::string::npos, in.key, " \"", printable(in.path), "\" is not valid UTF-8 (byte ", bad,
               "): report.json records it and JSON text is UTF-8 only; rename it or choose a UTF-8 path");
  }
}

void check_run_inputs(const Recipe& r, const std::string& out_dir) {
  const std::vector<RunInput> inputs = run_inputs(r);
  for (const RunInput& in : inputs) {
    std::error_code ec;
    // The recipe was read already: /dev/stdin and <(...) keep working.
    if (in.key != "recipe" && fs::exists(in.path, ec)) io::require_regular_file(in.path, in.key);
  }
  for (const std::string& name : written_output_names(r)) {
    const std::string out = (fs::path(out_dir) / name).string();
    for (const RunInput& in : inputs)
      QF_REQUIRE(!same_file(in.path, out), in.key, " ", in.path, " is also ", name,
                 ", which this run writes into --out ", out_dir,
                 ": the run would overwrite its own input. Move the input out of --out or choose another --out");
  }
  // The float checkpoint is written when the run trains: no other input may be at its path.
  for (const RunInput& in : inputs)
    QF_REQUIRE(in.key == "model.checkpoint" || r.model.checkpoint.empty() || !same_file(in.path, r.model.checkpoint),
               in.key, " ", in.path,
               " is also model.checkpoint, which a run that trains writes: give them different paths");
}

std::vector<std::string> clear_run_outputs(const Recipe& r, const std::string& out_dir) {
  std::vector<std::string> cleared;
  for (const std::string& name : run_output_names()) {
    const fs::path p = fs::path(out_dir) / name;
    std::error_code ec;
    if (!fs::exists(fs::symlink_status(p, ec)) || is_input(r, p)) continue;
    if (fs::remove(p, ec)) cleared.push_back(name);
  }
  for (const std::string& t : io::remove_stale_temporaries(out_dir)) cleared.push_back(t);
  return cleared;
}

namespace {

constexpr const char* kRankDirPrefix = "qtrain-rank-";

// The pid in "qtrain-rank-<pid>-XXXXXX", or 0 when the name is not of that form.
long rank_dir_pid(const std::string& name) {
  if (name.rfind(kRankDirPrefix, 0) != 0) return 0;
  const std::string tail = name.substr(std::strlen(kRankDirPrefix));
  const size_t dash = tail.find('-');
  if (dash == 0 || dash == std::string::npos || tail.find_first_not_of("0123456789") != dash) return 0;
  return std::strtol(tail.substr(0, dash).c_str(), nullptr, 10);
}

}  // namespace

std::string make_rank_dir(const std::string& tmp, std::vector<std::string>* removed) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(tmp, ec)) {
    const std::string name = e.path().filename().string();
    const long pid = rank_dir_pid(name);
    struct stat st {};
    if (pid <= 0 || ::lstat(e.path().c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::getuid()) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // alive (or not ours to judge)
    std::error_code rm;
    if (fs::remove_all(e.path(), rm) > 0 && removed) removed->push_back(name);
  }
  std::string tmpl = (fs::path(tmp) / (kRankDirPrefix + std::to_string(::getpid()) + "-XXXXXX")).string();
  QF_REQUIRE(::mkdtemp(tmpl.data()) != nullptr, "cannot create a private output directory in ", tmp, ": ",
             std::strerror(errno));
  return tmpl;
}

// ---------------------------------------------------------------------------------------------
// RunLock

namespace {

long read_pid(int fd) {
  char buf[32] = {};
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  return n > 0 ? std::strtol(buf, nullptr, 10) : 0;
}

}  // namespace

RunLock::RunLock(const std::string& dir, LockFn lock)
    : path_((fs::path(dir.empty() ? "." : dir) / kFileName).string()) {
  if (lock == nullptr) lock = ::flock;
  // A lock file removed by its releasing holder between our open and flock is not the lock any
  // more: retry until the file locked is the one at the path.
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    QF_REQUIRE(fd >= 0, "--out: cannot create the lock file ", path_, ": ", std::strerror(errno));
    std::vector<std::string> notes;
    if (lock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      if (err == EWOULDBLOCK) {
        const long holder = read_pid(fd);
        ::close(fd);
        throw Error("--out " + dir + " is in use by another qtrain run (pid " +
                    (holder > 0 ? std::to_string(holder) : std::string("unknown")) + ", lock file " + path_ +
                    "): wait for it to finish or choose another --out");
      }
      // A filesystem without locks (some NFS or FUSE mounts) must not refuse every run.
      notes.push_back("concurrent runs are not detected on this filesystem (cannot lock " + path_ + ": " +
                      std::strerror(err) + ")");
      std::fprintf(stderr, "qtrain: warning: %s\n", notes.back().c_str());
    }
    struct stat held {}, at_path {};
    if (::fstat(fd, &held) != 0 || ::stat(path_.c_str(), &at_path) != 0 || held.st_ino != at_path.st_ino ||
        held.st_dev != at_path.st_dev) {
      ::close(fd);
      continue;
    }
    const long previous = read_pid(fd);
    if (previous > 0 && previous != ::getpid()) {
      const bool alive = ::kill(static_cast<pid_t>(previous), 0) == 0 || errno == EPERM;
      notes.push_back("took over the lock file " + path_ + " left by pid " + std::to_string(previous) +
                      (alive ? " (which no longer holds it)" : " (which no longer runs: a run killed before its end)"));
    }
    const std::string pid = std::to_string(::getpid()) + "\n";
    if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size()))
      notes.push_back("cannot write this run's pid into the lock file " + path_ + " (" + std::strerror(errno) +
                      "): a run refused by this lock names no pid");
    for (const std::string& n : notes) note_ += (note_.empty() ? "" : "; ") + n;
    fd_ = fd;
    return;
  }
  throw Error("--out: cannot take the lock file " + path_ + " (it keeps being replaced)");
}

RunLock::~RunLock() {
  if (fd_ < 0) return;
  ::unlink(path_.c_str());  // before the unlock: a waiting run then makes a fresh file
  ::close(fd_);
}

}  // namespace qforge::pipeline

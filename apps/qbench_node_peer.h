// A node process that qbench drives through a pipe, for peers that ship as npm packages
// (llama.cpp through node-llama-cpp, ONNX Runtime through onnxruntime-node): the script prints
// "ready" once loaded, then answers each "run" line with a line starting "done" after one timed
// unit of work; closing stdin ends it. The pipe round trip (tens of µs) is inside the peer's time.
#pragma once

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "framework/core/error.h"

namespace qforge::bench {

// DIR/node_modules when DIR/node_modules/PACKAGE/package.json exists, DIR being $ENV_VAR or
// `default_dir`; else "" and *why says what to run (`hint`) or which variable to set.
inline std::string node_modules_with(const char* env_var, const std::string& default_dir, const std::string& package,
                                     const std::string& hint, std::string* why) {
  const char* env = std::getenv(env_var);
  const std::string dir = (env ? std::string(env) : default_dir) + "/node_modules";
  if (std::filesystem::exists(dir + "/" + package + "/package.json")) return dir;
  *why = "no " + package + " in " + dir + " (" + hint + " once, or set " + env_var + ")";
  return "";
}

class NodePeer {
 public:
  // Runs `node script args...`; throws with the script's first line unless it prints "ready".
  NodePeer(const std::string& script, const std::vector<std::string>& args, const std::string& what) : what_(what) {
    // A peer that died makes run() throw instead of SIGPIPE ending qbench without a word.
    std::signal(SIGPIPE, SIG_IGN);
    // Close-on-exec, so a second peer started later does not inherit this one's pipe ends (its
    // stdin would then never reach end-of-file and the destructor's waitpid would not return).
    int to_child[2] = {-1, -1}, from_child[2] = {-1, -1};
    if (pipe2(to_child, O_CLOEXEC) != 0 || pipe2(from_child, O_CLOEXEC) != 0) {
      for (int fd : {to_child[0], to_child[1], from_child[0], from_child[1]})
        if (fd >= 0) close(fd);
      QF_REQUIRE(false, "qbench: pipe2() failed for ", what_);
    }
    std::vector<std::string> argv_s{"node", script};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = fork();
    if (pid_ == 0) {
      dup2(to_child[0], 0), dup2(from_child[1], 1);
      fcntl(0, F_SETFD, 0), fcntl(1, F_SETFD, 0);  // also when a pipe end already was fd 0 or 1
      execvp("node", argv.data());
      _exit(127);
    }
    close(to_child[0]), close(from_child[1]);
    in_ = pid_ > 0 ? fdopen(to_child[1], "w") : nullptr;
    out_ = pid_ > 0 ? fdopen(from_child[0], "r") : nullptr;
    if (!in_) close(to_child[1]);
    if (!out_) close(from_child[0]);
    const std::string first = in_ && out_ ? line() : "fork() or fdopen() failed";
    if (first != "ready") {
      end();
      QF_REQUIRE(false, "qbench: ", what_, " did not load: ", first);
    }
  }
  ~NodePeer() { end(); }
  NodePeer(const NodePeer&) = delete;
  NodePeer& operator=(const NodePeer&) = delete;

  // One unit of the peer's work; returns the rest of its "done" line.
  std::string run() {
    QF_REQUIRE(std::fputs("run\n", in_) >= 0 && std::fflush(in_) == 0, "qbench: ", what_, " has exited");
    const std::string reply = line();
    QF_REQUIRE(reply.rfind("done", 0) == 0, "qbench: ", what_, " failed: ", reply);
    return reply.substr(4);
  }

 private:
  std::string line() {
    char buf[4096];
    if (!std::fgets(buf, sizeof buf, out_)) return "(node exited)";
    std::string s(buf);
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
    return s;
  }
  // Closes stdin (the peer's signal to finish), then reaps it.
  void end() noexcept {
    if (in_) std::fclose(in_);
    if (out_) std::fclose(out_);
    in_ = out_ = nullptr;
    if (pid_ > 0) waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  std::string what_;
  pid_t pid_ = -1;
  std::FILE* in_ = nullptr;
  std::FILE* out_ = nullptr;
};

}  // namespace qforge::bench

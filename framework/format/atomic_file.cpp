// AtomicFile: temp file + fsync + rename + directory fsync.
#include "framework/format/atomic_file.h"

#include <fstream>

#include <fcntl.h>
#include <sys/stat.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <mutex>

#include "framework/core/error.h"

namespace qforge::io {

namespace {
std::string directory_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string basename_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}
}  // namespace

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  QF_REQUIRE(fd >= 0, "framework/io: cannot open '", path, "' to fsync: ", std::strerror(errno));
  const int r = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  QF_REQUIRE(r == 0, "framework/io: fsync of '", path, "' failed: ", std::strerror(err));
}

AtomicFile::AtomicFile(std::string target) : target_(std::move(target)) {
  QF_REQUIRE(!target_.empty() && target_.back() != '/', "framework/io: invalid target path '",
             target_, "'");
  // pid + a process-wide counter: unique among concurrent writers, also across threads.
  static std::atomic<uint64_t> counter{0};
  const std::string dir = directory_of(target_);
  temp_ = (dir == "." && target_.find('/') == std::string::npos ? std::string() : dir + "/") + "." +
          basename_of(target_) + ".tmp-" + std::to_string(::getpid()) + "-" +
          std::to_string(counter.fetch_add(1));
}

AtomicFile::~AtomicFile() {
  if (!committed_) ::unlink(temp_.c_str());
}

void AtomicFile::commit() {
  QF_REQUIRE(!committed_, "framework/io: '", target_, "' already committed");
  fsync_path(temp_, false);
  QF_REQUIRE(::rename(temp_.c_str(), target_.c_str()) == 0, "framework/io: cannot rename '", temp_,
             "' to '", target_, "': ", std::strerror(errno));
  committed_ = true;
  // The rename itself is durable only once the directory entry is on disk.
  fsync_path(directory_of(target_), true);
}

void write_text_atomically(const std::string& path, const std::string& text) {
  AtomicFile file(path);
  {
    std::ofstream out(file.temp_path(), std::ios::binary);
    out << text;
    out.flush();
    QF_REQUIRE(out.good(), "cannot write ", path, " (temporary file ", file.temp_path(), ")");
  }
  file.commit();
}

std::vector<std::string> remove_stale_temporaries(const std::string& dir) {
  std::vector<std::string> removed;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.empty() || name[0] != '.') continue;
    const size_t tmp = name.rfind(".tmp-");
    if (tmp == std::string::npos) continue;
    // ".tmp-<pid>-<n>": digits, a dash, digits.
    const std::string tail = name.substr(tmp + 5);
    const size_t dash = tail.find('-');
    if (dash == std::string::npos || dash == 0 || dash + 1 == tail.size() ||
        tail.find_first_not_of("0123456789-") != std::string::npos || tail.find('-', dash + 1) != std::string::npos)
      continue;
    const long pid = std::strtol(tail.substr(0, dash).c_str(), nullptr, 10);
    if (pid <= 0) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // alive (or not ours to judge)
    if (std::filesystem::remove(e.path(), ec)) removed.push_back(name);
  }
  return removed;
}

namespace {

// Refuses a fallback directory that is not this user's private directory: one another user
// could read, plant files in or point elsewhere (a symbolic link).
void require_private_dir(const std::string& dir) {
  struct stat st {};
  QF_REQUIRE(::lstat(dir.c_str(), &st) == 0, "framework/io: fallback directory ", dir, ": ", std::strerror(errno));
  QF_REQUIRE(!S_ISLNK(st.st_mode), "framework/io: fallback directory ", dir, " is a symbolic link: refused");
  QF_REQUIRE(S_ISDIR(st.st_mode), "framework/io: fallback directory ", dir, " is not a directory: refused");
  QF_REQUIRE(st.st_uid == ::geteuid(), "framework/io: fallback directory ", dir, " belongs to uid ", st.st_uid,
             ", not to this user (uid ", ::geteuid(), "): refused");
  char mode[8];
  std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 0777));
  QF_REQUIRE((st.st_mode & 077) == 0, "framework/io: fallback directory ", dir, " has mode ", mode,
             " (others may enter it), not 0700: refused");
}

}  // namespace

std::string fallback_dir() {
  static std::mutex m;
  static std::string dir;  // one per process, made on first use
  std::lock_guard<std::mutex> lock(m);
  struct stat st {};
  if (!dir.empty() && ::lstat(dir.c_str(), &st) != 0 && errno == ENOENT) dir.clear();  // a cleaner removed it
  if (dir.empty()) {
    std::error_code ec;
    std::filesystem::path tmp = std::filesystem::temp_directory_path(ec);
    if (ec) tmp = "/tmp";
    // mkdtemp: a name no one can guess in advance, created by this call with mode 0700.
    std::string tmpl = (tmp / "qforge-fallback-XXXXXX").string();
    QF_REQUIRE(::mkdtemp(tmpl.data()) != nullptr, "framework/io: cannot create a fallback directory in ", tmp.string(),
               ": ", std::strerror(errno));
    dir = tmpl;
  }
  require_private_dir(dir);
  return dir;
}

std::string fallback_path(const std::string& path) {
  const std::filesystem::path name = std::filesystem::path(path).filename();
  return (std::filesystem::path(fallback_dir()) / (name.empty() ? std::filesystem::path("output") : name)).string();
}

std::string write_with_fallback(const std::string& path, const std::function<void(const std::string&)>& write,
                                std::string* reason) {
  try {
    write(path);
    return path;
  } catch (const std::exception& first) {
    std::string alt;
    try {
      alt = fallback_path(path);  // throws when no private fallback directory can be had
      write(alt);
    } catch (const std::exception& second) {
      throw Error(std::string(first.what()) + "; the fallback " + (alt.empty() ? std::string("directory") : alt) +
                  " failed too: " + second.what());
    }
    if (reason) *reason = first.what();
    return alt;
  }
}

}  // namespace qforge::io

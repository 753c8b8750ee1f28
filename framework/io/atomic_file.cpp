// AtomicFile: temp file + fsync + rename + directory fsync.
#include "framework/io/atomic_file.h"

#include <fstream>

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

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

}  // namespace qforge::io

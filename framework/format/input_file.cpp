// require_regular_file: stat(2) never blocks, where opening a FIFO for reading would.
#include "framework/format/input_file.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "framework/core/error.h"

namespace qforge::io {

namespace {

const char* kind_of(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a file";
}

}  // namespace

void require_regular_file(const std::string& path, const std::string& what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    QF_REQUIRE(errno == ENOENT || errno == ENOTDIR, what, " ", path, ": cannot stat: ", std::strerror(errno));
    return;
  }
  QF_REQUIRE(S_ISREG(st.st_mode), what, " ", path, " is ", kind_of(st.st_mode),
             ", not a regular file: qforge reads inputs only from regular files");
}

}  // namespace qforge::io

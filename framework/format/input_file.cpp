// require_regular_file: stat(2) never blocks, where opening a FIFO for reading would.
#include "framework/format/input_file.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>

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

std::vector<uint8_t> read_regular_file(const std::string& path, const std::string& what) {
  require_regular_file(path, what);
  std::ifstream f(path, std::ios::binary);
  QF_REQUIRE(f, what, " ", path, ": cannot open");
  f.seekg(0, std::ios::end);
  const auto size = static_cast<size_t>(f.tellg());
  f.seekg(0);
  std::vector<uint8_t> bytes(size);
  f.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(size));
  QF_REQUIRE(f.good() || size == 0, what, " ", path, ": error reading");
  return bytes;
}

}  // namespace qforge::io

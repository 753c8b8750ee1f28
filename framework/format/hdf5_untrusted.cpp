// What a file from elsewhere reaches of the HDF5 library: the layout check File::open makes
// before HDF5 parses anything, and run_isolated for readers of untrusted files (docs/formats.md,
// "Trusted and untrusted inputs").
#include "framework/format/hdf5.h"
#include "framework/format/hdf5_internal.h"

#include <ATen/Parallel.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "framework/core/error.h"

namespace qforge::io::h5 {

namespace {

uint32_t rot(uint32_t x, int k) { return (x << k) | (x >> (32 - k)); }

// Bob Jenkins' lookup3 hashlittle, byte by byte: the checksum of every HDF5 1.8+ metadata block.
uint32_t lookup3(const uint8_t* k, size_t length) {
  uint32_t a = 0xdeadbeef + static_cast<uint32_t>(length), b = a, c = a;
  auto word = [](const uint8_t* p, size_t n) {
    uint32_t w = 0;
    for (size_t i = 0; i < n && i < 4; ++i) w |= static_cast<uint32_t>(p[i]) << (8 * i);
    return w;
  };
  for (; length > 12; length -= 12, k += 12) {
    a += word(k, 4), b += word(k + 4, 4), c += word(k + 8, 4);
    a -= c, a ^= rot(c, 4), c += b;
    b -= a, b ^= rot(a, 6), a += c;
    c -= b, c ^= rot(b, 8), b += a;
    a -= c, a ^= rot(c, 16), c += b;
    b -= a, b ^= rot(a, 19), a += c;
    c -= b, c ^= rot(b, 4), b += a;
  }
  if (length == 0) return c;
  a += word(k, length), b += length > 4 ? word(k + 4, length - 4) : 0, c += length > 8 ? word(k + 8, length - 8) : 0;
  c ^= b, c -= rot(b, 14);
  a ^= c, a -= rot(c, 11);
  b ^= a, b -= rot(a, 25);
  c ^= b, c -= rot(b, 16);
  a ^= c, a -= rot(c, 4);
  b ^= a, b -= rot(a, 14);
  c ^= b, c -= rot(b, 24);
  return c;
}

uint64_t le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGABRT: return "SIGABRT";
    case SIGFPE: return "SIGFPE";
    case SIGILL: return "SIGILL";
    default: return "a signal";
  }
}

bool g_in_isolated_child = false;

}  // namespace

namespace internal {

void check_layout(const std::string& path) {
  // Test seam (docs/formats.md): crash like a library fault on this one file, so that tests can
  // show each untrusted reader survives it; never set outside tests.
  if (const char* crash = std::getenv("QFORGE_TEST_CRASH_READING"); crash && path == crash) std::raise(SIGSEGV);
  // Superblock version 2/3 with 8-byte offsets and lengths: signature, version, sizes, flags,
  // base, extension, end-of-file and root addresses, checksum.
  constexpr size_t kSuperblockBytes = 12 + 4 * 8 + 4;
  uint8_t sb[kSuperblockBytes] = {};
  std::ifstream in(path, std::ios::binary);
  in.read(reinterpret_cast<char*>(sb), sizeof sb);
  const size_t got = static_cast<size_t>(in.gcount());
  static const uint8_t kSignature[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
  const std::string refused = "framework/io: " + path + ": ";
  const std::string why = " qforge reads only the HDF5 1.10 formats it writes, whose metadata carry checksums"
                          " (docs/formats.md); refused before the HDF5 library parses it";
  if (got < 8 || std::memcmp(sb, kSignature, 8) != 0) {
    // HDF5 also looks for its signature after a user block (512 bytes, then each power of two).
    uint8_t sig[8] = {};
    for (uint64_t at = 512; at <= (uint64_t{1} << 40); at *= 2) {
      in.clear();
      in.seekg(static_cast<std::streamoff>(at));
      if (!in.read(reinterpret_cast<char*>(sig), sizeof sig)) break;
      QF_REQUIRE(std::memcmp(sig, kSignature, 8) != 0, refused, "an HDF5 file with a user block of ", at,
                 " bytes before its superblock, qforge writes none;", why);
    }
    throw Error(refused + "not an HDF5 file (no HDF5 signature at the start)");
  }
  QF_REQUIRE(got >= 9, refused, "truncated HDF5 superblock");
  QF_REQUIRE(sb[8] == 2 || sb[8] == 3, refused, "HDF5 superblock version ", int{sb[8]},
             sb[8] < 2 ? " (HDF5's earliest file format, without metadata checksums: h5py's default)" : "", ";", why,
             sb[8] < 2 ? "; re-save it with h5py.File(path, 'w', libver=('v110', 'v110'))" : "");
  QF_REQUIRE(got == kSuperblockBytes, refused, "truncated HDF5 superblock");
  QF_REQUIRE(sb[9] == 8 && sb[10] == 8, refused, "HDF5 offsets of ", int{sb[9]}, " and lengths of ", int{sb[10]},
             " bytes, qforge writes 8;", why);
  uint32_t stored = 0;
  for (int i = 3; i >= 0; --i) stored = (stored << 8) | sb[kSuperblockBytes - 4 + i];
  QF_REQUIRE(lookup3(sb, kSuperblockBytes - 4) == stored, refused,
             "HDF5 superblock checksum mismatch (a corrupted or crafted file)");
  const uint64_t base = le64(sb + 12), root = le64(sb + 36);
  QF_REQUIRE(base == 0, refused, "HDF5 base address ", base, ", qforge writes 0;", why);
  // The root group's object header must be a version 2 header ("OHDR", checksummed).
  uint8_t oh[5] = {};
  in.seekg(static_cast<std::streamoff>(root));
  in.read(reinterpret_cast<char*>(oh), sizeof oh);
  QF_REQUIRE(in.gcount() == 5, refused, "the root group's object header at ", root,
             " lies past the end of the file (truncated or corrupted)");
  QF_REQUIRE(std::memcmp(oh, "OHDR", 4) == 0 && oh[4] == 2, refused,
             "the root group's object header is not a version 2 (checksummed) header;", why);
}

}  // namespace internal

FileStamp file_stamp(const std::string& path) {
  struct stat st {};
  FileStamp stamp;
  if (::stat(path.c_str(), &st) != 0) return stamp;
  stamp.exists = true;
  stamp.dev = static_cast<uint64_t>(st.st_dev);
  stamp.ino = static_cast<uint64_t>(st.st_ino);
  stamp.size = static_cast<uint64_t>(st.st_size);
  stamp.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
  return stamp;
}

void require_unchanged(const std::string& path, const FileStamp& before) {
  QF_REQUIRE(file_stamp(path) == before, "framework/io: ", path,
             " changed while it was read (replaced, or its size or modification time changed): refused; "
             "read it again once nothing writes it");
}

bool reads_in_process() {
#ifdef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
  return true;  // the fuzzer must see a crash inside the library as a crash, not as a refusal
#else
  return g_in_isolated_child;
#endif
}

namespace {

// The child: runs fn with one thread and writes "R<result>" or "E<message>" into `fd`.
[[noreturn]] void run_child(int fd, const std::function<int()>& fn) {
  new (&internal::hdf5_mutex()) std::recursive_mutex();
  g_in_isolated_child = true;
  const struct rlimit no_core {0, 0};
  ::setrlimit(RLIMIT_CORE, &no_core);
  // ATen's lazy thread set-up would otherwise undo the 1 below on its first parallel call.
  at::internal::lazy_init_num_threads();
#ifdef _OPENMP
  omp_set_num_threads(1);  // the parent's OpenMP threads do not exist here: ATen runs inline
#endif
  std::string reply;
  try {
    reply = "R" + std::to_string(fn());
  } catch (const std::exception& e) {
    reply = std::string("E") + e.what();
  } catch (...) {
    reply = "Eunknown exception";
  }
  std::fflush(nullptr);
  for (size_t off = 0; off < reply.size();) {
    const ssize_t n = ::write(fd, reply.data() + off, reply.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    off += static_cast<size_t>(n);
  }
  ::_exit(0);
}

// Reads the child's reply until it closes the pipe; false when `timeout` passed first.
bool read_reply(int fd, std::chrono::milliseconds timeout, std::string& reply) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  char buf[4096];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    struct pollfd p {fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 60'000)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;  // a timeout of this slice: the loop checks the deadline
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return true;
    reply.append(buf, static_cast<size_t>(n));
  }
}

// The child's reply, "R<int>" or "E<message>", as fn's result or its error.
int parse_reply(const std::string& what, const std::string& reply) {
  if (!reply.empty() && reply[0] == 'E') throw Error(reply.substr(1));
  if (reply.size() >= 2 && reply.size() <= 12 && reply[0] == 'R') {
    errno = 0;
    char* end = nullptr;
    const long v = std::strtol(reply.c_str() + 1, &end, 10);
    if (errno == 0 && end == reply.c_str() + reply.size() && v >= INT_MIN && v <= INT_MAX) return static_cast<int>(v);
  }
  throw Error("framework/io: reading " + what + ": the reading process gave a malformed reply (" +
              std::to_string(reply.size()) + " bytes)");
}

// Why a child that sent no reply ended: only a crash signal calls the file corrupted or crafted.
[[noreturn]] void report_child_end(const std::string& what, int status, bool timed_out,
                                   std::chrono::milliseconds timeout, const std::string& library) {
  const std::string reading = "framework/io: reading " + what;
  if (timed_out)
    throw Error(detail::str_cat(reading, " took longer than ", timeout.count() / 1000.0,
                                " s; the reading process was killed (a file that makes ", library, " loop?)"));
  if (!WIFSIGNALED(status))
    throw Error(detail::str_cat(reading, ": the reading process stopped with exit status ", WEXITSTATUS(status),
                                " without a result"));
  const int sig = WTERMSIG(status);
  switch (sig) {
    case SIGPIPE:
    case SIGINT:
    case SIGTERM:
    case SIGHUP:
      // Not about the file: the output pipe closed or the user stopped qforge. End as the child did.
      std::fflush(nullptr);
      ::signal(sig, SIG_DFL);
      ::raise(sig);
      break;
    case SIGKILL:
      throw Error(reading + ": the reading process was killed (SIGKILL: out of memory?)");
    case SIGSEGV:
    case SIGBUS:
    case SIGABRT:
    case SIGFPE:
    case SIGILL:
      throw Error(detail::str_cat(reading, " crashed ", library, " (the reading process was killed by ",
                                  signal_name(sig), " (signal ", sig, ")): a corrupted or crafted file; refused"));
    default:
      break;
  }
  throw Error(detail::str_cat(reading, ": the reading process was ended by signal ", sig, " (", strsignal(sig), ")"));
}

}  // namespace

int run_isolated(const std::string& what, const std::function<int()>& fn, std::chrono::milliseconds timeout,
                 const std::string& library) {
  if (reads_in_process()) return fn();
  int pipe_fds[2];
  QF_REQUIRE(::pipe2(pipe_fds, O_CLOEXEC) == 0, "framework/io: cannot create a pipe: ", std::strerror(errno));
  std::fflush(nullptr);  // buffered output is the parent's, not printed twice
  pid_t pid = -1;
  {
    // No other thread is inside HDF5 while forking; the child gets a fresh lock, its own.
    std::lock_guard<std::recursive_mutex> hold(internal::hdf5_mutex());
    pid = ::fork();
    if (pid == 0) {
      ::close(pipe_fds[0]);
      run_child(pipe_fds[1], fn);
    }
  }
  const int fork_errno = errno;
  ::close(pipe_fds[1]);
  if (pid < 0) {
    ::close(pipe_fds[0]);
    QF_REQUIRE(fork_errno == ENOMEM || fork_errno == EAGAIN, "framework/io: cannot fork to read ", what, ": ",
               std::strerror(fork_errno));
    std::fprintf(stderr, "qforge: note: no memory to fork a separate reading process (%s): reading %s in this process\n",
                 std::strerror(fork_errno), what.c_str());
    return fn();
  }
  std::string reply;
  const bool done = read_reply(pipe_fds[0], timeout, reply);
  ::close(pipe_fds[0]);
  if (!done) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (done && WIFEXITED(status) && WEXITSTATUS(status) == 0) return parse_reply(what, reply);
  report_child_end(what, status, !done, timeout, library);
}

}  // namespace qforge::io::h5

// Crash-safe replacement of a file: write everything to a temporary file in the same directory,
// fsync it, rename it over the target and fsync the directory. A process killed at any point
// leaves either the old file or the new one at the target path, never a mix; the temporary file
// of a killed writer stays behind as ".<name>.tmp-<pid>-<n>" and is never read.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace qforge::io {

class AtomicFile {
 public:
  // Chooses a fresh temporary path next to `target`; nothing is created yet.
  explicit AtomicFile(std::string target);
  // Removes the temporary file unless commit() succeeded.
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // Where the writer must put the new content (closed before commit()).
  const std::string& temp_path() const { return temp_; }
  const std::string& target_path() const { return target_; }

  // fsync(temp), rename(temp, target), fsync(directory). Throws qforge::Error naming the paths
  // and errno text on failure; the target is then unchanged.
  void commit();

 private:
  std::string target_;
  std::string temp_;
  bool committed_ = false;
};

// fsync of an existing file or directory; throws qforge::Error naming `path`.
void fsync_path(const std::string& path, bool directory);

// Removes the temporary files killed writers left in `dir` (".<name>.tmp-<pid>-<n>" of a process
// that no longer runs) and returns their names. Files of live writers are left alone.
std::vector<std::string> remove_stale_temporaries(const std::string& dir);

// Replaces `path` with `text` through an AtomicFile: readers see the old or the new file whole.
// Throws qforge::Error naming the path when it cannot be written (the old file is then kept).
void write_text_atomically(const std::string& path, const std::string& text);

// This process's fallback directory `<tmp>/qforge-fallback-XXXXXX`: made by mkdtemp (mode 0700,
// a name no one can plant in advance) on first use and again if it was removed. Throws
// qforge::Error naming it when it is no longer a directory of this user closed to others (a
// symbolic link, another owner, a wider mode).
std::string fallback_dir();

// Where a write that failed late in a run goes instead: `<fallback_dir()>/<name>`. Used so that
// hours of work are not lost to a full disk or a directory that became unwritable after the
// run's start-up checks.
std::string fallback_path(const std::string& path);

// Calls write(path); when it throws, calls write(fallback_path(path)) and returns that path with
// `*reason` set to the first failure's message. Throws qforge::Error naming both failures when
// the fallback fails too. Returns `path` when the first write succeeds.
std::string write_with_fallback(const std::string& path, const std::function<void(const std::string&)>& write,
                                std::string* reason);

}  // namespace qforge::io

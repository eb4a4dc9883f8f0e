// FileSystem: the few file operations the worker's stores need, behind an
// interface so that tests inject an in-memory one (testing/
// memory_file_system.h) and a store never touches the disk in unit tests.
// Errors name the path and the cause.
//
// Thread-safety: implementations are thread-safe.
#ifndef APAPO_WORKER_FILE_SYSTEM_H_
#define APAPO_WORKER_FILE_SYSTEM_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace apapo::worker {

class FileSystem {
 public:
  virtual ~FileSystem() = default;
  // Creates `dir` (and missing parents); OK if it exists.
  virtual absl::Status CreateDir(const std::string& dir) = 0;
  // Names of the entries of `dir`, files and directories (no "." or "..");
  // empty if it is missing.
  virtual absl::StatusOr<std::vector<std::string>> List(
      const std::string& dir) = 0;
  // Writes `path` with `bytes`: to "<path>.tmp", then renamed over `path`,
  // so a reader sees the old or the new content, never a part. The local
  // implementation fsyncs the file before the rename and the directory
  // after it, so the same holds after a crash.
  virtual absl::Status WriteAtomically(const std::string& path,
                                       absl::string_view bytes) = 0;
  virtual absl::StatusOr<std::string> Read(const std::string& path) = 0;
  // Removes a file or an empty directory; OK if `path` is already gone.
  virtual absl::Status Remove(const std::string& path) = 0;
};

// The process's real file system (POSIX). Never destroyed.
FileSystem* LocalFileSystem();

}  // namespace apapo::worker

#endif  // APAPO_WORKER_FILE_SYSTEM_H_

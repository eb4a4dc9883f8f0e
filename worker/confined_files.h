// Opening the files a job spec names without leaving the data roots, at the
// moment of the open.
//
// The daemon checks a spec's paths on its disk before it runs anything
// (common/spec_paths: CheckSpecPathsOnDisk), but a check by name and a
// later open by name are two lookups: whoever can write under a data root
// could swap in a symlink to /etc/shadow in between. So the processes that
// read data, TorchScript and checkpoints (the stage and profiling children,
// and `--local --confine_to`) check the object they open, not its name:
// the path (lexically under a root) is resolved once by the kernel into an
// O_PATH descriptor (openat2 with RESOLVE_NO_MAGICLINKS: nothing is opened
// yet, so no device or FIFO is touched); that descriptor's real path must
// lie under a root and its type must be a regular file (or a directory);
// only then is the same inode opened for I/O, through /proc/self/fd. Data,
// TorchScript and checkpoint files are then read and written through the
// descriptor. Checkpoint files are created, renamed and removed relative
// to a directory descriptor checked the same way, never following a
// symlink as the last component. Symlinks that stay under the roots
// (absolute or relative, from one root into another) work as before.
//
// Unconfined (ConfineToDataRoots never called, as in unit tests and tools)
// these open paths as given.
//
// Thread-safety: ConfineToDataRoots once at process start, before any
// thread opens files; the rest is thread-safe.
#ifndef APAPO_WORKER_CONFINED_FILES_H_
#define APAPO_WORKER_CONFINED_FILES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace apapo::worker {

// A file descriptor, closed on destruction.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd();

  int get() const { return fd_; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_ = -1;
};

// From now on, this process opens spec paths beneath `roots` only
// (absolute, as ParseDataRoots returns them).
void ConfineToDataRoots(std::vector<std::string> roots);
// The roots in force; empty when unconfined.
const std::vector<std::string>& ConfinedDataRoots();

// Opens the regular file `path` for reading. Confined: as above.
// PERMISSION_DENIED naming the path when it is outside the roots or
// resolves outside them, NOT_FOUND when missing, INVALID_ARGUMENT when not
// a regular file. `what` names the file in messages ("data file").
// `built_in`: a path of the worker's own defaults (e.g. the default dataset
// directory), not one a spec named: opened as given.
absl::StatusOr<UniqueFd> OpenForReading(const std::string& path,
                                        const std::string& what,
                                        bool built_in = false);
// All of `path` (OpenForReading), at most `max_bytes`
// (RESOURCE_EXHAUSTED beyond).
absl::StatusOr<std::string> ReadFileConfined(const std::string& path,
                                             const std::string& what,
                                             int64_t max_bytes);

// The directory `dir` opened (O_RDONLY | O_DIRECTORY), checked as above;
// with `create`, missing components are created (0750) below the deepest
// existing (checked) ancestor, each relative to its parent's descriptor.
absl::StatusOr<UniqueFd> OpenDirectory(const std::string& dir, bool create);

}  // namespace apapo::worker

#endif  // APAPO_WORKER_CONFINED_FILES_H_

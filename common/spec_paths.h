// The file-system paths a JobSpec names, and the rule they must follow: a
// job reads and writes only under the data roots an operator configured
// (by default Debian's dataset directory and /var/lib/apapo), never through
// "..", never a device, socket or directory where a file is expected.
//
// Checked twice: by the coordinator at submit (CheckSpecPaths, lexically:
// it cannot see the workers' disks) and by each worker daemon before it
// runs anything (CheckSpecPathsOnDisk: symlinks resolved, file types
// checked). Both return INVALID_ARGUMENT naming the field, e.g.
// "spec.data.text.path: /etc/passwd is outside the data roots
// (/usr/share/datasets, /var/lib/apapo)".
//
// Thread-safety: pure functions (CheckSpecPathsOnDisk reads the file
// system).
#ifndef APAPO_COMMON_SPEC_PATHS_H_
#define APAPO_COMMON_SPEC_PATHS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/apapo/v1/job.pb.h"

namespace apapo {

// Debian's dataset directory and APapo's state directory.
const std::vector<std::string>& DefaultDataRoots();

// Parses a comma-separated list of absolute directories (a flag's value).
// INVALID_ARGUMENT naming `flag` for a relative or empty entry.
absl::StatusOr<std::vector<std::string>> ParseDataRoots(const std::string& list,
                                                        const std::string& flag);

struct SpecPath {
  std::string field;  // "spec.data.text.path"
  std::string path;
  bool directory = false;  // a directory (else a regular file)
  bool writable = false;   // the job writes there (may not exist yet)
};

// Every path `spec` names that is set (empty fields mean built-in defaults).
std::vector<SpecPath> PathsInSpec(const apapo::v1::JobSpec& spec);

// Absolute, no "." or ".." component, no NUL, at most 4096 bytes, and
// lexically under one of `roots`.
absl::Status CheckSpecPaths(const apapo::v1::JobSpec& spec,
                            const std::vector<std::string>& roots);

// CheckSpecPaths, then on this machine: every path resolved through its
// symlinks still under a root; files exist and are regular files;
// directories read exist and are directories; a directory written, if
// missing, has an existing parent under a root.
absl::Status CheckSpecPathsOnDisk(const apapo::v1::JobSpec& spec,
                                  const std::vector<std::string>& roots);

}  // namespace apapo

#endif  // APAPO_COMMON_SPEC_PATHS_H_

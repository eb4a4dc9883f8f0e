// Where this process's cgroups are, as files: the folders of a controller's
// hierarchy (cgroup v1's, where a hierarchy mounts the controller; v2's
// unified one) from the process's own cgroup up to the mount, which the
// limits of a container or a systemd slice are read from (cores.h: the CPU
// quota; memory.h: the memory headroom). A limit anywhere on that path
// binds the process.
//
// The cgroup a process is in (/proc/self/cgroup) is a path within the
// hierarchy, and a mount (/proc/self/mountinfo) shows the hierarchy from
// some root down: the host's "/" at /sys/fs/cgroup, a container's own
// cgroup there without a cgroup namespace, or "/" again inside one. The
// folder is the mount point plus the path below the mount's root.
//
// Thread-safety: pure functions; ThisProcessCgroupFolders and
// ReadCgroupFile read /proc and /sys.
#ifndef APAPO_WORKER_DAEMON_CGROUP_H_
#define APAPO_WORKER_DAEMON_CGROUP_H_

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace apapo::worker {

struct CgroupFolder {
  std::string path;  // e.g. "/sys/fs/cgroup/kubepods/pod1"
  bool v2 = false;   // the unified hierarchy (cpu.max, memory.max)
};

// The folders holding `controller` ("cpu", "memory") for the process whose
// /proc/self/mountinfo and /proc/self/cgroup read as given, nearest first,
// over every v1 hierarchy mounting it and the v2 one (whose files for the
// controller exist where it is enabled). A cgroup outside a mount's root
// (another namespace's view) or one climbing out of it ("..") gives that
// mount's point alone.
std::vector<CgroupFolder> CgroupFolders(absl::string_view mountinfo,
                                        absl::string_view proc_cgroup,
                                        absl::string_view controller);

// The same for this process.
std::vector<CgroupFolder> ThisProcessCgroupFolders(absl::string_view controller);

// A cgroup file's text (its first 4 KiB); nullopt when it cannot be read.
using CgroupReader = std::function<std::optional<std::string>(const std::string& path)>;
std::optional<std::string> ReadCgroupFile(const std::string& path);

}  // namespace apapo::worker

#endif  // APAPO_WORKER_DAEMON_CGROUP_H_

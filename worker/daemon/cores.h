// Which cores this worker computes on: the machine (its kernel's boot id)
// and the CPUs the process may run on (its affinity mask, which taskset,
// systemd's CPUAffinity= and a container's cpuset all set). Daemons that
// report the same set share those cores; the coordinator tells the planner
// (WorkerInfo.core_set).
//
// It also reads the CPU time the process's cgroups allow (a container's
// CPU limit: cgroup v2's cpu.max, v1's cpu.cfs_quota_us over
// cpu.cfs_period_us), which no affinity mask shows: a Kubernetes pod
// limited to 2 CPUs on a 64-core node sees all 64 in its mask.
//
// Thread-safety: pure functions; ThisProcessCores and ThisProcessCpuQuota
// read /proc and /sys/fs/cgroup.
#ifndef APAPO_WORKER_DAEMON_CORES_H_
#define APAPO_WORKER_DAEMON_CORES_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "worker/daemon/cgroup.h"

namespace apapo::worker {

struct CoreSet {
  std::string id;  // "<boot id>/<cpu list>"; empty when unknown
  int size = 0;    // CPUs in the list
};

// This process's cores; {"", 0} when the boot id or the mask cannot be read.
CoreSet ThisProcessCores();

// The kernel's list form of ascending CPU numbers: {0, 1, 2, 5} -> "0-2,5".
std::string FormatCpuList(const std::vector<int>& cpus);

// The set from a boot id (as read, trailing newline allowed) and CPU
// numbers; {"", 0} when the boot id is empty or not a plain token (only
// letters, digits and '-' are kept), or no CPU is given.
CoreSet MakeCoreSet(absl::string_view boot_id, std::vector<int> cpus);

// The cores' worth of CPU time this process's cgroups allow per period
// (quota / period), the smallest limit on the way from its cgroup up to
// the hierarchy's root, over cgroup v1's cpu controller and v2 alike;
// 0 when no limit is set or none can be read.
double ThisProcessCpuQuota();

// The same over `folders` (CgroupFolders(..., "cpu")), each file read
// through `read`. A limit's file that is missing, unreadable or malformed
// counts as no limit at its level.
double CpuQuota(const std::vector<CgroupFolder>& folders, const CgroupReader& read);

// One cgroup file's limit in cores: v2's cpu.max ("QUOTA PERIOD" or
// "max PERIOD"), or v1's quota and period (microseconds; -1: none).
// 0 for no limit or malformed text.
double ParseCpuMax(absl::string_view cpu_max);
double ParseCfsQuota(absl::string_view quota_us, absl::string_view period_us);

}  // namespace apapo::worker

#endif  // APAPO_WORKER_DAEMON_CORES_H_

// Which cores this worker computes on: the machine (its kernel's boot id)
// and the CPUs the process may run on (its affinity mask, which taskset,
// systemd's CPUAffinity= and a container's cpuset all set). Daemons that
// report the same set share those cores; the coordinator tells the planner
// (WorkerInfo.core_set).
//
// Thread-safety: pure functions; ThisProcessCores reads /proc.
#ifndef APAPO_WORKER_DAEMON_CORES_H_
#define APAPO_WORKER_DAEMON_CORES_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

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

}  // namespace apapo::worker

#endif  // APAPO_WORKER_DAEMON_CORES_H_

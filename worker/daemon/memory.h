// How much memory this worker may still use: the host's MemAvailable,
// bounded by the cgroup limits of this process and its ancestors (v2's
// memory.max, v1's memory.limit_in_bytes), so a worker in a container or a
// systemd slice with MemoryMax= reports what it can really hold, not the
// host's memory.
//
// Thread-safety: pure functions; AvailableMemoryBytes reads /proc and /sys.
#ifndef APAPO_WORKER_DAEMON_MEMORY_H_
#define APAPO_WORKER_DAEMON_MEMORY_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "worker/daemon/cgroup.h"

namespace apapo::worker {

// Bytes available to this process; 0 if nothing can be read.
int64_t AvailableMemoryBytes();

// MemAvailable of a /proc/meminfo text, bytes; nullopt if absent.
std::optional<int64_t> ParseMemAvailable(absl::string_view meminfo);

// The smallest (limit - usage) over `folders` (CgroupFolders(...,
// "memory")), each file read through `read`: v2's memory.max and
// memory.current, v1's memory.limit_in_bytes and memory.usage_in_bytes (a
// v1 limit of 2^62 bytes or more is v1's "none"), the usage less the
// inactive page cache of memory.stat (what the kernel reclaims first; v2's
// inactive_file, v1's total_inactive_file); nullopt when no level sets a
// limit.
std::optional<int64_t> CgroupHeadroom(const std::vector<CgroupFolder>& folders,
                                      const CgroupReader& read);

}  // namespace apapo::worker

#endif  // APAPO_WORKER_DAEMON_MEMORY_H_

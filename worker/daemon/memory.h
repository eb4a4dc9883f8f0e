// How much memory this worker may still use: the host's MemAvailable,
// bounded by the cgroup (v2) limits of this process and its ancestors, so a
// worker in a container or a systemd slice with MemoryMax= reports what it
// can really hold, not the host's memory.
//
// Thread-safety: pure functions; AvailableMemoryBytes reads /proc and /sys.
#ifndef APAPO_WORKER_DAEMON_MEMORY_H_
#define APAPO_WORKER_DAEMON_MEMORY_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace apapo::worker {

// Bytes available to this process; 0 if nothing can be read.
int64_t AvailableMemoryBytes();

// MemAvailable of a /proc/meminfo text, bytes; nullopt if absent.
std::optional<int64_t> ParseMemAvailable(absl::string_view meminfo);

// The smallest (memory.max - memory.current) over the cgroup v2 path named
// in a /proc/self/cgroup text ("0::/a/b") and its ancestors, each read
// through `read` ("/a/b/memory.max" relative to the cgroup root); nullopt
// when no level sets a limit.
std::optional<int64_t> CgroupHeadroom(
    absl::string_view proc_self_cgroup,
    const std::function<std::optional<std::string>(const std::string&)>& read);

}  // namespace apapo::worker

#endif  // APAPO_WORKER_DAEMON_MEMORY_H_

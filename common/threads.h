// How many compute threads fit a worker's CPUs and its cgroups' CPU quota
// (a container's CPU limit). The worker's stage processes compute with
// this many, and the coordinator's core-sharing model counts the same.
//
// Thread-safety: pure function.
#ifndef APAPO_COMMON_THREADS_H_
#define APAPO_COMMON_THREADS_H_

#include <algorithm>
#include <cmath>

namespace apapo {

// `wanted` threads (at least 1) on a quota of `quota` cores (0: none):
// at most the quota's whole cores, and at least 1. More threads than the
// quota has cores are throttled together every period, whatever the CPUs:
// a 2-CPU limit with 64 threads runs each period's quota in a 32nd of it
// and then stalls.
inline int ThreadsWithin(int wanted, double quota) {
  int threads = std::max(1, wanted);
  if (quota > 0 && std::isfinite(quota)) {
    threads = std::min(threads, std::max(1, static_cast<int>(std::floor(quota + 1e-9))));
  }
  return threads;
}

}  // namespace apapo

#endif  // APAPO_COMMON_THREADS_H_

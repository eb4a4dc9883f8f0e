// What the fleet simulator's workers report instead of measuring, and the
// job the fleet benchmark and test submit to them: a synthetic-data mlp run
// data-parallel over exactly the requested workers, so that every reserved
// worker is profiled, assigned and started (a pipeline plan may leave some
// out and release them).
//
// Thread-safety: stateless functions, safe to call concurrently.
#ifndef APAPO_BENCH_FLEET_CANNED_H_
#define APAPO_BENCH_FLEET_CANNED_H_

#include <string>
#include <vector>

#include "proto/apapo/v1/job.pb.h"
#include "proto/apapo/v1/profile.pb.h"

namespace apapo::bench {

// A plausible profile of the spec's model as the real worker's profiler
// would shape it (worker/model_graph.cc's mlp: input, fc1, relu1, ...,
// fc<layers+1>, loss), at the spec's batch size, with costs computed from
// the layer sizes at a nominal CPU speed instead of measured. Any model
// other than a built-in mlp is profiled as the default mlp.
apapo::v1::ModelProfile CannedProfile(const apapo::v1::JobSpec& spec);

// One link per neighbour: from `peers[rank]` to the next rank (ring order),
// at a plausible loopback bandwidth and latency. Empty for one peer.
std::vector<apapo::v1::LinkMeasurement> CannedLinks(
    const std::vector<std::string>& peers, int rank);

// A valid spec: mlp (hidden 256, 2 layers) on synthetic 784-feature data,
// data-parallel over `workers` replicas of 4 samples each, 10 steps.
apapo::v1::JobSpec DataParallelJobSpec(const std::string& name, int workers);

}  // namespace apapo::bench

#endif  // APAPO_BENCH_FLEET_CANNED_H_

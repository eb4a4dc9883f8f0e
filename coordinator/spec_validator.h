// Validation of a submitted JobSpec.
//
// ValidateJobSpec checks every field a job needs before it is queued and
// returns INVALID_ARGUMENT whose message lists each problem as
// "<field path>: <reason>" (e.g. "spec.schedule.micro_batches: must be >= 1,
// got 0"), separated by "; ". It is a pure function: thread-safe, no I/O.
#ifndef APAPO_COORDINATOR_SPEC_VALIDATOR_H_
#define APAPO_COORDINATOR_SPEC_VALIDATOR_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "proto/apapo/v1/job.pb.h"

namespace apapo::coordinator {

// Names of the built-in models a worker can build.
const std::vector<std::string>& BuiltinModelNames();

// OK, or INVALID_ARGUMENT naming every invalid field of `spec`.
absl::Status ValidateJobSpec(const apapo::v1::JobSpec& spec);

// Micro-batches per mini-batch as the spec sets them; 0 when unset (the
// planner then picks schedule::DefaultMicroBatches for its schedule).
int EffectiveMicroBatches(const apapo::v1::JobSpec& spec);

}  // namespace apapo::coordinator

#endif  // APAPO_COORDINATOR_SPEC_VALIDATOR_H_

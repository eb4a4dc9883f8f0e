// Chrome trace-event JSON (chrome://tracing, ui.perfetto.dev) of a job's
// GetTraceResponse: one process per measured stage replica ("stage S
// replica R", labelled "measured") and, after them, one per simulated
// stage replica ("simulated stage S replica R", labelled "simulated"); one
// thread each, whose spans ("X" events: name = the span kind, ts and dur in
// microseconds, args micro_batch and step) never overlap.
//
// Clocks: every measured stage's spans are relative to the start of its own
// window (its first recorded op) on its host's monotonic clock, so each
// process starts at 0 and offsets between processes are not a measured
// skew; the simulated timeline starts at 0 as well.
//
// Thread-safety: stateless.
#ifndef APAPO_CLI_CHROME_TRACE_H_
#define APAPO_CLI_CHROME_TRACE_H_

#include <string>

#include "absl/strings/string_view.h"
#include "proto/apapo/v1/metrics.pb.h"
#include "proto/apapo/v1/service.pb.h"

namespace apapo::cli {

// "forward", "backward", "send", "recv", "all-reduce", "optimizer", "flush".
absl::string_view SpanKindName(apapo::v1::SpanKind kind);

// Measured processes have pids 1.., simulated ones kSimulatedPidBase + 1...
inline constexpr int kSimulatedPidBase = 1000;

std::string ChromeTraceJson(const apapo::v1::GetTraceResponse& trace);

}  // namespace apapo::cli

#endif  // APAPO_CLI_CHROME_TRACE_H_

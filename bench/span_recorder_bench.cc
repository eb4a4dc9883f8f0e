// What recording a stage's op spans costs per op (worker/span_recorder.h):
// a Begin/End pair inside the trace window and outside it. Prints one line;
// the executor's ops take 10 us to seconds.
//
//   bazel run -c opt //bench:span_recorder_bench
#include <chrono>
#include <cstdio>

#include "worker/span_recorder.h"

int main() {
  using apapo::worker::SpanRecorder;
  using apapo::worker::TraceOptions;
  using Clock = std::chrono::steady_clock;
  constexpr int kOps = 2000000;
  TraceOptions on;
  on.warmup_steps = 0;
  on.steps = 1;
  on.max_spans = kOps;
  SpanRecorder recording(on, 0);
  SpanRecorder outside(on, 0);
  const auto t0 = Clock::now();
  for (int i = 0; i < kOps; ++i) {
    recording.Begin(apapo::v1::SPAN_KIND_FORWARD, i, 0);
    recording.End();
  }
  const auto t1 = Clock::now();
  for (int i = 0; i < kOps; ++i) {
    outside.Begin(apapo::v1::SPAN_KIND_FORWARD, i, /*step=*/5);
    outside.End();
  }
  const auto t2 = Clock::now();
  const double in_ns = std::chrono::duration<double, std::nano>(t1 - t0).count() / kOps;
  const double off_ns = std::chrono::duration<double, std::nano>(t2 - t1).count() / kOps;
  std::printf("span recorder: %.1f ns per recorded op, %.2f ns per op outside the window "
              "(%zu spans kept)\n",
              in_ns, off_ns, recording.size());
  return recording.size() == static_cast<size_t>(kOps) && outside.empty() ? 0 : 1;
}

// SpanRecorder: a stage replica's measured timeline over a window of its run
// (apapo.v1.StageTrace): the executor brackets each op with Begin/End, and
// the recorder keeps the spans whose step falls in [first_step, end_step)
// in a buffer reserved up front (at most `max_spans`; the rest are counted
// as dropped). Times are std::chrono::steady_clock, relative to the first
// span recorded (the window's start), so they say nothing about another
// host's clock.
//
// Cost: outside the window Begin() is one comparison and End() one branch;
// inside, two steady_clock reads and a store into the reserved buffer (no
// allocation). span_recorder_test measures it.
//
// Thread-safety: not thread-safe (the executor's compute thread).
#ifndef APAPO_WORKER_SPAN_RECORDER_H_
#define APAPO_WORKER_SPAN_RECORDER_H_

#include <chrono>
#include <cstdint>
#include <vector>

#include "proto/apapo/v1/metrics.pb.h"

namespace apapo::worker {

struct TraceOptions {
  // Steps of warm-up before the window (after the step a run resumed from):
  // the steps a run's throughput leaves out (kRateWarmupSteps in
  // stage_observer.h; stage_executor.cc asserts the two agree), so the
  // window shows the steady state the planner's simulator predicts.
  int64_t warmup_steps = 10;
  // Steps the window covers; 0 turns recording off.
  int64_t steps = 5;
  // Spans kept at most (each ~40 bytes; the default's trace is ~160 KB,
  // far below gRPC's 4 MiB message limit).
  int64_t max_spans = 4096;
};

class SpanRecorder {
 public:
  using Clock = std::chrono::steady_clock;

  // Records the steps [first_step, first_step + options.steps).
  SpanRecorder(const TraceOptions& options, int64_t first_step);

  // Whether a span beginning at `step` is recorded.
  bool Active(int64_t step) const {
    return step >= first_step_ && step < end_step_ && !done_;
  }
  // Starts a span (a no-op outside the window); End() closes it.
  void Begin(apapo::v1::SpanKind kind, int64_t micro_batch, int64_t step) {
    if (!Active(step)) return;
    open_ = true;
    open_span_ = {kind, micro_batch, step, Clock::now()};
  }
  // Closes the open span, if any, at now.
  void End() {
    if (!open_) return;
    Close(Clock::now());
  }
  // Ends the open span's first part as a span of `first_kind` (a receive
  // wait at the start of a forward or backward) and goes on with the open
  // span's own kind from now: spans of one thread never overlap.
  void Split(apapo::v1::SpanKind first_kind);

  // The window is over once `steps_done` reaches its end.
  bool Complete(int64_t steps_done) const {
    return steps_done >= end_step_ && !done_ && size_ > 0;
  }
  bool empty() const { return size_ == 0; }
  // The spans so far as a StageTrace (stage/replica/rank left for the
  // caller) and stops recording: one trace per window.
  apapo::v1::StageTrace Take();

  int64_t size() const { return size_; }
  int64_t dropped() const { return dropped_; }

 private:
  struct Span {
    apapo::v1::SpanKind kind;
    int64_t micro_batch;
    int64_t step;
    Clock::time_point start;
    Clock::time_point end;
  };
  struct Open {
    apapo::v1::SpanKind kind;
    int64_t micro_batch;
    int64_t step;
    Clock::time_point start;
  };
  void Close(Clock::time_point end);

  const int64_t first_step_;
  const int64_t end_step_;
  const int64_t max_spans_;
  std::vector<Span> spans_;  // reserved to max_spans_
  int64_t size_ = 0;
  int64_t dropped_ = 0;
  bool open_ = false;
  bool done_ = false;
  Open open_span_{};
};

}  // namespace apapo::worker

#endif  // APAPO_WORKER_SPAN_RECORDER_H_

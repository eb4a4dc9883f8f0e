#include "worker/span_recorder.h"

#include <algorithm>

namespace apapo::worker {

SpanRecorder::SpanRecorder(const TraceOptions& options, int64_t first_step)
    : first_step_(first_step + std::max<int64_t>(0, options.warmup_steps)),
      end_step_(options.steps > 0 && options.max_spans > 0
                    ? first_step_ + options.steps
                    : first_step_),
      max_spans_(std::max<int64_t>(0, options.max_spans)) {
  if (end_step_ > first_step_) spans_.resize(max_spans_);
}

void SpanRecorder::Close(Clock::time_point end) {
  open_ = false;
  if (size_ >= max_spans_) {
    ++dropped_;
    return;
  }
  spans_[size_++] = {open_span_.kind, open_span_.micro_batch, open_span_.step,
                     open_span_.start, end};
}

void SpanRecorder::Split(apapo::v1::SpanKind first_kind) {
  if (!open_) return;
  const Clock::time_point now = Clock::now();
  const Open was = open_span_;
  open_span_.kind = first_kind;
  Close(now);
  open_ = true;
  open_span_ = {was.kind, was.micro_batch, was.step, now};
}

apapo::v1::StageTrace SpanRecorder::Take() {
  apapo::v1::StageTrace trace;
  trace.set_first_step(first_step_);
  trace.set_end_step(end_step_);
  trace.set_dropped_spans(dropped_);
  done_ = true;
  open_ = false;
  if (size_ == 0) return trace;
  const Clock::time_point origin = spans_[0].start;
  trace.mutable_spans()->Reserve(static_cast<int>(size_));
  for (int64_t i = 0; i < size_; ++i) {
    const Span& s = spans_[i];
    apapo::v1::TraceSpan* out = trace.add_spans();
    out->set_kind(s.kind);
    out->set_micro_batch(s.micro_batch);
    out->set_step(s.step);
    out->set_start_ns(
        std::chrono::duration_cast<std::chrono::nanoseconds>(s.start - origin)
            .count());
    out->set_duration_ns(
        std::chrono::duration_cast<std::chrono::nanoseconds>(s.end - s.start)
            .count());
  }
  spans_.clear();
  spans_.shrink_to_fit();
  size_ = 0;
  return trace;
}

}  // namespace apapo::worker

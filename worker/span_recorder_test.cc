#include "worker/span_recorder.h"

#include "gtest/gtest.h"

namespace apapo::worker {
namespace {

using apapo::v1::SpanKind;

TEST(SpanRecorderTest, RecordsOnlyTheWindowInOrderWithKinds) {
  TraceOptions options;
  options.warmup_steps = 1;
  options.steps = 2;
  SpanRecorder r(options, /*first_step=*/10);  // window: steps 11, 12
  for (int64_t step = 10; step < 15; ++step) {
    if (step < 13) EXPECT_FALSE(r.Complete(step));
    r.Begin(apapo::v1::SPAN_KIND_FORWARD, step, step);
    r.Split(apapo::v1::SPAN_KIND_RECV);
    r.End();
    r.Begin(apapo::v1::SPAN_KIND_BACKWARD, step, step);
    r.End();
    r.Begin(apapo::v1::SPAN_KIND_OPTIMIZER, -1, step);
    r.End();
  }
  EXPECT_TRUE(r.Complete(13));
  apapo::v1::StageTrace t = r.Take();
  EXPECT_FALSE(r.Complete(13));  // one trace per window
  EXPECT_EQ(t.first_step(), 11);
  EXPECT_EQ(t.end_step(), 13);
  ASSERT_EQ(t.spans_size(), 8);
  const SpanKind kinds[] = {
      apapo::v1::SPAN_KIND_RECV, apapo::v1::SPAN_KIND_FORWARD,
      apapo::v1::SPAN_KIND_BACKWARD, apapo::v1::SPAN_KIND_OPTIMIZER};
  EXPECT_EQ(t.spans(0).start_ns(), 0);
  int64_t previous_end = 0;
  for (int i = 0; i < t.spans_size(); ++i) {
    const auto& s = t.spans(i);
    EXPECT_EQ(s.kind(), kinds[i % 4]) << i;
    EXPECT_EQ(s.step(), 11 + i / 4) << i;
    EXPECT_GE(s.duration_ns(), 0);
    EXPECT_GE(s.start_ns(), previous_end) << "spans overlap at " << i;
    previous_end = s.start_ns() + s.duration_ns();
  }
  EXPECT_EQ(t.spans(3).micro_batch(), -1);
  EXPECT_EQ(t.spans(0).micro_batch(), 11);
}

TEST(SpanRecorderTest, BoundedBufferCountsDropped) {
  TraceOptions options;
  options.warmup_steps = 0;
  options.steps = 1;
  options.max_spans = 5;
  SpanRecorder r(options, 0);
  for (int i = 0; i < 12; ++i) {
    r.Begin(apapo::v1::SPAN_KIND_SEND, i, 0);
    r.End();
  }
  EXPECT_EQ(r.size(), 5);
  EXPECT_EQ(r.dropped(), 7);
  apapo::v1::StageTrace t = r.Take();
  EXPECT_EQ(t.spans_size(), 5);
  EXPECT_EQ(t.dropped_spans(), 7);
  EXPECT_EQ(t.spans(4).micro_batch(), 4);
}

TEST(SpanRecorderTest, OffRecordsNothingAndAllocatesNothing) {
  TraceOptions options;
  options.steps = 0;
  SpanRecorder r(options, 0);
  for (int64_t step = 0; step < 100; ++step) {
    EXPECT_FALSE(r.Active(step));
    r.Begin(apapo::v1::SPAN_KIND_FORWARD, 0, step);
    r.End();
  }
  EXPECT_TRUE(r.empty());
  EXPECT_FALSE(r.Complete(1000));
}

// The recorder records past the window's bound only as a count, and costs
// nothing measurable outside it: see bench/span_recorder_bench.cc for the
// per-op figures.
TEST(SpanRecorderTest, ManyOpsInTheWindowAndNoneOutsideIt) {
  constexpr int kOps = 200000;
  TraceOptions on;
  on.warmup_steps = 0;
  on.steps = 1;
  on.max_spans = kOps;
  SpanRecorder recording(on, 0);
  SpanRecorder outside(on, 0);
  for (int i = 0; i < kOps; ++i) {
    recording.Begin(apapo::v1::SPAN_KIND_FORWARD, i, 0);
    recording.End();
    outside.Begin(apapo::v1::SPAN_KIND_FORWARD, i, /*step=*/5);
    outside.End();
  }
  EXPECT_EQ(recording.size(), kOps);
  EXPECT_TRUE(outside.empty());
}

}  // namespace
}  // namespace apapo::worker

namespace apapo::worker {
namespace {

// A full default buffer, with the largest field values a long run gives,
// fits a MetricsReport far below gRPC's 4 MiB limit.
TEST(SpanRecorderTest, FullDefaultTraceFitsOneMessage) {
  TraceOptions options;
  SpanRecorder r(options, /*first_step=*/int64_t{1} << 40);
  const int64_t step = (int64_t{1} << 40) + options.warmup_steps;
  for (int64_t i = 0; i < options.max_spans + 10; ++i) {
    r.Begin(apapo::v1::SPAN_KIND_ALL_REDUCE, int64_t{1} << 50, step);
    r.End();
  }
  apapo::v1::MetricsReport m;
  m.set_job_id("job-000001");
  *m.mutable_trace() = r.Take();
  m.mutable_trace()->set_worker_id(std::string(256, 'w'));
  EXPECT_EQ(m.trace().spans_size(), options.max_spans);
  EXPECT_EQ(m.trace().dropped_spans(), 10);
  EXPECT_LT(m.ByteSizeLong(), 1u << 20) << m.ByteSizeLong();
}

}  // namespace
}  // namespace apapo::worker

#include "planning/simulated_trace.h"

#include <cstdio>
#include <string>
#include <tuple>

#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"

namespace apapo::planning {
namespace {

apapo::v1::GetPlanResponse TwoStages() {
  apapo::v1::GetPlanResponse r;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(
      R"pb(
        plan {
          schedule: SCHEDULE_KIND_ASYNC
          micro_batches: 2
          stages {
            index: 0 node_ids: "a" replicas: 1
            placement { worker_id: "w-1" rank: 0 }
          }
          stages {
            index: 1 node_ids: "b" replicas: 1
            placement { worker_id: "w-2" rank: 1 }
          }
        }
        profile {
          model: "m"
          batch_size: 8
          nodes { id: "a" forward_seconds: 0.002 backward_seconds: 0.004
                  activation_bytes: 1000 parameter_bytes: 100 }
          nodes { id: "b" inputs: "a" forward_seconds: 0.001
                  backward_seconds: 0.002 activation_bytes: 10 }
        }
        cluster {
          workers { worker_id: "w-1" }
          workers { worker_id: "w-2" }
        }
      )pb",
      &r));
  return r;
}

// Makes `r`'s cluster two hosts of two workers (w-3 and w-4 added), fast
// (`inner` B/s) inside a host and `outer` between them.
void TwoHostsOfTwo(double inner, double outer, apapo::v1::GetPlanResponse* r) {
  r->mutable_cluster()->add_workers()->set_worker_id("w-3");
  r->mutable_cluster()->add_workers()->set_worker_id("w-4");
  for (double bandwidth : {inner, outer}) {
    auto* level = r->mutable_cluster()->add_levels();
    level->set_group_size(2);
    level->set_bandwidth_bytes_per_second(bandwidth);
  }
}

// Makes `r`'s plan data parallelism: one stage of both nodes, replicated
// on w-1 and w-2, its backward split or not; returns that stage.
apapo::v1::Stage* DataParallelOnTwo(bool split_backward, apapo::v1::GetPlanResponse* r) {
  apapo::v1::Plan* plan = r->mutable_plan();
  plan->set_schedule(apapo::v1::SCHEDULE_KIND_DATA_PARALLEL);
  plan->set_split_backward(split_backward);
  plan->clear_stages();
  auto* st = plan->add_stages();
  st->add_node_ids("a");
  st->add_node_ids("b");
  st->set_replicas(2);
  for (int w = 0; w < 2; ++w) {
    auto* p = st->add_placement();
    p->set_worker_id("w-" + std::to_string(w + 1));
    p->set_rank(w);
  }
  return st;
}

// Makes DataParallelOnTwo's stage replicated on all four workers of
// TwoHostsOfTwo, one micro-batch each.
void OnAllFour(apapo::v1::Stage* st, apapo::v1::Plan* plan) {
  st->set_replicas(4);
  plan->set_micro_batches(4);
  for (int w = 2; w < 4; ++w) {
    auto* p = st->add_placement();
    p->set_worker_id("w-" + std::to_string(w + 1));
    p->set_rank(w);
  }
}

TEST(SimulatedTraceTest, OneTracePerStageReplicaFromZeroPerMicroBatch) {
  auto traces = SimulatedTrace(TwoStages(), 3);
  ASSERT_TRUE(traces.ok()) << traces.status();
  ASSERT_EQ(traces->size(), 2u);
  int64_t earliest = -1;
  for (int s = 0; s < 2; ++s) {
    const apapo::v1::StageTrace& t = (*traces)[s];
    EXPECT_EQ(t.stage(), s);
    int forwards = 0, optimizers = 0;
    int64_t end = 0;
    for (const auto& span : t.spans()) {
      EXPECT_GE(span.start_ns(), end) << "overlap on stage " << s;
      end = span.start_ns() + span.duration_ns();
      if (span.kind() == apapo::v1::SPAN_KIND_FORWARD) {
        ++forwards;
        // Per micro-batch: the profile's per mini-batch figure / m.
        EXPECT_EQ(span.duration_ns(), s == 0 ? 1000000 : 500000);
      }
      if (span.kind() == apapo::v1::SPAN_KIND_OPTIMIZER) ++optimizers;
    }
    EXPECT_EQ(forwards, 3 * 2);
    EXPECT_EQ(optimizers, 3);
    if (earliest < 0 || t.spans(0).start_ns() < earliest) earliest = t.spans(0).start_ns();
  }
  EXPECT_EQ(earliest, 0);
}

// Async, stage 0 the bottleneck at 6 ms a mini-batch of 8: 1333 samples/s;
// on a profile whose stage 0 computes twice as long, half of that.
TEST(SimulatedTraceTest, TheRateIsTheBottleneckStagesOnTheGivenProfile) {
  apapo::v1::GetPlanResponse r = TwoStages();
  absl::StatusOr<double> rate = SimulatedSamplesPerSecond(r);
  ASSERT_TRUE(rate.ok()) << rate.status();
  EXPECT_NEAR(*rate, 8 / 0.006, 8 / 0.006 * 0.01);
  r.mutable_profile()->mutable_nodes(0)->set_forward_seconds(0.004);
  r.mutable_profile()->mutable_nodes(0)->set_backward_seconds(0.008);
  rate = SimulatedSamplesPerSecond(r);
  ASSERT_TRUE(rate.ok()) << rate.status();
  EXPECT_NEAR(*rate, 8 / 0.012, 8 / 0.012 * 0.01);
  r.mutable_profile()->clear_batch_size();
  EXPECT_EQ(SimulatedSamplesPerSecond(r).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// With weight prediction, stage 0 (not the last) updates for the
// profile's update_prediction_seconds more: its 2 ms update becomes 3 ms,
// and at 7 ms a mini-batch it binds at 8 / 0.007. The last stage, whose
// gradients are not delayed, and a plan without prediction do not.
TEST(SimulatedTraceTest, AStageThatPredictsItsWeightsUpdatesLonger) {
  apapo::v1::GetPlanResponse r = TwoStages();
  r.mutable_profile()->set_update_seconds(0.002);  // all stage 0's (a's bytes)
  r.mutable_profile()->set_update_prediction_seconds(0.001);
  auto optimizer_ns = [](const apapo::v1::StageTrace& t) {
    for (const auto& span : t.spans()) {
      if (span.kind() == apapo::v1::SPAN_KIND_OPTIMIZER) return span.duration_ns();
    }
    return int64_t{-1};
  };
  auto stashing = SimulatedTrace(r, 3);
  ASSERT_TRUE(stashing.ok()) << stashing.status();
  EXPECT_EQ(optimizer_ns((*stashing)[0]), 2000000);
  absl::StatusOr<double> rate = SimulatedSamplesPerSecond(r);
  ASSERT_TRUE(rate.ok()) << rate.status();
  EXPECT_NEAR(*rate, 8 / 0.006, 8 / 0.006 * 0.01);

  r.mutable_plan()->set_weight_prediction(true);
  auto predicting = SimulatedTrace(r, 3);
  ASSERT_TRUE(predicting.ok()) << predicting.status();
  EXPECT_EQ(optimizer_ns((*predicting)[0]), 3000000);
  EXPECT_EQ(optimizer_ns((*predicting)[1]), 0);  // b holds no parameters
  rate = SimulatedSamplesPerSecond(r);
  ASSERT_TRUE(rate.ok()) << rate.status();
  EXPECT_NEAR(*rate, 8 / 0.007, 8 / 0.007 * 0.01);
}

// A slow link (50 kB/s: 10 ms each way for a micro-batch's 500 bytes)
// binds the pipeline. A 400-byte token bucket on it passes most of each
// transfer at once while the link idles, so stage 0's micro-batches come
// back sooner; but over time the link carries no more than its rate, 500
// bytes a micro-batch each 10 ms: at most 8 samples per 20 ms.
TEST(SimulatedTraceTest, ALinksTokenBucketShortensItsTransfersButNotItsRate) {
  apapo::v1::GetPlanResponse r = TwoStages();
  auto* level = r.mutable_cluster()->add_levels();
  level->set_group_size(2);
  level->set_bandwidth_bytes_per_second(50e3);
  absl::StatusOr<double> wire = SimulatedSamplesPerSecond(r);
  ASSERT_TRUE(wire.ok()) << wire.status();
  level->set_burst_bytes(400);
  absl::StatusOr<double> bucket = SimulatedSamplesPerSecond(r);
  ASSERT_TRUE(bucket.ok()) << bucket.status();
  EXPECT_GT(*bucket, 1.1 * *wire);
  EXPECT_LE(*bucket, 1.01 * 8 / 0.020);
  std::printf("wire %.1f, bucket %.1f samples/s\n", *wire, *bucket);
}

// Two hosts of two workers (group_path order: w-1, w-2 on one): 1 MB/s
// inside a host, 50 kB/s between. The two stages on one host's workers
// compute-bound at 8 per 6 ms; on workers of different hosts the slow link
// binds them, as it does the planner's prediction of that placement.
TEST(SimulatedTraceTest, EachStagesLinkIsTheLevelBetweenItsWorkers) {
  apapo::v1::GetPlanResponse r = TwoStages();
  TwoHostsOfTwo(1e6, 50e3, &r);
  absl::StatusOr<double> near = SimulatedSamplesPerSecond(r);
  ASSERT_TRUE(near.ok()) << near.status();
  EXPECT_NEAR(*near, 8 / 0.006, 8 / 0.006 * 0.01);
  r.mutable_plan()->mutable_stages(1)->mutable_placement(0)->set_worker_id("w-3");
  absl::StatusOr<double> far = SimulatedSamplesPerSecond(r);
  ASSERT_TRUE(far.ok()) << far.status();
  // 500 bytes a micro-batch each way at 50 kB/s: 10 ms; at most 8 per 20 ms.
  EXPECT_LE(*far, 1.01 * 8 / 0.020);
  EXPECT_LT(*far, 0.5 * *near);
  std::printf("same host %.1f, across hosts %.1f samples/s\n", *near, *far);
}

// A data-parallel plan on two workers of one host, in a 2 x 2 cluster
// whose profile timed its all-reduce over all four across the slow link:
// simulated as the planner weighed it (SubCluster), without that
// measurement; on all four, with it.
TEST(SimulatedTraceTest, AnAllReduceTimedOverMoreWorkersThanThePlanUsesIsNotCharged) {
  apapo::v1::GetPlanResponse r = TwoStages();
  apapo::v1::Plan* plan = r.mutable_plan();
  apapo::v1::Stage* st = DataParallelOnTwo(/*split_backward=*/false, &r);
  r.mutable_profile()->mutable_nodes(0)->set_parameter_bytes(1e6);
  TwoHostsOfTwo(1e9, 1e6, &r);
  auto* link = r.mutable_cluster()->add_links();  // what the factors read
  link->set_from_worker("w-1");
  link->set_to_worker("w-3");
  link->set_bandwidth_bytes_per_second(1e6);
  absl::StatusOr<double> unmeasured = SimulatedSamplesPerSecond(r);
  ASSERT_TRUE(unmeasured.ok()) << unmeasured.status();
  // Four ranks, 1 MB over the 1 MB/s link: 1.5 s as the ring has it, and
  // 6 s measured (a factor of 4 on every all-reduce).
  auto* a = r.mutable_cluster()->add_allreduces();
  a->set_ranks(4);
  a->set_bytes(1000000);
  a->set_seconds(6.0);
  absl::StatusOr<double> two = SimulatedSamplesPerSecond(r);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_DOUBLE_EQ(*two, *unmeasured);
  // With the plan on all four the measurement stands.
  OnAllFour(st, plan);
  absl::StatusOr<double> four = SimulatedSamplesPerSecond(r);
  r.mutable_cluster()->clear_allreduces();
  absl::StatusOr<double> four_unmeasured = SimulatedSamplesPerSecond(r);
  ASSERT_TRUE(four.ok()) << four.status();
  ASSERT_TRUE(four_unmeasured.ok()) << four_unmeasured.status();
  EXPECT_LT(*four, 0.5 * *four_unmeasured);
}

// The same two workers of one host, whose profile timed their all-reduce
// among themselves too (AllReduceMeasurement.worker_ids): charged that,
// 4x the ring over their link; the plan on all four is charged the
// four-worker one alone.
TEST(SimulatedTraceTest, AnAllReduceTimedInsideAHostIsChargedToReplicasThere) {
  apapo::v1::GetPlanResponse r = TwoStages();
  apapo::v1::Plan* plan = r.mutable_plan();
  apapo::v1::Stage* st = DataParallelOnTwo(/*split_backward=*/false, &r);
  r.mutable_profile()->mutable_nodes(0)->set_parameter_bytes(1e6);
  TwoHostsOfTwo(1e6, 1e5, &r);
  for (const auto& [from, to, bandwidth] :
       {std::make_tuple("w-1", "w-2", 1e6), std::make_tuple("w-1", "w-3", 1e5)}) {
    auto* link = r.mutable_cluster()->add_links();
    link->set_from_worker(from);
    link->set_to_worker(to);
    link->set_bandwidth_bytes_per_second(bandwidth);
  }
  auto* all = r.mutable_cluster()->add_allreduces();
  all->set_ranks(4);
  all->set_bytes(1000000);
  all->set_seconds(15.0);  // 1 MB over 4 ranks at 0.1 MB/s: the ring's time
  absl::StatusOr<double> ring = SimulatedSamplesPerSecond(r);
  ASSERT_TRUE(ring.ok()) << ring.status();
  // 1 MB over 2 ranks at 1 MB/s: 1 s as the ring has it, 4 s timed.
  auto* host = r.mutable_cluster()->add_allreduces();
  host->set_ranks(2);
  host->set_bytes(1000000);
  host->set_seconds(4.0);
  host->add_worker_ids("w-1");
  host->add_worker_ids("w-2");
  absl::StatusOr<double> timed = SimulatedSamplesPerSecond(r);
  ASSERT_TRUE(timed.ok()) << timed.status();
  EXPECT_LT(*timed, 0.5 * *ring);
  // All four: the host's measurement is not theirs.
  OnAllFour(st, plan);
  absl::StatusOr<double> four = SimulatedSamplesPerSecond(r);
  r.mutable_cluster()->mutable_allreduces()->RemoveLast();
  absl::StatusOr<double> four_without = SimulatedSamplesPerSecond(r);
  ASSERT_TRUE(four.ok()) << four.status();
  ASSERT_TRUE(four_without.ok()) << four_without.status();
  EXPECT_DOUBLE_EQ(*four, *four_without);
}

// A data-parallel plan whose all-reduce runs in parts during the backward
// hides part of it behind the weight gradients; one that runs it after the
// backward (Plan.allreduce_after_backward) waits for all of it, as a plan
// without a split backward does.
TEST(SimulatedTraceTest, AnAllReduceAfterTheBackwardHidesNothing) {
  apapo::v1::GetPlanResponse r = TwoStages();
  apapo::v1::Plan* plan = r.mutable_plan();
  DataParallelOnTwo(/*split_backward=*/true, &r);
  for (auto& n : *r.mutable_profile()->mutable_nodes()) {
    n.set_parameter_bytes(1e6);
    n.set_weight_gradients_after_send(true);
  }
  // 2 MB of parameters over 100 MB/s: a 20 ms ring against 3 ms of
  // backward a replica.
  auto* level = r.mutable_cluster()->add_levels();
  level->set_group_size(2);
  level->set_bandwidth_bytes_per_second(1e8);
  absl::StatusOr<double> parts = SimulatedSamplesPerSecond(r);
  plan->set_allreduce_after_backward(true);
  absl::StatusOr<double> after = SimulatedSamplesPerSecond(r);
  plan->set_allreduce_after_backward(false);
  plan->set_split_backward(false);
  absl::StatusOr<double> one_pass = SimulatedSamplesPerSecond(r);
  ASSERT_TRUE(parts.ok() && after.ok() && one_pass.ok());
  EXPECT_GT(*parts, 1.05 * *after);
  EXPECT_DOUBLE_EQ(*after, *one_pass);
  // 4.5 ms of compute a replica (update and all), then the 20 ms ring.
  EXPECT_NEAR(*after, 8 / (0.0045 + 0.020), 8 / 0.0245 * 0.02);
}

TEST(SimulatedTraceTest, TheMeasuredCopiesLengthenEveryStagesPasses) {
  apapo::v1::GetPlanResponse r = TwoStages();
  // 1 us per byte (the median of the positive figures; the unmeasured 0
  // does not count): 500 B per micro-batch cross the cut, so each pass of
  // both stages takes 0.5 ms longer.
  for (double cpu : {1e-6, 0.0, 5e-6, 1e-6}) {
    auto* link = r.mutable_cluster()->add_links();
    link->set_from_worker("w-1");
    link->set_to_worker("w-2");
    link->set_bandwidth_bytes_per_second(1e9);
    link->set_cpu_seconds_per_byte(cpu);
  }
  auto traces = SimulatedTrace(r, 3);
  ASSERT_TRUE(traces.ok()) << traces.status();
  ASSERT_EQ(traces->size(), 2u);
  for (int s = 0; s < 2; ++s) {
    int checked = 0;
    for (const auto& span : (*traces)[s].spans()) {
      if (span.kind() == apapo::v1::SPAN_KIND_FORWARD) {
        EXPECT_EQ(span.duration_ns(), s == 0 ? 1500000 : 1000000);
        ++checked;
      } else if (span.kind() == apapo::v1::SPAN_KIND_BACKWARD) {
        EXPECT_EQ(span.duration_ns(), s == 0 ? 2500000 : 1500000);
        ++checked;
      }
    }
    EXPECT_EQ(checked, 2 * 3 * 2) << "stage " << s;
  }
}

TEST(SimulatedTraceTest, BFloat16TransfersCopyHalfTheBytes) {
  apapo::v1::GetPlanResponse r = TwoStages();
  r.mutable_plan()->set_transfer_precision(apapo::v1::TRANSFER_PRECISION_BFLOAT16);
  auto* link = r.mutable_cluster()->add_links();
  link->set_from_worker("w-1");
  link->set_to_worker("w-2");
  link->set_bandwidth_bytes_per_second(1e9);
  link->set_cpu_seconds_per_byte(1e-6);
  auto traces = SimulatedTrace(r, 3);
  ASSERT_TRUE(traces.ok()) << traces.status();
  // 250 B per micro-batch on the wire (500 in float32): 0.25 ms a pass.
  int checked = 0;
  for (const auto& span : (*traces)[0].spans()) {
    if (span.kind() == apapo::v1::SPAN_KIND_FORWARD) {
      EXPECT_EQ(span.duration_ns(), 1250000);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 3 * 2);
}

TEST(SimulatedTraceTest, PlanOfAnotherModelIsFailedPrecondition) {
  apapo::v1::GetPlanResponse r = TwoStages();
  r.mutable_plan()->mutable_stages(1)->set_node_ids(0, "zzz");
  auto traces = SimulatedTrace(r, 3);
  EXPECT_EQ(traces.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(traces.status().message().find("zzz"), std::string::npos);
}

}  // namespace
}  // namespace apapo::planning

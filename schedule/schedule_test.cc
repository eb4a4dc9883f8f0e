#include "schedule/schedule.h"

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace apapo {
namespace schedule {
namespace {

// The compute ops of a program (the schedule proper).
std::vector<std::string> Program(const ScheduleOptions& options, int stage,
                                 int replica = 0) {
  absl::StatusOr<StageProgram> program =
      StageProgram::Create(options, stage, replica);
  EXPECT_TRUE(program.ok()) << program.status();
  std::vector<std::string> ops;
  Op op;
  while (program.ok() && program->Next(&op)) {
    if (op.IsCompute()) ops.push_back(op.ToString());
  }
  return ops;
}

// Every op, transfers included.
std::vector<std::string> FullProgram(absl::StatusOr<StageProgram> program) {
  EXPECT_TRUE(program.ok()) << program.status();
  std::vector<std::string> ops;
  Op op;
  while (program.ok() && program->Next(&op)) ops.push_back(op.ToString());
  return ops;
}

ScheduleOptions Options(ScheduleKind kind, int p, int m, int64_t iterations) {
  ScheduleOptions options;
  options.kind = kind;
  options.num_stages = p;
  options.micro_batches_per_iteration = m;
  options.num_iterations = iterations;
  return options;
}

TEST(ScheduleKindTest, ParsesAndPrintsEveryName) {
  for (const char* name : {"async", "2bw", "gpipe", "1f1b_flush", "dp"}) {
    absl::StatusOr<ScheduleKind> kind = ParseScheduleKind(name);
    ASSERT_TRUE(kind.ok()) << name;
    EXPECT_EQ(ScheduleKindName(*kind), name);
  }
  EXPECT_FALSE(ParseScheduleKind("pipedream").ok());
}

TEST(DefaultMicroBatchesTest, PerScheduleAndDividingTheBatch) {
  // Async fills the pipeline with later iterations: whole mini-batches.
  EXPECT_EQ(DefaultMicroBatches(ScheduleKind::kAsync, {1, 1}, 128), 1);
  // One micro-batch per replica at least.
  EXPECT_EQ(DefaultMicroBatches(ScheduleKind::kAsync, {2}, 128), 2);
  EXPECT_EQ(DefaultMicroBatches(ScheduleKind::kDataParallel, {2}, 128), 2);
  // Flush schedules: 4 x stages.
  EXPECT_EQ(DefaultMicroBatches(ScheduleKind::kGPipe, {1, 1}, 128), 8);
  EXPECT_EQ(DefaultMicroBatches(ScheduleKind::k1F1BFlush, {1, 1, 1}, 0), 12);
  // 2BW: stage 0 of 3 keeps 3 in flight.
  EXPECT_EQ(DefaultMicroBatches(ScheduleKind::k2BW, {1, 1, 1}, 0), 3);
  // Rounded up to a divisor of the batch; kept when none is large enough.
  EXPECT_EQ(DefaultMicroBatches(ScheduleKind::kGPipe, {1, 1}, 90), 9);
  EXPECT_EQ(DefaultMicroBatches(ScheduleKind::kDataParallel, {3}, 2), 3);
  // The result is always a valid schedule for those replicas.
  ScheduleOptions o = Options(ScheduleKind::k2BW, 3, 0, 1);
  o.micro_batches_per_iteration =
      DefaultMicroBatches(o.kind, {1, 1, 1}, 128);
  EXPECT_TRUE(ValidateScheduleOptions(o).ok()) << ValidateScheduleOptions(o);
}

TEST(StageProgramTest, AsyncWarmsUpThenAlternatesWithoutFlush) {
  // p = 3, m = 1 (update after every micro-batch, as PipeDream), 5 iterations.
  const ScheduleOptions options = Options(ScheduleKind::kAsync, 3, 1, 5);
  EXPECT_EQ(Program(options, 0),
            (std::vector<std::string>{"F0@v0", "F1@v0", "F2@v0", "B0@v0",
                                      "U0->v1", "F3@v1", "B1@v0", "U1->v2",
                                      "F4@v2", "B2@v0", "U2->v3", "B3@v1",
                                      "U3->v4", "B4@v2", "U4->v5"}));
  EXPECT_EQ(Program(options, 2),
            (std::vector<std::string>{"F0@v0", "B0@v0", "U0->v1", "F1@v1",
                                      "B1@v1", "U1->v2", "F2@v2", "B2@v2",
                                      "U2->v3", "F3@v3", "B3@v3", "U3->v4",
                                      "F4@v4", "B4@v4", "U4->v5"}));
}

TEST(StageProgramTest, AsyncAccumulatesOverAnIteration) {
  // m = 2: one update per two micro-batches; iteration 1 enters before 0 drains.
  const ScheduleOptions options = Options(ScheduleKind::kAsync, 2, 2, 2);
  EXPECT_EQ(Program(options, 0),
            (std::vector<std::string>{"F0@v0", "F1@v0", "B0@v0", "F2@v0",
                                      "B1@v0", "U1->v1", "F3@v1", "B2@v0",
                                      "B3@v1", "U3->v2"}));
}

TEST(StageProgramTest, GPipeFlushesEveryIteration) {
  const ScheduleOptions options = Options(ScheduleKind::kGPipe, 2, 3, 2);
  EXPECT_EQ(Program(options, 1),
            (std::vector<std::string>{"F0@v0", "F1@v0", "F2@v0", "B0@v0",
                                      "B1@v0", "B2@v0", "U2->v1", "F3@v1",
                                      "F4@v1", "F5@v1", "B3@v1", "B4@v1",
                                      "B5@v1", "U5->v2"}));
}

TEST(StageProgramTest, OneFOneBFlushWarmsUpPerIteration) {
  const ScheduleOptions options = Options(ScheduleKind::k1F1BFlush, 3, 4, 1);
  EXPECT_EQ(Program(options, 0),
            (std::vector<std::string>{"F0@v0", "F1@v0", "F2@v0", "B0@v0",
                                      "F3@v0", "B1@v0", "B2@v0", "B3@v0",
                                      "U3->v1"}));
  EXPECT_EQ(Program(options, 1),
            (std::vector<std::string>{"F0@v0", "F1@v0", "B0@v0", "F2@v0",
                                      "B1@v0", "F3@v0", "B2@v0", "B3@v0",
                                      "U3->v1"}));
}

TEST(StageProgramTest, TwoBWUsesThePreviousVersionPerIteration) {
  const ScheduleOptions options = Options(ScheduleKind::k2BW, 2, 2, 3);
  EXPECT_EQ(Program(options, 0),
            (std::vector<std::string>{"F0@v0", "F1@v0", "B0@v0", "F2@v0",
                                      "B1@v0", "U1->v1", "F3@v0", "B2@v0",
                                      "F4@v1", "B3@v0", "U3->v2", "F5@v1",
                                      "B4@v1", "B5@v1", "U5->v3"}));
}

TEST(StageProgramTest, ReplicasTakeMicroBatchesRoundRobin) {
  ScheduleOptions options = Options(ScheduleKind::kAsync, 2, 2, 2);
  options.replicas = {2, 1};
  // Stage 0 depth = ceil((2 + 1) / 2) = 2 per replica.
  EXPECT_EQ(InFlightDepth(options, 0), 2);
  std::vector<std::string> ops = Program(options, 0, 1);
  EXPECT_EQ(ops, (std::vector<std::string>{"F1@v0", "F3@v0", "B1@v0",
                                           "U1->v1", "B3@v0", "U3->v2"}));
}

TEST(StageProgramTest, UnevenReplicasStillUpdateOncePerIteration) {
  // m = 1 with 2 replicas: replica 1 has micro-batches only in odd
  // iterations but all-reduces (with zeros) in every one.
  ScheduleOptions options = Options(ScheduleKind::kAsync, 2, 1, 4);
  options.replicas = {2, 1};
  EXPECT_EQ(Program(options, 0, 1),
            (std::vector<std::string>{"F1@v0", "F3@v0", "U0->v1", "B1@v0",
                                      "U1->v2", "U2->v3", "B3@v0",
                                      "U3->v4"}));
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1BFlush}) {
    ScheduleOptions flush = Options(kind, 2, 3, 2);
    flush.replicas = {2, 1};
    std::vector<std::string> ops = Program(flush, 0, 1);
    EXPECT_EQ(ops.size(), 3u * 2 + 2) << ScheduleKindName(kind);  // F,B x3 + U x2
  }
}

TEST(StageProgramTest, BackwardAlwaysUsesItsForwardsVersion) {
  for (ScheduleKind kind :
       {ScheduleKind::kAsync, ScheduleKind::k2BW, ScheduleKind::kGPipe,
        ScheduleKind::k1F1BFlush}) {
    for (int p : {1, 2, 5}) {
      for (int m : {5, 8}) {
        ScheduleOptions options = Options(kind, p, m, 4);
        for (int s = 0; s < p; ++s) {
          absl::StatusOr<StageProgram> program =
              StageProgram::Create(options, s, 0);
          ASSERT_TRUE(program.ok()) << program.status();
          std::vector<int64_t> forward_version(4 * m, -1);
          int64_t updates = 0;
          int forwards = 0, backwards = 0;
          Op op;
          while (program->Next(&op)) {
            if (!op.IsCompute()) continue;
            if (op.type == Op::kForward) {
              EXPECT_LE(op.weight_version, updates);
              forward_version[op.micro_batch] = op.weight_version;
              ++forwards;
            } else if (op.type == Op::kBackward) {
              EXPECT_EQ(forward_version[op.micro_batch], op.weight_version);
              ++backwards;
            } else {
              EXPECT_EQ(op.weight_version, ++updates);
            }
          }
          EXPECT_EQ(forwards, 4 * m);
          EXPECT_EQ(backwards, 4 * m);
          EXPECT_EQ(updates, 4);
        }
      }
    }
  }
}

TEST(AnalyzeStageTest, MatchesClosedForms) {
  const int p = 6;
  for (int s = 0; s < p; ++s) {
    // PipeDream async, update per micro-batch: p-s versions, p-s-1 stale.
    absl::StatusOr<StageScheduleStats> async =
        AnalyzeStage(Options(ScheduleKind::kAsync, p, 1, 1), s);
    ASSERT_TRUE(async.ok());
    EXPECT_EQ(async->weight_versions, p - s);
    EXPECT_EQ(async->max_staleness, p - s - 1);
    EXPECT_EQ(async->max_activations_in_flight, p - s);
    // 2BW: two versions, staleness 1 (m >= p).
    absl::StatusOr<StageScheduleStats> two_bw =
        AnalyzeStage(Options(ScheduleKind::k2BW, p, 8, 1), s);
    ASSERT_TRUE(two_bw.ok());
    EXPECT_EQ(two_bw->weight_versions, 2);
    EXPECT_EQ(two_bw->max_staleness, 1);
    // 1F1B-flush: p-s activations, one version, no staleness.
    absl::StatusOr<StageScheduleStats> flush =
        AnalyzeStage(Options(ScheduleKind::k1F1BFlush, p, 8, 1), s);
    ASSERT_TRUE(flush.ok());
    EXPECT_EQ(flush->weight_versions, 1);
    EXPECT_EQ(flush->max_staleness, 0);
    EXPECT_EQ(flush->max_activations_in_flight, p - s);
    // GPipe keeps all m.
    absl::StatusOr<StageScheduleStats> gpipe =
        AnalyzeStage(Options(ScheduleKind::kGPipe, p, 8, 1), s);
    ASSERT_TRUE(gpipe.ok());
    EXPECT_EQ(gpipe->max_activations_in_flight, 8);
    EXPECT_EQ(gpipe->max_staleness, 0);
  }
}

TEST(AnalyzeStageTest, MaxInFlightBoundsStaleness) {
  ScheduleOptions options = Options(ScheduleKind::kAsync, 8, 1, 1);
  options.max_in_flight = 3;
  absl::StatusOr<StageScheduleStats> stats = AnalyzeStage(options, 0);
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->max_activations_in_flight, 3);
  EXPECT_EQ(stats->max_staleness, 2);
  EXPECT_EQ(stats->weight_versions, 3);
}

TEST(AnalyzeStageTest, MicroBatchesKeepMoreInFlightAtTheSameStaleness) {
  // A replica running k micro-batches of each mini-batch with d in flight
  // computes on weights ceil((d - 1) / k) updates old, and
  // MaxInFlightForStaleness gives the deepest d within a bound.
  for (int m : {1, 2, 4}) {
    for (int d = 1; d <= 9; ++d) {
      ScheduleOptions options = Options(ScheduleKind::kAsync, 2, m, 16);
      options.in_flight_depth = {d, 0};
      absl::StatusOr<StageScheduleStats> stats = AnalyzeStage(options, 0);
      ASSERT_TRUE(stats.ok()) << stats.status();
      EXPECT_EQ(stats->max_activations_in_flight, d) << "m=" << m << " d=" << d;
      EXPECT_EQ(stats->max_staleness, (d - 1 + m - 1) / m)
          << "m=" << m << " d=" << d;
      EXPECT_EQ(StalenessAtDepth(d, m), stats->max_staleness)
          << "m=" << m << " d=" << d;
    }
    for (int staleness = 0; staleness <= 3; ++staleness) {
      const int bound = MaxInFlightForStaleness(staleness, m, {1, 1});
      EXPECT_EQ(bound, staleness * m + 1);
      ScheduleOptions options = Options(ScheduleKind::kAsync, 2, m, 16);
      options.in_flight_depth = {bound, 0};
      EXPECT_EQ(AnalyzeStage(options, 0)->max_staleness, staleness);
      options.in_flight_depth = {bound + 1, 0};
      EXPECT_EQ(AnalyzeStage(options, 0)->max_staleness, staleness + 1);
    }
  }
  // Replicas share a mini-batch's micro-batches: 4 over 2 replicas are 2
  // each, and 2 over 2 leave one each, as whole mini-batches do.
  EXPECT_EQ(MaxInFlightForStaleness(1, 4, {2, 1}), 3);
  EXPECT_EQ(MaxInFlightForStaleness(1, 2, {2, 2}), 2);
  EXPECT_EQ(MaxInFlightForStaleness(-1, 4, {}), 0);
  EXPECT_EQ(MicroBatchesPerReplica(4, {2, 1}), 2);
  EXPECT_EQ(MicroBatchesPerReplica(1, {2, 2}), 1);  // never below one
  EXPECT_EQ(MicroBatchesPerReplica(8, {}), 8);
}

TEST(AnalyzeStageTest, AnAsyncStageCanRunDeeperThanTheDefault) {
  // Two stages: NOAM gives stage 0 two micro-batches in flight; asked for
  // four it stashes four versions and its gradients are three updates stale,
  // and the last stage keeps its default.
  ScheduleOptions options = Options(ScheduleKind::kAsync, 2, 1, 16);
  options.in_flight_depth = {4, 0};
  EXPECT_EQ(InFlightDepth(options, 0), 4);
  EXPECT_EQ(InFlightDepth(options, 1), 1);
  absl::StatusOr<StageScheduleStats> stats = AnalyzeStage(options, 0);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->max_activations_in_flight, 4);
  EXPECT_EQ(stats->max_staleness, 3);
  EXPECT_EQ(stats->weight_versions, 4);
  // The program warms up with four forwards before the first backward.
  absl::StatusOr<StageProgram> program = StageProgram::Create(options, 0, 0);
  ASSERT_TRUE(program.ok());
  std::vector<Op::Type> compute;
  Op op;
  while (program->Next(&op) && compute.size() < 6) {
    if (op.type == Op::kForward || op.type == Op::kBackward) {
      compute.push_back(op.type);
    }
  }
  EXPECT_EQ(compute, (std::vector<Op::Type>{Op::kForward, Op::kForward,
                                            Op::kForward, Op::kForward,
                                            Op::kBackward, Op::kForward}));
  // max_in_flight still bounds it.
  options.max_in_flight = 3;
  EXPECT_EQ(InFlightDepth(options, 0), 3);
}

TEST(ValidateScheduleOptionsTest, InFlightDepthIsPerStageAndAsyncOnly) {
  ScheduleOptions options = Options(ScheduleKind::kAsync, 2, 1, 1);
  options.in_flight_depth = {3};
  EXPECT_THAT(ValidateScheduleOptions(options).message(),
              testing::HasSubstr("in_flight_depth has 1 entries for 2 stages"));
  options.in_flight_depth = {-1, 0};
  EXPECT_THAT(ValidateScheduleOptions(options).message(),
              testing::HasSubstr("in_flight_depth[0] = -1: must be >= 0"));
  options = Options(ScheduleKind::k1F1BFlush, 2, 4, 1);
  options.in_flight_depth = {3, 0};
  EXPECT_THAT(ValidateScheduleOptions(options).message(),
              testing::HasSubstr("only the async schedule takes one"));
  options.in_flight_depth = {0, 0};
  EXPECT_TRUE(ValidateScheduleOptions(options).ok());
}

TEST(ValidateScheduleOptionsTest, RejectsBadShapes) {
  ScheduleOptions options = Options(ScheduleKind::kAsync, 0, 1, 1);
  EXPECT_FALSE(ValidateScheduleOptions(options).ok());
  options = Options(ScheduleKind::kGPipe, 2, 3, 1);
  options.replicas = {4, 1};
  EXPECT_FALSE(ValidateScheduleOptions(options).ok());  // 4 replicas, m = 3
  options = Options(ScheduleKind::k2BW, 4, 2, 1);
  EXPECT_FALSE(ValidateScheduleOptions(options).ok());  // 2bw needs m >= p
  options = Options(ScheduleKind::kDataParallel, 2, 2, 1);
  EXPECT_FALSE(ValidateScheduleOptions(options).ok());
  EXPECT_FALSE(StageProgram::Create(Options(ScheduleKind::kAsync, 2, 1, 1), 2,
                                    0)
                   .ok());
}

TEST(StageProgramTest, TransfersAreOpsOfTheProgram) {
  ScheduleOptions options = Options(ScheduleKind::kAsync, 2, 1, 3);
  options.recv_lookahead = 1;
  // Stage 0: sends activations after each forward; receives gradients,
  // posted one receiving op ahead; drains its sends at the end.
  EXPECT_EQ(FullProgram(StageProgram::Create(options, 0, 0)),
            (std::vector<std::string>{
                "RG0<0", "F0@v0", "SA0>0", "F1@v0", "SA1>0", "B0@v0",
                "RG1<0", "U0->v1", "F2@v1", "SA2>0", "B1@v0", "RG2<0",
                "U1->v2", "B2@v1", "U2->v3", "FL"}));
  // Stage 1 (last): receives activations, sends gradients back.
  EXPECT_EQ(FullProgram(StageProgram::Create(options, 1, 0)),
            (std::vector<std::string>{
                "RA0<0", "F0@v0", "RA1<0", "B0@v0", "SG0>0", "U0->v1",
                "F1@v1", "RA2<0", "B1@v1", "SG1>0", "U1->v2", "F2@v2",
                "B2@v2", "SG2>0", "U2->v3", "FL"}));
}

TEST(StageProgramTest, ReceivesArePostedAheadInTheirSendersOrder) {
  for (int lookahead : {1, 3, 16}) {
    ScheduleOptions options = Options(ScheduleKind::k1F1BFlush, 3, 6, 4);
    options.replicas = {2, 1, 3};
    options.recv_lookahead = lookahead;
    for (int s = 0; s < 3; ++s) {
      for (int r = 0; r < options.Replicas(s); ++r) {
        absl::StatusOr<StageProgram> program = StageProgram::Create(options, s, r);
        ASSERT_TRUE(program.ok());
        std::map<std::pair<int, int>, int64_t> last_posted;  // (kind, peer)
        std::set<int64_t> posted_activations, posted_gradients;
        int outstanding = 0, max_outstanding = 0;
        Op op;
        while (program->Next(&op)) {
          if (op.type == Op::kRecvActivations || op.type == Op::kRecvGradients) {
            const bool activations = op.type == Op::kRecvActivations;
            // From the neighbour's replica j mod R, in increasing j.
            const int neighbour = activations ? s - 1 : s + 1;
            ASSERT_GE(neighbour, 0);
            EXPECT_EQ(op.peer, op.micro_batch % options.Replicas(neighbour));
            auto key = std::make_pair(activations ? 0 : 1, op.peer);
            if (last_posted.count(key)) EXPECT_GT(op.micro_batch, last_posted[key]);
            last_posted[key] = op.micro_batch;
            (activations ? posted_activations : posted_gradients)
                .insert(op.micro_batch);
            max_outstanding = std::max(max_outstanding, ++outstanding);
          } else if (op.type == Op::kForward && s > 0) {
            EXPECT_EQ(posted_activations.erase(op.micro_batch), 1u) << op.ToString();
            --outstanding;
          } else if (op.type == Op::kBackward && s < 2) {
            EXPECT_EQ(posted_gradients.erase(op.micro_batch), 1u) << op.ToString();
            --outstanding;
          }
        }
        EXPECT_TRUE(posted_activations.empty());
        EXPECT_TRUE(posted_gradients.empty());
        EXPECT_LE(max_outstanding, lookahead);
      }
    }
  }
}

TEST(StageProgramTest, ReplicatedStagesAllReduceBeforeEachUpdate) {
  ScheduleOptions options = Options(ScheduleKind::kDataParallel, 1, 2, 2);
  options.replicas = {2};
  EXPECT_EQ(FullProgram(StageProgram::Create(options, 0, 1)),
            (std::vector<std::string>{"F1@v0", "B1@v0", "AR1->v1", "U1->v1",
                                      "F3@v1", "B3@v1", "AR3->v2", "U3->v2"}));
}

TEST(StageProgramTest, EvaluationIsAForwardOnlyProgram) {
  ScheduleOptions options = Options(ScheduleKind::kAsync, 3, 1, 1);
  options.replicas = {1, 2, 1};
  EXPECT_EQ(FullProgram(StageProgram::CreateEvaluation(options, 0, 0, 2)),
            (std::vector<std::string>{"F0@v0", "SA0>0", "F1@v0", "SA1>0", "FL",
                                      "RR"}));
  EXPECT_EQ(FullProgram(StageProgram::CreateEvaluation(options, 1, 0, 2)),
            (std::vector<std::string>{"RA0<0", "RA1<0", "F0@v0", "SA0>0",
                                      "F1@v0", "SA1>0", "FL", "RR"}));
  // Replicas other than 0 only share the result.
  EXPECT_EQ(FullProgram(StageProgram::CreateEvaluation(options, 1, 1, 2)),
            (std::vector<std::string>{"RR"}));
  EXPECT_EQ(FullProgram(StageProgram::CreateEvaluation(options, 2, 0, 2)),
            (std::vector<std::string>{"RA0<0", "RA1<0", "F0@v0", "F1@v0", "RR"}));
  EXPECT_FALSE(StageProgram::CreateEvaluation(options, 0, 0, -1).ok());
}

TEST(ValidateScheduleOptionsTest, RecvLookaheadMustBePositive) {
  ScheduleOptions options = Options(ScheduleKind::kAsync, 2, 1, 1);
  options.recv_lookahead = 0;
  EXPECT_FALSE(ValidateScheduleOptions(options).ok());
}

TEST(RankOfTest, StageMajor) {
  ScheduleOptions options = Options(ScheduleKind::kAsync, 3, 4, 1);
  options.replicas = {2, 1, 3};
  EXPECT_EQ(RankOf(options, 0, 1), 1);
  EXPECT_EQ(RankOf(options, 1, 0), 2);
  EXPECT_EQ(RankOf(options, 2, 2), 5);
}

}  // namespace
}  // namespace schedule
}  // namespace apapo

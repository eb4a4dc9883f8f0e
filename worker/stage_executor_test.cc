// Stage executor tests: pipelines of 2-3 stages run as threads of this
// process, each stage with its own Gloo process group over a TCPStore on a
// free port, and are compared with plain single-process training.

#include "worker/stage_executor.h"

#include <torch/torch.h>

#include <map>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace apapo {
namespace worker {
namespace {

using ::testing::HasSubstr;
using schedule::ScheduleKind;

constexpr int64_t kBatch = 16;

struct Fixture {
  apapo::v1::DataSpec data;
  DataSplit split;
  std::unique_ptr<AnalyzedGraph> graph;
};

Fixture MakeFixture() {
  Fixture f;
  f.data.mutable_synthetic()->add_sample_shape(12);
  f.data.mutable_synthetic()->set_num_classes(4);
  f.data.mutable_synthetic()->set_samples_per_epoch(256);
  auto split = LoadData(f.data, 5);
  EXPECT_TRUE(split.ok());
  f.split = *std::move(split);
  apapo::v1::BuiltinModel mlp;
  mlp.set_name("mlp");
  (*mlp.mutable_hyper_parameters())["hidden"].set_i(10);
  (*mlp.mutable_hyper_parameters())["layers"].set_i(3);
  auto shape = DataShapeForJob(f.data);
  auto g = BuiltinGraph(mlp, *shape);
  auto analysed = AnalyzedGraph::Create(*g);
  EXPECT_TRUE(analysed.ok()) << analysed.status();
  f.graph = std::make_unique<AnalyzedGraph>(*std::move(analysed));
  return f;
}

apapo::v1::OptimizerSpec Sgd() {
  apapo::v1::OptimizerSpec o;
  o.mutable_sgd()->set_momentum(0.9);
  o.set_learning_rate(0.1);
  o.set_weight_decay(1e-3);
  o.mutable_lr_schedule()->set_warmup_steps(2);
  return o;
}

// Plain training of the whole graph on full mini-batches: the reference.
std::map<std::string, at::Tensor> TrainSingleProcess(
    const Fixture& f, const apapo::v1::OptimizerSpec& spec, int64_t steps) {
  std::vector<std::string> all;
  for (const NodeInfo& n : f.graph->nodes()) all.push_back(n.id());
  auto layouts = LayoutStages(*f.graph, {all});
  auto model = StageModel::Create(*f.graph, (*layouts)[0]);
  auto opt = Optimizer::Create(spec, steps);
  std::vector<at::Tensor> params = (*model)->InitParameters(/*seed=*/11);
  const auto order = EpochOrder(f.split.train->size(), 11, 0, true);
  for (int64_t k = 0; k < steps; ++k) {
    at::Tensor x = torch::empty({kBatch, 12});
    at::Tensor y = torch::empty({kBatch}, torch::kLong);
    for (int64_t i = 0; i < kBatch; ++i) {
      f.split.train->Get(order[k * kBatch + i], x[i].data_ptr(),
                         y.data_ptr<int64_t>() + i);
    }
    auto fwd = (*model)->Forward({x, y}, params, true);
    EXPECT_TRUE(fwd.ok());
    auto grads = torch::autograd::grad({fwd->loss}, params);
    params = (*opt)->Step(params, grads, k);
  }
  std::map<std::string, at::Tensor> out;
  for (size_t i = 0; i < params.size(); ++i) {
    out[(*model)->param_names()[i]] = params[i];
  }
  return out;
}

struct PipelineResult {
  std::map<std::string, at::Tensor> params;
  std::vector<StageReport> reports;
  std::vector<absl::Status> statuses;
  std::vector<std::vector<BackwardRecord>> records;
};

// Runs a pipeline with one thread per stage replica.
PipelineResult RunPipeline(const Fixture& f, schedule::ScheduleOptions sched,
                           const apapo::v1::OptimizerSpec& spec, int64_t steps,
                           bool record = false,
                           apapo::v1::CheckpointSpec checkpoint = {}) {
  auto split = BalancedSplit(*f.graph, sched.num_stages);
  EXPECT_TRUE(split.ok());
  auto layouts = LayoutStages(*f.graph, *split);
  EXPECT_TRUE(layouts.ok());
  int world = 0;
  std::vector<std::vector<int>> groups;
  for (int s = 0; s < sched.num_stages; ++s) {
    std::vector<int> g;
    for (int r = 0; r < sched.Replicas(s); ++r) g.push_back(world++);
    groups.push_back(g);
  }
  auto server = StartStoreServer();
  EXPECT_TRUE(server.ok());
  PipelineResult result;
  result.reports.resize(world);
  result.statuses.resize(world);
  result.records.resize(world);
  std::vector<std::vector<std::pair<std::string, at::Tensor>>> params(world);
  std::vector<std::thread> threads;
  for (int s = 0; s < sched.num_stages; ++s) {
    for (int r = 0; r < sched.Replicas(s); ++r) {
      const int rank = StageExecutor::RankOf(sched, s, r);
      threads.emplace_back([&, s, r, rank] {
        GlooTransportOptions t;
        t.store_port = (*server)->port();
        t.rank = rank;
        t.world_size = world;
        t.groups = groups;
        t.timeout = absl::Seconds(60);
        t.label = absl::StrCat("stage ", s);
        auto transport = CreateGlooTransport(t);
        if (!transport.ok()) {
          result.statuses[rank] = transport.status();
          return;
        }
        ExecutorConfig c;
        c.graph = f.graph.get();
        c.layouts = *layouts;
        c.stage = s;
        c.replica = r;
        c.schedule = sched;
        c.batch_size = kBatch;
        c.optimizer = spec;
        c.seed = 11;
        c.epochs = 1;
        c.max_steps = steps;
        c.eval_every_epochs = 0;
        c.record_backwards = record;
        c.checkpoint = checkpoint;
        auto exec = StageExecutor::Create(c, transport->get(),
                                          f.split.train.get(),
                                          f.split.test.get());
        if (!exec.ok()) {
          result.statuses[rank] = exec.status();
          return;
        }
        result.statuses[rank] = (*exec)->Run();
        result.reports[rank] = (*exec)->Report();
        result.records[rank] = (*exec)->backward_records();
        for (size_t i = 0; i < (*exec)->parameters().size(); ++i) {
          params[rank].push_back({(*exec)->parameter_names()[i],
                                  (*exec)->parameters()[i]});
        }
      });
    }
  }
  for (auto& t : threads) t.join();
  for (int s = 0; s < sched.num_stages; ++s) {
    for (int r = 0; r < sched.Replicas(s); ++r) {
      for (auto& [name, p] : params[StageExecutor::RankOf(sched, s, r)]) {
        if (r == 0) {
          result.params[name] = p;
        } else {
          // Replicas hold identical weights after every all-reduced update.
          EXPECT_TRUE(torch::allclose(result.params[name], p, 0, 1e-6)) << name;
        }
      }
    }
  }
  return result;
}

struct EquivalenceCase {
  ScheduleKind kind;
  int stages;
  std::vector<int> replicas;
  int micro_batches;
  bool adam;
};

class EquivalenceTest : public ::testing::TestWithParam<EquivalenceCase> {};

TEST_P(EquivalenceTest, KStepsEqualSingleProcessTraining) {
  const EquivalenceCase& c = GetParam();
  Fixture f = MakeFixture();
  apapo::v1::OptimizerSpec spec = Sgd();
  if (c.adam) {
    spec.mutable_adam();
    spec.set_learning_rate(0.01);
    spec.set_grad_clip_norm(0);
  }
  constexpr int64_t kSteps = 6;
  auto reference = TrainSingleProcess(f, spec, kSteps);
  schedule::ScheduleOptions sched;
  sched.kind = c.kind;
  sched.num_stages = c.stages;
  sched.replicas = c.replicas;
  sched.micro_batches_per_iteration = c.micro_batches;
  PipelineResult got = RunPipeline(f, sched, spec, kSteps);
  for (const auto& s : got.statuses) ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(got.params.size(), reference.size());
  for (const auto& [name, want] : reference) {
    ASSERT_TRUE(got.params.count(name)) << name;
    const double diff = (got.params[name] - want).abs().max().item<double>();
    EXPECT_LE(diff, 1e-5) << name;
  }
  for (const StageReport& r : got.reports) {
    EXPECT_EQ(r.steps, kSteps);
    EXPECT_EQ(r.max_staleness, 0);  // synchronous schedules
  }
}

INSTANTIATE_TEST_SUITE_P(
    Schedules, EquivalenceTest,
    ::testing::Values(
        EquivalenceCase{ScheduleKind::kGPipe, 2, {}, 4, false},
        EquivalenceCase{ScheduleKind::kGPipe, 3, {}, 4, true},
        EquivalenceCase{ScheduleKind::k1F1BFlush, 2, {}, 4, true},
        EquivalenceCase{ScheduleKind::k1F1BFlush, 3, {}, 4, false},
        EquivalenceCase{ScheduleKind::k1F1BFlush, 2, {2, 1}, 4, false},
        EquivalenceCase{ScheduleKind::kDataParallel, 1, {2}, 2, false}),
    [](const ::testing::TestParamInfo<EquivalenceCase>& info) {
      std::string name(schedule::ScheduleKindName(info.param.kind));
      name += absl::StrCat("_", info.param.stages, "stages");
      if (!info.param.replicas.empty()) name += "_replicated";
      if (info.param.adam) name += "_adam";
      return name;
    });

// Weight stashing: under async, a stage-0 backward runs after newer weights
// exist; it must differentiate the version its forward used. The gradients
// it produced are recomputed here from the recorded inputs, received
// gradients and weights: they match the stashed version and not the newest.
TEST(WeightStashingTest, BackwardUsesItsForwardsWeightVersion) {
  Fixture f = MakeFixture();
  schedule::ScheduleOptions sched;
  sched.kind = ScheduleKind::kAsync;
  sched.num_stages = 2;
  sched.micro_batches_per_iteration = 1;
  apapo::v1::OptimizerSpec spec = Sgd();
  spec.set_learning_rate(0.5);
  PipelineResult got = RunPipeline(f, sched, spec, 6, /*record=*/true);
  for (const auto& s : got.statuses) ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(got.reports[0].max_staleness, 1);  // p - s - 1 for s = 0
  EXPECT_EQ(got.reports[1].max_staleness, 0);
  EXPECT_EQ(got.reports[0].max_weight_versions, 2);

  auto split = BalancedSplit(*f.graph, 2);
  auto layouts = LayoutStages(*f.graph, *split);
  auto stage0 = StageModel::Create(*f.graph, (*layouts)[0]);
  ASSERT_TRUE(stage0.ok());
  const auto& records = got.records[0];
  ASSERT_EQ(records.size(), 6u);
  std::map<int64_t, std::vector<at::Tensor>> version_params;
  for (const auto& r : records) version_params[r.forward_version] = r.params;
  auto grads_at = [&](const BackwardRecord& r,
                      const std::vector<at::Tensor>& weights) {
    std::vector<at::Tensor> w;
    for (const auto& p : weights) w.push_back(p.detach().requires_grad_(true));
    auto fwd = (*stage0)->Forward(r.inputs, w, true);
    EXPECT_TRUE(fwd.ok());
    std::vector<at::Tensor> outs, gouts;
    size_t g = 0;
    for (size_t i = 0; i < fwd->outputs.size(); ++i) {
      if (fwd->outputs[i].scalar_type() != torch::kFloat) continue;
      outs.push_back(fwd->outputs[i]);
      gouts.push_back(r.grad_outputs[g++]);
    }
    return torch::autograd::grad(outs, w, gouts);
  };
  int stale = 0;
  for (const auto& r : records) {
    EXPECT_EQ(r.forward_version, r.backward_version);
    auto with_stash = grads_at(r, r.params);
    for (size_t i = 0; i < with_stash.size(); ++i) {
      EXPECT_TRUE(torch::allclose(with_stash[i], r.param_grads[i], 1e-5, 1e-6));
    }
    if (r.newest_version == r.forward_version) continue;
    // The newest version's weights are known if a later forward used them.
    if (!version_params.count(r.newest_version)) continue;
    ++stale;
    auto with_newest = grads_at(r, version_params[r.newest_version]);
    bool differs = false;
    for (size_t i = 0; i < with_newest.size(); ++i) {
      differs |= !torch::allclose(with_newest[i], r.param_grads[i], 1e-5, 1e-6);
    }
    EXPECT_TRUE(differs) << "micro-batch " << r.micro_batch;
  }
  EXPECT_GE(stale, 3);  // backwards after the first update are stale
}

// A synchronous run stopped after a checkpoint and resumed ends bit-for-bit
// where an uninterrupted run with the same checkpoints ends.
TEST(CheckpointTest, ResumedRunMatchesUninterruptedRun) {
  Fixture f = MakeFixture();
  schedule::ScheduleOptions sched;
  sched.kind = ScheduleKind::k1F1BFlush;
  sched.num_stages = 2;
  sched.micro_batches_per_iteration = 4;
  apapo::v1::OptimizerSpec spec = Sgd();
  spec.mutable_adam();  // optimizer state must survive the restart
  spec.set_learning_rate(0.01);
  apapo::v1::CheckpointSpec ck;
  ck.set_every_steps(3);
  ck.set_resume(true);
  ck.set_directory(::testing::TempDir() + "/ckpt_full");
  PipelineResult full = RunPipeline(f, sched, spec, 6, false, ck);
  ck.set_directory(::testing::TempDir() + "/ckpt_split");
  PipelineResult first = RunPipeline(f, sched, spec, 3, false, ck);
  for (const auto& s : first.statuses) ASSERT_TRUE(s.ok()) << s;
  PipelineResult resumed = RunPipeline(f, sched, spec, 6, false, ck);
  for (const auto& s : full.statuses) ASSERT_TRUE(s.ok()) << s;
  for (const auto& s : resumed.statuses) ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(resumed.reports[0].steps, 3);  // only the remaining steps ran
  ASSERT_EQ(full.params.size(), resumed.params.size());
  for (const auto& [name, p] : full.params) {
    EXPECT_TRUE(torch::equal(p, resumed.params[name])) << name;
  }
}

TEST(FailureTest, DeadPeerStopsStageWithNamedError) {
  Fixture f = MakeFixture();
  auto split = BalancedSplit(*f.graph, 2);
  auto layouts = LayoutStages(*f.graph, *split);
  auto server = StartStoreServer();
  ASSERT_TRUE(server.ok());
  schedule::ScheduleOptions sched;
  sched.kind = ScheduleKind::kAsync;
  sched.num_stages = 2;
  sched.micro_batches_per_iteration = 2;
  // Stage 1 connects and then dies (its transport closes its sockets).
  std::thread peer([&] {
    GlooTransportOptions t;
    t.store_port = (*server)->port();
    t.rank = 1;
    t.world_size = 2;
    t.groups = {{0}, {1}};
    auto transport = CreateGlooTransport(t);
    EXPECT_TRUE(transport.ok());
  });
  GlooTransportOptions t;
  t.store_port = (*server)->port();
  t.rank = 0;
  t.world_size = 2;
  t.groups = {{0}, {1}};
  t.timeout = absl::Seconds(60);
  t.label = "stage 0";
  auto transport = CreateGlooTransport(t);
  ASSERT_TRUE(transport.ok());
  peer.join();
  ExecutorConfig c;
  c.graph = f.graph.get();
  c.layouts = *layouts;
  c.schedule = sched;
  c.batch_size = kBatch;
  c.optimizer = Sgd();
  c.max_steps = 4;
  c.eval_every_epochs = 0;
  auto exec = StageExecutor::Create(c, transport->get(), f.split.train.get(),
                                    f.split.test.get());
  ASSERT_TRUE(exec.ok());
  absl::Status st = (*exec)->Run();
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("stage 0"));
  EXPECT_THAT(std::string(st.message()), HasSubstr("rank 1"));
}

TEST(ExecutorConfigTest, BatchNotDivisibleByMicroBatchesIsRefused) {
  Fixture f = MakeFixture();
  auto layouts = LayoutStages(*f.graph, *BalancedSplit(*f.graph, 1));
  ExecutorConfig c;
  c.graph = f.graph.get();
  c.layouts = *layouts;
  c.schedule.micro_batches_per_iteration = 3;
  c.batch_size = 16;
  c.optimizer = Sgd();
  auto exec = StageExecutor::Create(c, nullptr, f.split.train.get(),
                                    f.split.test.get());
  ASSERT_FALSE(exec.ok());
  EXPECT_THAT(std::string(exec.status().message()), HasSubstr("batch_size"));
}

}  // namespace
}  // namespace worker
}  // namespace apapo

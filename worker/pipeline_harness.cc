#include "worker/pipeline_harness.h"

#include <torch/torch.h>

#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/model_builder.h"
#include "worker/optimizer.h"
#include "worker/transport.h"

namespace apapo {
namespace worker {
namespace pipeline_test {

Fixture MakeFixture(const apapo::v1::ModelGraph& graph,
                    const std::vector<int64_t>& sample_shape,
                    int num_classes) {
  Fixture f;
  for (int64_t d : sample_shape) f.data.mutable_synthetic()->add_sample_shape(d);
  f.data.mutable_synthetic()->set_num_classes(num_classes);
  f.data.mutable_synthetic()->set_samples_per_epoch(256);
  auto split = LoadData(f.data, 5);
  EXPECT_TRUE(split.ok()) << split.status();
  f.split = *std::move(split);
  auto analysed = AnalyzedGraph::Create(graph);
  EXPECT_TRUE(analysed.ok()) << analysed.status();
  f.graph = std::make_unique<AnalyzedGraph>(*std::move(analysed));
  return f;
}

// Plain training of the whole graph on full mini-batches: the reference.
std::map<std::string, at::Tensor> TrainSingleProcess(
    const Fixture& f, const apapo::v1::OptimizerSpec& spec, int64_t steps) {
  std::vector<std::string> all;
  for (const NodeInfo& n : f.graph->nodes()) all.push_back(n.id());
  auto layouts = LayoutStages(*f.graph, {all});
  auto model = StageModel::Create(*f.graph, (*layouts)[0]);
  auto opt = Optimizer::Create(spec, steps);
  std::vector<at::Tensor> params = (*model)->InitParameters(kSeed);
  const auto order = EpochOrder(f.split.train->size(), kSeed, 0, true);
  for (int64_t k = 0; k < steps; ++k) {
    std::vector<int64_t> xs = {kBatch};
    const Shape& sample = f.split.train->shape().sample_shape;
    xs.insert(xs.end(), sample.begin(), sample.end());
    at::Tensor x = torch::empty(xs);
    at::Tensor y = torch::empty({kBatch}, torch::kLong);
    for (int64_t i = 0; i < kBatch; ++i) {
      f.split.train->Get(order[k * kBatch + i], x[i].data_ptr(),
                         y.data_ptr<int64_t>() + i);
    }
    auto fwd = (*model)->Forward({x, y}, params, true);
    EXPECT_TRUE(fwd.ok()) << fwd.status();
    if (!fwd.ok()) return {};
    auto grads = torch::autograd::grad({fwd->loss}, params);
    params = (*opt)->Step(params, grads, k);
  }
  std::map<std::string, at::Tensor> out;
  for (size_t i = 0; i < params.size(); ++i) {
    out[(*model)->param_names()[i]] = params[i];
  }
  return out;
}

// Runs a pipeline with one thread per stage replica.
PipelineResult RunPipeline(const Fixture& f, schedule::ScheduleOptions sched,
                           const apapo::v1::OptimizerSpec& spec, int64_t steps,
                           bool record, apapo::v1::CheckpointSpec checkpoint,
                           bool weight_prediction) {
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
        c.seed = kSeed;
        c.epochs = 1;
        c.max_steps = steps;
        c.eval_every_epochs = 0;
        c.record_backwards = record;
        c.checkpoint = checkpoint;
        c.weight_prediction = weight_prediction;
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

}  // namespace pipeline_test
}  // namespace worker
}  // namespace apapo

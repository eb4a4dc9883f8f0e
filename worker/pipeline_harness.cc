#include "worker/pipeline_harness.h"

#include <torch/torch.h>

#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/model_builder.h"
#include "worker/optimizer.h"
#include "partitioner/plan_proto.h"
#include "planning/stage_plan.h"
#include "schedule/schedule.h"
#include "worker/stage_runner.h"
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

// Runs a pipeline with one thread per stage replica, each through RunStage
// (the path every stage of a real job takes) with the harness's data.
PipelineResult RunPipeline(const Fixture& f, schedule::ScheduleOptions sched,
                           const apapo::v1::OptimizerSpec& spec, int64_t steps,
                           bool record, apapo::v1::CheckpointSpec checkpoint,
                           bool weight_prediction,
                           const std::vector<std::pair<std::string, int>>& splits,
                           apapo::v1::TransferPrecision transfer,
                           bool skip_zeros, bool split_backward,
                           bool allreduce_after_backward) {
  // The job: the fixture's graph and data, its plan: the balanced cut.
  apapo::v1::JobSpec job;
  job.set_name("harness");
  *job.mutable_model()->mutable_graph() = f.graph->graph();
  *job.mutable_data() = f.data;
  job.mutable_data()->set_batch_size(kBatch);
  job.mutable_data()->set_shuffle(true);
  *job.mutable_optimizer() = spec;
  job.set_seed(kSeed);
  job.mutable_limits()->set_epochs(1);
  job.mutable_limits()->set_max_steps(steps);
  *job.mutable_checkpoint() = checkpoint;
  job.mutable_schedule()->set_weight_prediction(weight_prediction);
  job.mutable_schedule()->set_transfer_precision(transfer);
  if (sched.max_in_flight > 0) {
    // The spec bounds staleness in updates; the stages keep s x k + 1 in
    // flight (k: micro-batches per replica and iteration), so a depth not of
    // that form cannot be asked for (the EXPECT below says so).
    job.mutable_schedule()->set_max_staleness(schedule::StalenessAtDepth(
        sched.max_in_flight,
        schedule::MicroBatchesPerReplica(sched.micro_batches_per_iteration, sched.replicas)));
  }
  // The plan's stages name the split graph's nodes.
  auto split_proto = SplitLinearLayers(f.graph->graph(), splits);
  EXPECT_TRUE(split_proto.ok()) << split_proto.status();
  auto split_graph = AnalyzedGraph::Create(*split_proto);
  EXPECT_TRUE(split_graph.ok()) << split_graph.status();
  auto split = BalancedSplit(*split_graph, sched.num_stages);
  EXPECT_TRUE(split.ok()) << split.status();
  apapo::v1::Plan plan;
  for (const auto& [id, parts] : splits) {
    apapo::v1::LayerSplit* ls = plan.add_splits();
    ls->set_node_id(id);
    ls->set_parts(parts);
  }
  plan.set_schedule(partitioner::ScheduleToProto(sched.kind));
  plan.set_skip_zeros(skip_zeros);
  plan.set_split_backward(split_backward);
  plan.set_allreduce_after_backward(allreduce_after_backward);
  plan.set_micro_batches(sched.micro_batches_per_iteration);
  int world = 0;
  for (int s = 0; s < sched.num_stages; ++s) {
    apapo::v1::Stage* stage = plan.add_stages();
    for (const std::string& id : (*split)[s]) stage->add_node_ids(id);
    stage->set_replicas(sched.Replicas(s));
    if (!sched.in_flight_depth.empty()) {
      stage->set_in_flight_depth(sched.in_flight_depth[s]);
    }
    world += sched.Replicas(s);
  }
  auto stage_plan = planning::StagePlanFor(job, plan);
  EXPECT_TRUE(stage_plan.ok()) << stage_plan.status();
  // The job and plan must say exactly what the test asked for.
  EXPECT_EQ(stage_plan->schedule.micro_batches_per_iteration,
            sched.micro_batches_per_iteration);
  EXPECT_EQ(stage_plan->schedule.max_in_flight, sched.max_in_flight);
  EXPECT_EQ(stage_plan->schedule.kind, sched.kind);
  auto server = StartStoreServer();
  EXPECT_TRUE(server.ok());
  PipelineResult result;
  result.reports.resize(world);
  result.statuses.resize(world);
  result.records.resize(world);
  result.traces.resize(world);
  std::vector<std::vector<std::pair<std::string, at::Tensor>>> params(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    auto [s, r] = stage_plan->StageOf(rank);
    apapo::v1::AssignStage a;
    a.set_job_id("harness");
    *a.mutable_spec() = job;
    *a.mutable_plan() = plan;
    a.set_stage(s);
    a.set_replica(r);
    a.mutable_rendezvous()->set_rank(rank);
    a.mutable_rendezvous()->set_world_size(world);
    a.mutable_rendezvous()->set_store_port((*server)->port());
    a.mutable_rendezvous()->mutable_timeout()->set_seconds(60);
    threads.emplace_back([&, a, rank] {
      StageRunHooks hooks;
      hooks.data = &f.split;
      hooks.configure = [&](ExecutorConfig* c) {
        c->evaluation.every_epochs = 0;
        c->test.record_backwards = record;
        if (record) {
          c->trace.warmup_steps = 1;
          c->trace.steps = steps;
        }
      };
      hooks.finished = [&](const StageExecutor& exec) {
        result.reports[rank] = exec.Report();
        result.records[rank] = exec.backward_records();
        for (size_t i = 0; i < exec.parameters().size(); ++i) {
          params[rank].push_back(
              {exec.parameter_names()[i], exec.parameters()[i]});
        }
      };
      result.statuses[rank] = RunStage(
          a,
          [&result, rank](const apapo::v1::MetricsReport& m) {
            if (m.has_trace()) result.traces[rank].push_back(m.trace());
          },
          nullptr, hooks);
    });
  }
  for (auto& t : threads) t.join();
  for (int s = 0; s < sched.num_stages; ++s) {
    for (int r = 0; r < sched.Replicas(s); ++r) {
      for (auto& [name, p] : params[stage_plan->RankOf(s, r)]) {
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

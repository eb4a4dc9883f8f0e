// Test harness for pipeline training: a pipeline of stages run as threads of
// this process, each through RunStage (worker/stage_runner.h, the path every
// stage of a real job takes) with a JobSpec and Plan made from the test's
// graph, schedule and data, and its own Gloo process group over a TCPStore
// on a free port; and the single-process training it must match.
// Shared by the stage executor's and the TorchScript model's tests.
//
// Thread-safety: each call runs to completion; calls share nothing.

#ifndef APAPO_WORKER_PIPELINE_HARNESS_H_
#define APAPO_WORKER_PIPELINE_HARNESS_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "schedule/schedule.h"
#include "proto/apapo/v1/job.pb.h"
#include "worker/data.h"
#include "worker/model_graph.h"
#include "worker/stage_executor.h"

namespace apapo {
namespace worker {
namespace pipeline_test {

// Mini-batch size of every harness run.
inline constexpr int64_t kBatch = 16;
// Seed of initial weights and of the epoch order.
inline constexpr int64_t kSeed = 11;

struct Fixture {
  apapo::v1::DataSpec data;
  DataSplit split;
  std::unique_ptr<AnalyzedGraph> graph;
};

// Synthetic data of `sample_shape` and `num_classes` (256 samples) and the
// graph `graph` analysed (expects success).
Fixture MakeFixture(const apapo::v1::ModelGraph& graph,
                    const std::vector<int64_t>& sample_shape,
                    int num_classes);

// Plain training of the whole graph on full mini-batches: the reference.
// Returns the parameters by name after `steps` steps.
std::map<std::string, at::Tensor> TrainSingleProcess(
    const Fixture& f, const apapo::v1::OptimizerSpec& spec, int64_t steps);

struct PipelineResult {
  std::map<std::string, at::Tensor> params;
  std::vector<StageReport> reports;
  std::vector<absl::Status> statuses;
  std::vector<std::vector<BackwardRecord>> records;
  // Per rank, the measured timelines it shipped (with record: the window
  // starts after the first step and covers the run).
  std::vector<std::vector<apapo::v1::StageTrace>> traces;
};

// Runs a pipeline split by BalancedSplit with one thread per stage replica.
// `sched.max_in_flight` > 0 reaches the stages as the spec's max_staleness
// that allows it (s x k + 1 in flight, k micro-batches per replica).
// `splits` are the plan's layer splits (SplitLinearLayers); then `params`
// is keyed by the split graph's names ("fc2/0.weight").
// `allreduce_after_backward` is the plan's (Plan.allreduce_after_backward).
PipelineResult RunPipeline(
    const Fixture& f, schedule::ScheduleOptions sched,
    const apapo::v1::OptimizerSpec& spec, int64_t steps, bool record = false,
    apapo::v1::CheckpointSpec checkpoint = {}, bool weight_prediction = false,
    const std::vector<std::pair<std::string, int>>& splits = {},
    apapo::v1::TransferPrecision transfer =
        apapo::v1::TRANSFER_PRECISION_UNSPECIFIED,
    bool skip_zeros = true, bool split_backward = true,
    bool allreduce_after_backward = false);

}  // namespace pipeline_test
}  // namespace worker
}  // namespace apapo

#endif  // APAPO_WORKER_PIPELINE_HARNESS_H_

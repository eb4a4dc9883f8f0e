// libFuzzer target: what workers report while profiling (ProfileResult, the
// wire bytes), fed to the planner as the coordinator feeds it: the profile
// becomes the partitioner's graph (GraphFromProfile validates it), the
// measured links become network levels. Nothing a worker sends may crash
// the coordinator. Profiles of up to 12 nodes are also planned end to end on
// the reported cluster, its workers at speeds the input sets (bigger DAGs
// are bounded by the planner's own limits; their planning time is a
// benchmark's matter, not a fuzzer's).

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "partitioner/plan_proto.h"
#include "planning/network_levels.h"
#include "planning/partitioner_planner.h"
#include "proto/apapo/v1/job.pb.h"
#include "proto/apapo/v1/worker.pb.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  apapo::v1::ProfileResult r;
  if (!r.ParseFromArray(data, static_cast<int>(size))) return 0;
  absl::StatusOr<apapo::partitioner::Graph> graph =
      apapo::partitioner::GraphFromProfile(r.profile());
  if (graph.ok() && !graph->Validate().ok()) std::abort();
  std::vector<std::string> workers = {"w-1", "w-2", "w-3", "w-4"};
  std::vector<apapo::v1::LinkMeasurement> links(r.links().begin(), r.links().end());
  for (const auto& l : links) {
    if (workers.size() < 16 && !l.from_worker().empty()) workers.push_back(l.from_worker());
  }
  const apapo::planning::NetworkLevels levels =
      apapo::planning::InferNetworkLevels(workers, links);
  if (!graph.ok() || r.profile().nodes_size() > 12) return 0;
  apapo::v1::ClusterSpec cluster;
  for (int index : levels.order) {
    if (index < 0 || index >= static_cast<int>(workers.size())) std::abort();
    apapo::v1::WorkerResources* w = cluster.add_workers();
    *w = r.resources();
    w->set_worker_id(workers[index]);
    // Speeds differ per worker as the input's first bytes say (what each
    // worker's profile reads as), so the per-worker DP runs too.
    const double reported = w->relative_speed() != 0 ? w->relative_speed() : 1.0;
    w->set_relative_speed(reported * (0.05 + data[index % size] / 64.0));
  }
  for (const auto& level : levels.levels) *cluster.add_levels() = level;
  if (levels.levels.empty()) {
    auto* level = cluster.add_levels();
    level->set_group_size(static_cast<int>(workers.size()));
    level->set_bandwidth_bytes_per_second(1e9);
  }
  apapo::v1::JobSpec spec;
  spec.mutable_data()->set_batch_size(64);
  apapo::planning::PartitionerPlanner planner;
  (void)planner.MakePlan(spec, r.profile(), cluster);
  return 0;
}

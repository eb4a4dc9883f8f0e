// Google Benchmark of the planner over every profile in ../shared/profiles
// and synthetic graphs (10,000-layer chain, 2,000-node random DAG, the wide
// graphs of issue 12: NASNet-style cells and 2,000-node layered DAGs), on
// flat clusters of 4..64 workers and hierarchies up to 1,024 workers.
//
// Run: bazel run -c opt //bench:planner_bench -- --benchmark_min_time=0.2
// (APAPO_PROFILES_DIR points at the profiles when not run from the repo).
// peak_rss_MiB is the process's peak so far: run one case per process
// (--benchmark_filter) to read it for that case.

#include <sys/resource.h>

#include <string>

#include "benchmark/benchmark.h"
#include "partitioner/optimizer.h"
#include "partitioner/pipedream_format.h"
#include "partitioner/synthetic.h"
#include "partitioner/testdata.h"

namespace apapo {
namespace partitioner {
namespace {

void PlanOnce(benchmark::State& state, const Graph& graph,
              const std::string& levels, CostModel model, int stages = 0) {
  absl::StatusOr<Cluster> cluster = MakeCluster(0, levels, "", "");
  if (!cluster.ok()) {
    state.SkipWithError(std::string(cluster.status().message()).c_str());
    return;
  }
  PlannerOptions options;
  options.cost_model = model;
  options.stages = stages;
  Plan last;
  for (auto _ : state) {
    absl::StatusOr<Plan> plan = PlanPipeline(graph, *cluster, options);
    if (!plan.ok()) {
      state.SkipWithError(std::string(plan.status().message()).c_str());
      return;
    }
    last = *std::move(plan);
    benchmark::DoNotOptimize(last);
  }
  state.counters["bottleneck_s"] = last.bottleneck_seconds;
  state.counters["states"] = last.num_states;
  state.counters["exact"] = last.exact;
  state.counters["stages"] = last.stages.size();
  state.counters["enumerated"] = last.states_enumerated;
  state.counters["search_MiB"] = last.search_bytes / 1048576.0;
  state.counters["dp_steps"] = last.dp_steps;
  struct rusage usage;
  if (getrusage(RUSAGE_SELF, &usage) == 0) {
    state.counters["peak_rss_MiB"] = usage.ru_maxrss / 1024.0;  // KiB on Linux
  }
}

void RegisterAll() {
  const char* kLevels[] = {"4:1e9", "8:1e9", "16:1e9", "64:1e9",
                           "8:300e9,4:25e9"};
  for (const std::string& name : ProfileNames()) {
    absl::StatusOr<Graph> g = ReadPipeDreamGraph(ProfilePath(name));
    if (!g.ok()) continue;
    auto* graph = new Graph(*std::move(g));
    for (const char* levels : kLevels) {
      benchmark::RegisterBenchmark(
          ("plan/" + name + "/" + levels + "/pipedream").c_str(),
          [graph, levels](benchmark::State& s) {
            PlanOnce(s, *graph, levels, CostModel::kPipeDream);
          })
          ->Unit(benchmark::kMillisecond);
    }
  }
  struct Synthetic {
    std::string name;
    Graph* graph;
    const char* levels;
  };
  const Synthetic synthetic[] = {
      {"chain10000", new Graph(SyntheticChain(10000, 1)), "16:1e9"},
      {"chain10000", new Graph(SyntheticChain(10000, 1)), "64:1e9"},
      {"dag2000", new Graph(SyntheticDag(2000, 2)), "16:1e9"},
      {"dag2000", new Graph(SyntheticDag(2000, 2)), "64:1e9"},
      {"dag2000", new Graph(SyntheticDag(2000, 3)), "8:300e9,16:25e9,8:10e9"},
      {"chain10000", new Graph(SyntheticChain(10000, 4)),
       "8:300e9,16:25e9,8:10e9"},
  };
  // Issue 12, under PipeDream's cost model as reported there.
  const Synthetic wide[] = {
      {"nasnet", new Graph(SyntheticNasNet(1)), "4:1e9"},
      {"nasnet", new Graph(SyntheticNasNet(1)), "16:1e9"},
      {"layered2000", new Graph(SyntheticLayeredDag(2000, 7)), "4:1e9"},
      {"layered2000", new Graph(SyntheticLayeredDag(2000, 7)), "16:1e9"},
  };
  for (const Synthetic& s : wide) {
    Graph* graph = s.graph;
    const char* levels = s.levels;
    benchmark::RegisterBenchmark(
        ("plan/" + s.name + "/" + levels + "/pipedream").c_str(),
        [graph, levels](benchmark::State& st) {
          PlanOnce(st, *graph, levels, CostModel::kPipeDream);
        })
        ->Unit(benchmark::kMillisecond);
  }
  // A stage count asked for (PlannerOptions::stages): the DP keeps a slot
  // per count, and its state cap shrinks by that factor.
  struct Staged {
    std::string name;
    Graph* graph;
    const char* levels;
    int stages;
  };
  const Staged staged[] = {
      {"nasnet", wide[1].graph, "16:1e9", 4},
      {"nasnet", wide[1].graph, "16:1e9", 16},
      {"layered2000", wide[3].graph, "16:1e9", 16},
      {"dag2000", synthetic[2].graph, "64:1e9", 8},
      {"dag2000", synthetic[4].graph, "8:300e9,16:25e9,8:10e9", 8},
  };
  for (const Staged& s : staged) {
    Graph* graph = s.graph;
    const char* levels = s.levels;
    const int stages = s.stages;
    benchmark::RegisterBenchmark(
        ("plan/" + s.name + "/" + levels + "/stages=" + std::to_string(stages))
            .c_str(),
        [graph, levels, stages](benchmark::State& st) {
          PlanOnce(st, *graph, levels, CostModel::kApapo, stages);
        })
        ->Unit(benchmark::kMillisecond);
  }
  for (const Synthetic& s : synthetic) {
    Graph* graph = s.graph;
    const char* levels = s.levels;
    benchmark::RegisterBenchmark(("plan/" + s.name + "/" + levels).c_str(),
                                 [graph, levels](benchmark::State& st) {
                                   PlanOnce(st, *graph, levels,
                                            CostModel::kApapo);
                                 })
        ->Unit(benchmark::kMillisecond);
  }
}

}  // namespace
}  // namespace partitioner
}  // namespace apapo

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  apapo::partitioner::RegisterAll();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

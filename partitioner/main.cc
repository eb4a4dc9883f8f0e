// apapo-partition: plans a pipeline for a model profile on a cluster and
// prints it as a table or as apapo.v1.Plan JSON; --compare simulates data
// parallelism, GPipe, 1F1B-flush and APapo async on the same cluster.
//
// Exit codes: 0 ok, 2 bad input (one line "FILE:LINE: reason" or "flag:
// reason" on stderr), 3 no plan fits in memory.

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "partitioner/cluster.h"
#include "partitioner/optimizer.h"
#include "partitioner/pipedream_format.h"
#include "partitioner/plan_proto.h"
#include "schedule/schedule.h"
#include "partitioner/simulator.h"

ABSL_FLAG(std::string, profile, "",
          "PipeDream graph.txt, or an apapo.v1.ModelProfile (.json / text)");
ABSL_FLAG(int, workers, 0, "number of workers (or implied by --levels)");
ABSL_FLAG(std::string, levels, "",
          "hierarchy, innermost first: FANOUT:BANDWIDTH[,...], e.g. "
          "8:300e9,4:25e9 (default one level at 1e9 B/s)");
ABSL_FLAG(std::string, memory, "", "memory per device, e.g. 16G or 16Gi");
ABSL_FLAG(std::string, speeds, "",
          "relative speed per worker, e.g. 4*1.0,4*0.5 (default all 1)");
ABSL_FLAG(double, transfer_cpu_ns_per_byte, 0,
          "worker CPU per activation byte sent or received, charged to the "
          "stage's compute (apapo cost model; 0: none)");
ABSL_FLAG(std::string, schedule, "async", "async, 2bw, gpipe, 1f1b_flush");
ABSL_FLAG(std::string, cost_model, "apapo", "apapo or pipedream");
ABSL_FLAG(double, activation_compression_ratio, 1.0,
          "activation compression ratio (PipeDream's)");
ABSL_FLAG(int, micro_batches, 0, "micro-batches per iteration (0: auto)");
ABSL_FLAG(int, max_in_flight, 0,
          "in-flight micro-batches a stage may keep to hide its links (each one more "
          "than the schedule's own depth is an update more of staleness); 0: the "
          "schedule's own depth, with a plan note naming the depth that would hide "
          "the links (as the coordinator does without schedule.max_staleness)");
ABSL_FLAG(bool, split_backward, true,
          "a stage after the first sends its input gradients before it computes "
          "the weight gradients of the nodes a profile marks "
          "weight_gradients_after_send, and adds those it marks "
          "weight_gradients_in_product inside their product (the coordinator's "
          "schedule.split_backward, on unless a job turns it off); apapo cost "
          "model only, and no effect on PipeDream's profiles, which mark none");
ABSL_FLAG(bool, allreduce_in_backward, true,
          "with --split_backward, a replicated stage's all-reduce starts in parts "
          "behind its last micro-batch's weight gradients and is charged what they "
          "leave exposed; false: one all-reduce after the backward, charged whole "
          "(the coordinator's schedule.allreduce_in_backward; left unset there, it "
          "plans both and keeps the parts only at 1.1x)");
ABSL_FLAG(bool, weight_prediction, true,
          "async: every stage but the last predicts its weights with its update "
          "(the coordinator's schedule.weight_prediction), at the profile's "
          "update_prediction_seconds more (apapo cost model; PipeDream's profiles "
          "have none)");
ABSL_FLAG(int, stages, 0,
          "exactly this many pipeline stages (0: the planner chooses)");
ABSL_FLAG(int, replicas, 0,
          "exactly this many replicas of every stage (0: the planner chooses)");
ABSL_FLAG(int, max_states, 0, "DP state cap (0: auto, -1: exact)");
ABSL_FLAG(double, batch_size, 1, "samples per mini-batch (for samples/s)");
ABSL_FLAG(std::string, format, "table", "table or json");
ABSL_FLAG(bool, compare, false,
          "simulate dp, gpipe, 1f1b_flush and async and print ratios");
ABSL_FLAG(std::string, trace, "", "write the simulated timeline (Chrome trace)");

namespace apapo {
namespace partitioner {
namespace {

int Fail(int code, const std::string& message) {
  std::cerr << "apapo-partition: " << message << "\n";
  return code;
}

std::string ModelName(const std::string& path) {
  std::string p = path;
  for (const char* suffix : {"/graph.txt", ".txt", ".json", ".textproto"}) {
    if (absl::EndsWith(p, suffix)) {
      p = p.substr(0, p.size() - std::string(suffix).size());
      break;
    }
  }
  const size_t slash = p.rfind('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

absl::StatusOr<Graph> LoadGraph(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ":0: cannot open file"));
  char first = 0;
  while (in.get(first) && std::isspace(static_cast<unsigned char>(first))) {
  }
  const bool proto = first == '{' || absl::EndsWith(path, ".json") ||
                     absl::EndsWith(path, ".textproto") ||
                     absl::EndsWith(path, ".pbtxt");
  return proto ? ReadModelProfile(path) : ReadPipeDreamGraph(path);
}

void PrintTable(const Plan& plan, const Graph& graph, const Cluster& cluster,
                const std::string& model, double plan_seconds) {
  absl::PrintF("model %s on %s, schedule %s, cost model %s\n", model,
               DescribeCluster(cluster),
               schedule::ScheduleKindName(plan.schedule),
               CostModelName(plan.cost_model));
  absl::PrintF("search: %s, planned in %.1f ms\n\n", plan.search,
               plan_seconds * 1e3);
  absl::PrintF("%5s %6s  %-23s %8s %10s %10s %9s %9s %10s %4s %4s\n", "stage",
               "layers", "first .. last", "replicas", "compute_ms",
               "allred_ms", "comm_ms", "time_ms", "memory_MB", "ver", "infl");
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const StagePlan& st = plan.stages[s];
    const std::string range = absl::StrCat(graph.node(st.nodes.front()).id,
                                           " .. ", graph.node(st.nodes.back()).id);
    absl::PrintF("%5d %6d  %-23s %8d %10.3f %10.3f %9.3f %9.3f %10.1f %4d %4d\n",
                 s, st.nodes.size(), range, st.replicas,
                 st.compute_seconds * 1e3, st.allreduce_seconds * 1e3,
                 st.comm_seconds * 1e3, st.time_seconds * 1e3,
                 st.peak_memory_bytes / 1e6, st.weight_versions, st.in_flight);
  }
  absl::PrintF(
      "\nbottleneck %.6f s/mini-batch (%.6f with bubble), %.3f mini-batches/s,"
      " bubble %.1f%%, %.2fx one worker, %d workers used, m=%d\n",
      plan.bottleneck_seconds, plan.seconds_per_mini_batch,
      plan.mini_batches_per_second, plan.bubble_fraction * 100,
      plan.seconds_per_mini_batch > 0
          ? plan.single_worker_seconds / plan.seconds_per_mini_batch
          : 0,
      plan.num_workers, plan.micro_batches);
  for (const std::string& note : plan.notes) absl::PrintF("note: %s\n", note);
}

int Run() {
  const std::string path = absl::GetFlag(FLAGS_profile);
  if (path.empty()) return Fail(2, "--profile: required");
  absl::StatusOr<Graph> graph = LoadGraph(path);
  if (!graph.ok()) return Fail(2, std::string(graph.status().message()));
  absl::StatusOr<Cluster> cluster =
      MakeCluster(absl::GetFlag(FLAGS_workers), absl::GetFlag(FLAGS_levels),
                  absl::GetFlag(FLAGS_memory), absl::GetFlag(FLAGS_speeds));
  if (!cluster.ok()) {
    return Fail(2, absl::StrCat("--workers/--levels/--memory/--speeds: ",
                                cluster.status().message()));
  }
  const double transfer_cpu = absl::GetFlag(FLAGS_transfer_cpu_ns_per_byte);
  if (!(transfer_cpu >= 0) || !std::isfinite(transfer_cpu)) {
    return Fail(2, "--transfer_cpu_ns_per_byte: must be a finite number >= 0");
  }
  cluster->transfer_cpu_seconds_per_byte = transfer_cpu * 1e-9;
  PlannerOptions options;
  absl::StatusOr<schedule::ScheduleKind> kind =
      schedule::ParseScheduleKind(absl::GetFlag(FLAGS_schedule));
  if (!kind.ok() || *kind == schedule::ScheduleKind::kDataParallel) {
    return Fail(2, "--schedule: expected async, 2bw, gpipe or 1f1b_flush");
  }
  options.schedule = *kind;
  absl::StatusOr<CostModel> model =
      ParseCostModel(absl::GetFlag(FLAGS_cost_model));
  if (!model.ok()) {
    return Fail(2, absl::StrCat("--cost-model: ", model.status().message()));
  }
  options.cost_model = *model;
  options.activation_compression_ratio =
      absl::GetFlag(FLAGS_activation_compression_ratio);
  options.micro_batches = absl::GetFlag(FLAGS_micro_batches);
  options.max_in_flight = absl::GetFlag(FLAGS_max_in_flight);
  options.deepen_for_links = options.max_in_flight > 0;
  options.split_backward = absl::GetFlag(FLAGS_split_backward);
  options.allreduce_in_backward = absl::GetFlag(FLAGS_allreduce_in_backward);
  options.weight_prediction = absl::GetFlag(FLAGS_weight_prediction);
  options.stages = absl::GetFlag(FLAGS_stages);
  options.replicas = absl::GetFlag(FLAGS_replicas);
  options.max_states = absl::GetFlag(FLAGS_max_states);
  options.batch_size = absl::GetFlag(FLAGS_batch_size);
  if (options.micro_batches < 0 || options.max_in_flight < 0 ||
      options.stages < 0 || options.replicas < 0 ||
      !(options.batch_size > 0) || !(options.activation_compression_ratio > 0)) {
    return Fail(2, "--micro_batches, --max_in_flight, --stages, --replicas must be >= 0; "
                   "--batch_size, --activation_compression_ratio > 0");
  }
  const std::string format = absl::GetFlag(FLAGS_format);
  if (format != "table" && format != "json") {
    return Fail(2, "--format: expected table or json");
  }
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<Plan> plan = PlanPipeline(*graph, *cluster, options);
  const double planning =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  if (!plan.ok()) {
    const int code =
        plan.status().code() == absl::StatusCode::kResourceExhausted ? 3 : 2;
    return Fail(code, std::string(plan.status().message()));
  }
  const std::string name = ModelName(path);
  apapo::v1::Plan proto = PlanToProto(*plan, *graph, name);
  proto.set_split_backward(options.split_backward && *model == CostModel::kApapo);
  proto.set_allreduce_after_backward(proto.split_backward() && !options.allreduce_in_backward &&
                                     Replicated(*plan));
  proto.set_weight_prediction(PredictsWeights(options));

  if (absl::GetFlag(FLAGS_compare)) {
    struct Row {
      std::string name;
      double rate = 0;
    };
    std::vector<Row> rows;
    SimulationOptions sim;
    absl::StatusOr<Plan> dp = DataParallelPlan(*graph, *cluster, options);
    if (dp.ok()) {
      absl::StatusOr<SimulationResult> r = Simulate(
          *dp, *cluster, schedule::ScheduleKind::kDataParallel, sim);
      if (r.ok()) rows.push_back({"dp", r->mini_batches_per_second});
    }
    for (schedule::ScheduleKind k :
         {schedule::ScheduleKind::kGPipe, schedule::ScheduleKind::k1F1BFlush,
          schedule::ScheduleKind::kAsync}) {
      PlannerOptions o = options;
      o.schedule = k;
      o.micro_batches = 0;
      absl::StatusOr<Plan> p = PlanPipeline(*graph, *cluster, o);
      if (!p.ok()) continue;
      absl::StatusOr<SimulationResult> r = Simulate(*p, *cluster, k, sim);
      if (r.ok()) {
        rows.push_back({std::string(schedule::ScheduleKindName(k)),
                        r->mini_batches_per_second});
      }
    }
    double base = rows.empty() ? 0 : rows.front().rate;
    double best_other = 0, async_rate = 0;
    for (const Row& row : rows) {
      (*proto.mutable_prediction()->mutable_alternatives_samples_per_second())
          [row.name] = row.rate * options.batch_size;
      if (row.name == "async") {
        async_rate = row.rate;
      } else {
        best_other = std::max(best_other, row.rate);
      }
    }
    if (format == "table") {
      absl::PrintF("simulated throughput on %s:\n", DescribeCluster(*cluster));
      for (const Row& row : rows) {
        absl::PrintF("  %-11s %12.3f mini-batches/s  %6.2fx dp\n", row.name,
                     row.rate, base > 0 ? row.rate / base : 0);
      }
      if (best_other > 0) {
        absl::PrintF("  async vs best other: %.2fx\n\n", async_rate / best_other);
      }
    }
  }
  if (!absl::GetFlag(FLAGS_trace).empty()) {
    SimulationOptions sim;
    sim.record_trace = true;
    sim.iterations = 8;
    absl::StatusOr<SimulationResult> r =
        Simulate(*plan, *cluster, options.schedule, sim);
    if (!r.ok()) return Fail(2, std::string(r.status().message()));
    std::ofstream out(absl::GetFlag(FLAGS_trace));
    out << ChromeTraceJson(*r);
    if (!out) return Fail(2, absl::StrCat("--trace: cannot write ",
                                          absl::GetFlag(FLAGS_trace)));
  }
  if (format == "json") {
    absl::StatusOr<std::string> json = PlanToJson(proto);
    if (!json.ok()) return Fail(2, std::string(json.status().message()));
    std::cout << *json << "\n";
  } else {
    PrintTable(*plan, *graph, *cluster, name, planning);
  }
  return 0;
}

}  // namespace
}  // namespace partitioner
}  // namespace apapo

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "apapo-partition --profile=FILE --workers=N [--levels=...] "
      "[--memory=...] [--schedule=...] [--cost-model=pipedream|apapo] "
      "[--split_backward=true|false] "
      "[--format=table|json] [--compare] [--trace=FILE]");
  // Accept --cost-model as well as --cost_model: dashes to underscores in
  // flag names (not in values).
  std::vector<std::string> args(argv, argv + argc);
  std::vector<char*> fixed;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string& a = args[i];
    if (i > 0 && a.rfind("--", 0) == 0) {
      const size_t end = std::min(a.find('='), a.size());
      for (size_t c = 2; c < end; ++c) {
        if (a[c] == '-') a[c] = '_';
      }
    }
    fixed.push_back(a.data());
  }
  std::vector<char*> positional = absl::ParseCommandLine(fixed.size(), fixed.data());
  if (positional.size() > 1) {
    std::cerr << "apapo-partition: unexpected argument '" << positional[1]
              << "'\n";
    return 2;
  }
  return apapo::partitioner::Run();
}

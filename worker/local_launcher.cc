#include "worker/local_launcher.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "planning/partitioner_planner.h"
#include "google/protobuf/text_format.h"
#include "partitioner/plan_proto.h"
#include "proto/apapo/v1/metrics.pb.h"
#include "worker/data.h"
#include "worker/stage_executor.h"
#include "worker/torchscript_model.h"
#include "worker/transport.h"

namespace apapo {
namespace worker {
namespace {

// ", weight prediction" when an async run of `spec` predicts weights.
std::string PredictionNote(const apapo::v1::JobSpec& spec,
                           schedule::ScheduleKind kind) {
  return kind == schedule::ScheduleKind::kAsync && WeightPredictionRequested(spec)
             ? ", weight prediction"
             : "";
}

std::string Json(double v) {
  if (!std::isfinite(v)) return "null";
  return absl::StrFormat("%.6g", v);
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out + "\"";
}

}  // namespace

absl::StatusOr<apapo::v1::JobSpec> ReadJobSpec(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot open job spec '", path, "': ", std::strerror(errno)));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  apapo::v1::JobSpec spec;
  if (!google::protobuf::TextFormat::ParseFromString(ss.str(), &spec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("job spec '", path, "' is not a valid JobSpec text proto"));
  }
  if (spec.data().batch_size() < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.data.batch_size: must be >= 1, got ", spec.data().batch_size()));
  }
  if (spec.limits().epochs() < 1 && spec.limits().max_steps() < 1) {
    return absl::InvalidArgumentError(
        "spec.limits: set epochs or max_steps (at least one must be >= 1)");
  }
  return spec;
}

namespace {

// Multiply-adds per second the estimated profile charges (one core here ran
// the mlp's forward + backward at ~3e10).
constexpr double kEstimatedOpsPerSecond = 3e10;

// The costs PlanLocalJob plans from without measuring: see local_launcher.h.
apapo::v1::ModelProfile EstimatedProfile(const AnalyzedGraph& graph,
                                         int64_t batch) {
  apapo::v1::ModelProfile p;
  p.set_model(graph.graph().name());
  p.set_batch_size(batch);
  p.set_source("estimated from the graph's shapes by apapo-worker --local");
  for (const NodeInfo& n : graph.nodes()) {
    apapo::v1::NodeProfile* np = p.add_nodes();
    np->set_id(n.id());
    for (const std::string& in : n.node->inputs()) np->add_inputs(in);
    const double forward =
        static_cast<double>(n.forward_ops) * batch / kEstimatedOpsPerSecond;
    np->set_forward_seconds(forward);
    np->set_backward_seconds(n.num_params > 0 ? 2 * forward : forward);
    int64_t numel = 1;
    for (int64_t d : n.out_shape) numel *= d;
    np->set_activation_bytes(numel * batch *
                             (n.out_dtype == DType::kInt64 ? 8 : 4));
    np->set_parameter_bytes(n.num_params * 4);
    if (n.kind() == apapo::v1::LAYER_KIND_LINEAR && !n.out_shape.empty()) {
      np->set_split_width(n.out_shape.back());
    }
  }
  return p;
}

absl::StatusOr<LocalPlan> PlanWithPartitioner(const apapo::v1::JobSpec& spec,
                                              const AnalyzedGraph& graph,
                                              int workers) {
  apapo::v1::ClusterSpec cluster;
  for (int w = 0; w < workers; ++w) {
    apapo::v1::WorkerResources* r = cluster.add_workers();
    r->set_worker_id(absl::StrCat("rank-", w));
    r->set_relative_speed(1.0);
  }
  apapo::v1::NetworkLevel* level = cluster.add_levels();
  level->set_group_size(workers);
  level->set_bandwidth_bytes_per_second(1e9);
  planning::PartitionerPlanner planner;
  auto proto = planner.MakePlan(
      spec, EstimatedProfile(graph, spec.data().batch_size()), cluster);
  if (!proto.ok()) return proto.status();
  auto kind = partitioner::ScheduleFromProto(proto->schedule(), "plan.schedule");
  if (!kind.ok()) return kind.status();
  LocalPlan plan;
  plan.schedule.kind = *kind;
  plan.schedule.num_stages = proto->stages_size();
  std::vector<int> replicas;
  bool replicated = false;
  std::vector<std::string> parts;
  for (const apapo::v1::Stage& st : proto->stages()) {
    plan.stage_nodes.emplace_back(st.node_ids().begin(), st.node_ids().end());
    replicas.push_back(std::max(1, st.replicas()));
    replicated |= replicas.back() > 1;
    parts.push_back(absl::StrCat("[", st.node_ids(0), "..",
                                 st.node_ids(st.node_ids_size() - 1), "]",
                                 replicas.back() > 1
                                     ? absl::StrCat(" x", replicas.back())
                                     : ""));
    plan.world_size += replicas.back();
  }
  if (replicated) plan.schedule.replicas = replicas;
  plan.schedule.micro_batches_per_iteration = std::max(1, proto->micro_batches());
  if (spec.schedule().has_max_staleness()) {
    plan.schedule.max_in_flight = spec.schedule().max_staleness() + 1;
  }
  if (absl::Status s = schedule::ValidateScheduleOptions(plan.schedule);
      !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("plan: ", s.message()));
  }
  if (plan.world_size != workers) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the partitioner planned ", plan.world_size, " process(es) for --local=",
        workers, "; set spec.schedule.stages / replicas to force a layout"));
  }
  std::vector<std::string> split_names;
  for (const apapo::v1::LayerSplit& split : proto->splits()) {
    plan.splits.emplace_back(split.node_id(), split.parts());
    split_names.push_back(absl::StrCat(split.node_id(), "/", split.parts()));
  }
  plan.description = absl::StrCat(
      schedule::ScheduleKindName(*kind), " (planned), ", plan.schedule.num_stages,
      " stage(s), m=", plan.schedule.micro_batches_per_iteration, ": ",
      absl::StrJoin(parts, " | "),
      split_names.empty() ? ""
                          : absl::StrCat(", split ", absl::StrJoin(split_names, " ")),
      PredictionNote(spec, plan.schedule.kind));
  return plan;
}

}  // namespace

absl::StatusOr<AnalyzedGraph> PlannedGraph(const AnalyzedGraph& graph,
                                           const LocalPlan& plan) {
  if (plan.splits.empty()) return graph;
  auto split = SplitLinearLayers(graph.graph(), plan.splits);
  if (!split.ok()) return split.status();
  return AnalyzedGraph::Create(*std::move(split));
}

absl::StatusOr<LocalPlan> PlanLocalJob(const apapo::v1::JobSpec& spec,
                                       const AnalyzedGraph& graph,
                                       int workers) {
  auto kind = partitioner::ScheduleFromProto(spec.schedule().kind(), "spec.schedule.kind");
  if (!kind.ok()) return kind.status();
  if (workers > 1 && spec.schedule().stages() <= 0 &&
      spec.schedule().replicas() <= 0 &&
      *kind != schedule::ScheduleKind::kDataParallel) {
    return PlanWithPartitioner(spec, graph, workers);
  }
  LocalPlan plan;
  int replicas = spec.schedule().replicas() > 0 ? spec.schedule().replicas() : 1;
  int stages = spec.schedule().stages();
  if (*kind == schedule::ScheduleKind::kDataParallel) {
    stages = 1;
    if (spec.schedule().replicas() <= 0) replicas = workers;
  }
  if (stages <= 0) stages = std::max(1, workers / replicas);
  if (stages * replicas != workers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.schedule: stages (", stages, ") x replicas (", replicas,
        ") must equal the number of local workers (", workers, ")"));
  }
  plan.world_size = workers;
  plan.schedule.kind = *kind;
  plan.schedule.num_stages = stages;
  if (replicas > 1) plan.schedule.replicas.assign(stages, replicas);
  plan.schedule.micro_batches_per_iteration =
      spec.schedule().has_micro_batches()
          ? spec.schedule().micro_batches()
          : schedule::DefaultMicroBatches(
                *kind, std::vector<int>(stages, replicas),
                spec.data().batch_size());
  if (spec.schedule().has_max_staleness()) {
    // Stage 0's gradient delay is its in-flight depth minus one.
    plan.schedule.max_in_flight = spec.schedule().max_staleness() + 1;
  }
  if (absl::Status s = schedule::ValidateScheduleOptions(plan.schedule);
      !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.schedule: ", s.message()));
  }
  auto split = BalancedSplit(graph, stages);
  if (!split.ok()) return split.status();
  plan.stage_nodes = *std::move(split);
  std::vector<std::string> parts;
  for (const auto& nodes : plan.stage_nodes) {
    parts.push_back(absl::StrCat("[", nodes.front(), "..", nodes.back(), "]"));
  }
  plan.description = absl::StrCat(
      schedule::ScheduleKindName(*kind),
      spec.schedule().kind() == apapo::v1::SCHEDULE_KIND_UNSPECIFIED
          ? " (auto)"
          : "",
      ", ", stages, " stage(s) x ", replicas, " replica(s), m=",
      plan.schedule.micro_batches_per_iteration, ": ",
      absl::StrJoin(parts, " | "), PredictionNote(spec, plan.schedule.kind));
  return plan;
}

absl::Status RunRank(const apapo::v1::JobSpec& spec,
                     const RankOptions& options) {
  auto report_error = [&](const absl::Status& s) {
    (void)PutToStore("127.0.0.1", options.store_port,
                     absl::StrCat("error/", options.rank),
                     absl::StrCat(absl::StatusCodeToString(s.code()), ": ",
                                  s.message()));
    return s;
  };
  auto proto_graph = GraphForJob(spec, TorchScriptGraph);
  if (!proto_graph.ok()) return report_error(proto_graph.status());
  auto graph = AnalyzedGraph::Create(*std::move(proto_graph));
  if (!graph.ok()) return report_error(graph.status());
  auto plan = PlanLocalJob(spec, *graph, options.world_size);
  if (!plan.ok()) return report_error(plan.status());
  graph = PlannedGraph(*graph, *plan);
  if (!graph.ok()) return report_error(graph.status());
  auto layouts = LayoutStages(*graph, plan->stage_nodes);
  if (!layouts.ok()) return report_error(layouts.status());
  int stage = 0, replica = 0;
  {
    int r = options.rank;
    while (r >= plan->schedule.Replicas(stage)) {
      r -= plan->schedule.Replicas(stage);
      ++stage;
    }
    replica = r;
  }
  const std::string label = absl::StrCat("stage ", stage, " replica ", replica,
                                         " (rank ", options.rank, ")");
  auto data = LoadData(spec.data(), spec.seed());
  if (!data.ok()) {
    return report_error(absl::Status(
        data.status().code(), absl::StrCat(label, ": ", data.status().message())));
  }
  GlooTransportOptions t;
  t.store_port = options.store_port;
  t.rank = options.rank;
  t.world_size = options.world_size;
  t.timeout = options.timeout;
  t.label = label;
  int next = 0;
  for (int s = 0; s < plan->schedule.num_stages; ++s) {
    std::vector<int> group;
    for (int r = 0; r < plan->schedule.Replicas(s); ++r) group.push_back(next++);
    t.groups.push_back(group);
  }
  auto transport = CreateGlooTransport(t);
  if (!transport.ok()) return report_error(transport.status());

  ExecutorConfig c;
  c.graph = &*graph;
  c.layouts = *layouts;
  c.stage = stage;
  c.replica = replica;
  c.schedule = plan->schedule;
  ApplyJobSpec(spec, &c);
  if (options.rank == 0) {
    std::fprintf(stderr, "[apapo] plan: %s\n", plan->description.c_str());
  }
  c.on_progress = [](const TrainingProgress& p) {
    std::string acc = p.test_accuracy >= 0
                          ? absl::StrFormat(" test_acc %.4f", p.test_accuracy)
                          : "";
    std::fprintf(stderr,
                 "[apapo] epoch %lld step %lld/%lld loss %.4f samples/s %.1f%s\n",
                 static_cast<long long>(p.epoch),
                 static_cast<long long>(p.step),
                 static_cast<long long>(p.total_steps), p.loss,
                 p.samples_per_second, acc.c_str());
  };
  auto exec = StageExecutor::Create(c, transport->get(), data->train.get(),
                                    data->test.get());
  if (!exec.ok()) return report_error(exec.status());
  absl::Status run = (*exec)->Run();
  if (!run.ok()) return report_error(run);

  const StageReport r = (*exec)->Report();
  apapo::v1::MetricsReport m;
  m.set_step(r.steps);
  m.set_samples(r.steps * spec.data().batch_size());
  m.set_samples_per_second(
      r.train_seconds > 0 ? r.steps * spec.data().batch_size() / r.train_seconds
                          : 0);
  if (stage == plan->schedule.num_stages - 1) {
    m.set_has_loss(true);
    m.set_loss(r.final_loss);
  }
  if (r.test_accuracy >= 0) m.set_test_accuracy(r.test_accuracy);
  FillStageMetrics(r, stage, options.rank, m.mutable_stage());
  m.mutable_stage()->add_step_seconds(r.train_seconds);
  return PutToStore("127.0.0.1", options.store_port,
                    absl::StrCat("result/", options.rank),
                    m.SerializeAsString());
}

absl::Status RunLocalJob(const apapo::v1::JobSpec& spec,
                         const LocalJobOptions& options) {
  // Validate the plan here so a bad spec fails before any process starts.
  auto proto_graph = GraphForJob(spec, TorchScriptGraph);
  if (!proto_graph.ok()) return proto_graph.status();
  auto graph = AnalyzedGraph::Create(*std::move(proto_graph));
  if (!graph.ok()) return graph.status();
  auto plan = PlanLocalJob(spec, *graph, options.workers);
  if (!plan.ok()) return plan.status();
  graph = PlannedGraph(*graph, *plan);
  if (!graph.ok()) return graph.status();
  if (absl::Status s = LayoutStages(*graph, plan->stage_nodes).status();
      !s.ok()) {
    return s;
  }
  auto server = StartStoreServer();
  if (!server.ok()) return server.status();
  const int port = (*server)->port();

  // SIGCHLD is waited for with a deadline (sigtimedwait), never polled.
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  sigset_t old_mask;
  pthread_sigmask(SIG_BLOCK, &chld, &old_mask);

  const absl::Time start = absl::Now();
  std::map<pid_t, int> children;
  for (int rank = 0; rank < options.workers; ++rank) {
    std::vector<std::string> args = {options.self_exe};
    args.insert(args.end(), options.rank_args.begin(), options.rank_args.end());
    args.push_back(absl::StrCat("--rank=", rank));
    args.push_back(absl::StrCat("--world=", options.workers));
    args.push_back(absl::StrCat("--store_port=", port));
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t pid = fork();
    if (pid < 0) {
      return absl::InternalError(
          absl::StrCat("fork failed: ", std::strerror(errno)));
    }
    if (pid == 0) {
      pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    children[pid] = rank;
  }
  std::map<int, int> exit_codes;
  absl::Time kill_deadline = absl::InfiniteFuture();
  while (!children.empty()) {
    // Reap whatever has exited.
    int wstatus = 0;
    pid_t pid;
    while ((pid = waitpid(-1, &wstatus, WNOHANG)) > 0) {
      auto it = children.find(pid);
      if (it == children.end()) continue;
      const int code = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus)
                                          : 128 + WTERMSIG(wstatus);
      exit_codes[it->second] = code;
      children.erase(it);
      if (code != 0 && kill_deadline == absl::InfiniteFuture()) {
        // Peers notice a dead rank themselves; give them the transfer
        // timeout to stop, then stop them.
        kill_deadline = absl::Now() + options.timeout + absl::Seconds(10);
      }
    }
    if (children.empty()) break;
    if (absl::Now() >= kill_deadline) {
      for (auto& [p, rank] : children) kill(p, SIGKILL);
      kill_deadline = absl::InfiniteFuture();
    }
    const absl::Duration wait =
        std::min(absl::Seconds(60), kill_deadline - absl::Now());
    timespec ts = absl::ToTimespec(std::max(wait, absl::Milliseconds(1)));
    sigtimedwait(&chld, nullptr, &ts);
  }
  pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  const double wall = absl::ToDoubleSeconds(absl::Now() - start);

  // First error, by rank.
  for (auto& [rank, code] : exit_codes) {
    if (code == 0) continue;
    auto err = (*server)->Get(absl::StrCat("error/", rank), absl::Seconds(1));
    return absl::InternalError(absl::StrCat(
        "rank ", rank, " exited with code ", code,
        err.ok() ? absl::StrCat(": ", *err) : std::string()));
  }
  std::vector<apapo::v1::MetricsReport> reports(options.workers);
  for (int rank = 0; rank < options.workers; ++rank) {
    auto bytes = (*server)->Get(absl::StrCat("result/", rank), absl::Seconds(5));
    if (!bytes.ok() || !reports[rank].ParseFromString(*bytes)) {
      return absl::InternalError(
          absl::StrCat("rank ", rank, " reported no result"));
    }
  }
  double samples_per_s = 1e300, accuracy = -1, loss = 0, exposed = 0, total = 0;
  int64_t staleness = 0, steps = 0;
  std::vector<std::string> stages;
  for (const auto& r : reports) {
    samples_per_s = std::min(samples_per_s, r.samples_per_second());
    if (r.has_test_accuracy()) accuracy = r.test_accuracy();
    if (r.has_loss()) loss = r.loss();
    exposed += r.stage().comm_exposed_seconds();
    total += r.stage().comm_total_seconds();
    staleness = std::max<int64_t>(staleness, r.stage().max_staleness());
    steps = std::max<int64_t>(steps, r.step());
    const auto& s = r.stage();
    stages.push_back(absl::StrCat(
        "{\"stage\": ", s.stage(), ", \"rank\": ", s.rank(),
        ", \"busy_s\": ", Json(s.busy_seconds()),
        ", \"idle_s\": ", Json(s.idle_seconds()),
        ", \"comm_exposed_s\": ", Json(s.comm_exposed_seconds()),
        ", \"comm_total_s\": ", Json(s.comm_total_seconds()),
        ", \"bytes_sent\": ", s.bytes_sent(),
        ", \"bytes_received\": ", s.bytes_received(),
        ", \"max_staleness\": ", s.max_staleness(),
        ", \"max_weight_versions\": ", s.max_weight_versions(),
        ", \"train_s\": ", Json(s.step_seconds_size() ? s.step_seconds(0) : 0),
        "}"));
  }
  const double hidden =
      total > 0 ? std::clamp(1.0 - exposed / total, 0.0, 1.0) : 1.0;
  const std::string summary = absl::StrCat(
      "{\n  \"job\": ", JsonString(spec.name()),
      ",\n  \"model\": ", JsonString(graph->graph().name()),
      ",\n  \"plan\": ", JsonString(plan->description),
      ",\n  \"workers\": ", options.workers,
      ",\n  \"steps\": ", steps,
      ",\n  \"samples_per_s\": ", Json(samples_per_s),
      ",\n  \"final_test_accuracy\": ", accuracy >= 0 ? Json(accuracy) : "null",
      ",\n  \"final_loss\": ", Json(loss),
      ",\n  \"max_staleness\": ", staleness,
      ",\n  \"comm_hidden_share\": ", Json(hidden),
      ",\n  \"wall_s\": ", Json(wall),
      ",\n  \"stages\": [\n    ", absl::StrJoin(stages, ",\n    "), "\n  ]\n}\n");
  std::fprintf(stderr, "[apapo] done: %s", summary.c_str());
  if (!options.summary_path.empty()) {
    const std::string tmp = options.summary_path + ".tmp";
    {
      std::ofstream out(tmp);
      out << summary;
      if (!out) {
        return absl::InternalError(
            absl::StrCat("cannot write summary '", tmp, "'"));
      }
    }
    if (std::rename(tmp.c_str(), options.summary_path.c_str()) != 0) {
      return absl::InternalError(absl::StrCat(
          "cannot rename summary to '", options.summary_path, "'"));
    }
  }
  return absl::OkStatus();
}

}  // namespace worker
}  // namespace apapo

#include "worker/local_driver.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "partitioner/plan_proto.h"
#include "planning/partitioner_planner.h"
#include "planning/stage_plan.h"
#include "proto/apapo/v1/metrics.pb.h"
#include "worker/confined_files.h"
#include "worker/daemon/stage_process.h"
#include "worker/daemon/torch_job_runner.h"
#include "worker/torchscript_model.h"

namespace apapo {
namespace worker {
namespace {

// Multiply-adds per second the estimated profile charges (one core here ran
// the mlp's forward + backward at ~3e10).
constexpr double kEstimatedOpsPerSecond = 3e10;

// The job id and rendezvous prefix of a local run.
constexpr char kLocalJobId[] = "local";

// The note PlanLocalRun leaves on plans the partitioner made.
constexpr char kPlannedNote[] = "local: planned by the partitioner";

// Progress lines are printed at most this often (and after evaluations).
constexpr absl::Duration kPrintInterval = absl::Seconds(5);

// The forced layout: `stages` x `replicas` with the balanced whole-layer cut.
absl::StatusOr<apapo::v1::Plan> ForcedPlan(const apapo::v1::JobSpec& spec,
                                           schedule::ScheduleKind kind,
                                           const AnalyzedGraph& graph,
                                           int workers) {
  int replicas = spec.schedule().replicas() > 0 ? spec.schedule().replicas() : 1;
  int stages = spec.schedule().stages();
  if (kind == schedule::ScheduleKind::kDataParallel) {
    stages = 1;
    if (spec.schedule().replicas() <= 0) replicas = workers;
  }
  if (stages <= 0) stages = std::max(1, workers / replicas);
  if (stages * replicas != workers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.schedule: stages (", stages, ") x replicas (", replicas,
        ") must equal the number of local workers (", workers, ")"));
  }
  APAPO_ASSIGN_OR_RETURN(auto cut, BalancedSplit(graph, stages));
  apapo::v1::Plan plan;
  plan.set_model(graph.graph().name());
  plan.set_schedule(spec.schedule().kind());
  int rank = 0;
  for (const auto& nodes : cut) {
    apapo::v1::Stage* stage = plan.add_stages();
    for (const std::string& id : nodes) stage->add_node_ids(id);
    stage->set_index(plan.stages_size() - 1);
    stage->set_replicas(replicas);
    for (int r = 0; r < replicas; ++r) {
      apapo::v1::StageReplica* p = stage->add_placement();
      p->set_worker_id(absl::StrCat("rank-", rank));
      p->set_rank(rank++);
    }
  }
  return plan;
}

// The local planner's cluster: one level at this rate, and the all-reduce
// it takes as timed (PartitionerPlan).
constexpr double kLocalBandwidth = 1e9;
constexpr int64_t kLocalAllReduceBytes = int64_t{4} << 20;

absl::StatusOr<apapo::v1::Plan> PartitionerPlan(const apapo::v1::JobSpec& spec,
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
  level->set_bandwidth_bytes_per_second(kLocalBandwidth);
  // Processes of one host over loopback: an all-reduce is the cores' own
  // copies and sums, none of it runs on a wire while they compute. As the
  // link test would read it (82-92% on loopback here), all of its time is
  // the computing core's: 4 MiB over 2 ranks, as long as the ring takes at
  // the level's rate, all of it lost to the compute beside it.
  apapo::v1::AllReduceMeasurement* allreduce = cluster.add_allreduces();
  allreduce->set_ranks(2);
  allreduce->set_bytes(kLocalAllReduceBytes);
  allreduce->set_seconds(static_cast<double>(kLocalAllReduceBytes) / kLocalBandwidth);
  allreduce->set_compute_lost_seconds(static_cast<double>(kLocalAllReduceBytes) /
                                      kLocalBandwidth);
  planning::PartitionerPlanner planner;
  APAPO_ASSIGN_OR_RETURN(
      apapo::v1::Plan plan,
      planner.MakePlan(spec, EstimatedProfile(graph, spec.data().batch_size()),
                       cluster));
  int world = 0;
  for (const apapo::v1::Stage& st : plan.stages()) {
    world += std::max(1, st.replicas());
  }
  if (world != workers) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the partitioner planned ", world, " process(es) for --local=",
        workers, "; set spec.schedule.stages / replicas to force a layout"));
  }
  plan.add_notes(kPlannedNote);
  return plan;
}

// The graph the stages are cut from: the model with the plan's splits.
absl::StatusOr<AnalyzedGraph> PlannedGraph(const AnalyzedGraph& graph,
                                           const planning::StagePlan& plan) {
  if (plan.splits.empty()) return graph;
  APAPO_ASSIGN_OR_RETURN(auto split, SplitLinearLayers(graph.graph(), plan.splits));
  return AnalyzedGraph::Create(std::move(split));
}

// What one rank's thread leaves behind.
struct RankOutcome {
  absl::Status status;
  apapo::v1::MetricsReport final_metrics;
};

// Prints the last stage's progress reports as "[apapo] epoch ..." lines.
class ProgressPrinter {
 public:
  void OnReport(const apapo::v1::MetricsReport& m) {
    if (!m.has_loss()) return;  // stage counters only
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    const bool evaluated = m.has_test_accuracy() &&
                           m.test_accuracy() != last_accuracy_;
    if (!evaluated && now - last_print_ < kPrintInterval) return;
    last_print_ = now;
    if (m.has_test_accuracy()) last_accuracy_ = m.test_accuracy();
    const std::string acc =
        m.has_test_accuracy() ? absl::StrFormat(" test_acc %.4f", m.test_accuracy())
                              : "";
    std::fprintf(stderr,
                 "[apapo] epoch %d step %lld/%lld loss %.4f samples/s %.1f%s\n",
                 m.epoch(), static_cast<long long>(m.step()),
                 static_cast<long long>(m.total_steps()), m.loss(),
                 m.samples_per_second(), acc.c_str());
  }

 private:
  absl::Mutex mu_;
  absl::Time last_print_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  double last_accuracy_ ABSL_GUARDED_BY(mu_) = -1;
};

apapo::v1::LocalRunSummary Summarize(
    const apapo::v1::JobSpec& spec, const std::string& model,
    const std::string& description, int workers, double wall,
    const std::vector<RankOutcome>& outcomes) {
  apapo::v1::LocalRunSummary s;
  s.set_job(spec.name());
  s.set_model(model);
  s.set_plan(description);
  s.set_workers(workers);
  // The pipeline's throughput: its slowest stage's, where a stage's is the
  // sum of its replicas' shares.
  std::map<int, double> stage_samples_per_s;
  double exposed = 0, total = 0;
  for (const RankOutcome& o : outcomes) {
    const apapo::v1::MetricsReport& r = o.final_metrics;
    const apapo::v1::StageMetrics& m = r.stage();
    stage_samples_per_s[m.stage()] += r.samples_per_second();
    if (r.has_test_accuracy()) s.set_final_test_accuracy(r.test_accuracy());
    if (r.has_loss()) s.set_final_loss(r.loss());
    exposed += m.comm_exposed_seconds();
    total += m.comm_total_seconds();
    s.set_max_staleness(std::max<int32_t>(s.max_staleness(), m.max_staleness()));
    s.set_steps(std::max<int32_t>(s.steps(), static_cast<int32_t>(r.step())));
    apapo::v1::LocalStageSummary* st = s.add_stages();
    st->set_stage(m.stage());
    st->set_rank(m.rank());
    st->set_busy_s(m.busy_seconds());
    st->set_idle_s(m.idle_seconds());
    st->set_comm_exposed_s(m.comm_exposed_seconds());
    st->set_comm_total_s(m.comm_total_seconds());
    st->set_bytes_sent(m.bytes_sent());
    st->set_bytes_received(m.bytes_received());
    st->set_max_staleness(m.max_staleness());
    st->set_max_weight_versions(m.max_weight_versions());
    st->set_train_s(m.busy_seconds() + m.idle_seconds() +
                    m.comm_exposed_seconds());
  }
  double samples_per_s = stage_samples_per_s.empty() ? 0 : 1e300;
  for (const auto& [stage, sps] : stage_samples_per_s) {
    samples_per_s = std::min(samples_per_s, sps);
  }
  s.set_samples_per_s(samples_per_s);
  s.set_comm_hidden_share(
      total > 0 ? std::clamp(1.0 - exposed / total, 0.0, 1.0) : 1.0);
  s.set_wall_s(wall);
  return s;
}

absl::Status WriteSummary(const std::string& text, const std::string& path) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << text;
    if (!out) {
      return absl::InternalError(absl::StrCat("cannot write summary '", tmp,
                                              "': ", std::strerror(errno)));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot rename summary to '", path,
                                            "': ", std::strerror(errno)));
  }
  return absl::OkStatus();
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
    if (n.num_params > 0 && WeightGradientsAfterSend(n.kind())) {
      np->set_weight_gradients_after_send(true);
    }
    if (WeightGradientsInProduct(n)) np->set_weight_gradients_in_product(true);
  }
  return p;
}

absl::StatusOr<apapo::v1::Plan> PlanLocalRun(const apapo::v1::JobSpec& spec,
                                             const AnalyzedGraph& graph,
                                             int workers) {
  APAPO_ASSIGN_OR_RETURN(
      schedule::ScheduleKind kind,
      partitioner::ScheduleFromProto(spec.schedule().kind(),
                                     "spec.schedule.kind"));
  if (workers > 1 && spec.schedule().stages() <= 0 &&
      spec.schedule().replicas() <= 0 &&
      kind != schedule::ScheduleKind::kDataParallel) {
    return PartitionerPlan(spec, graph, workers);
  }
  return ForcedPlan(spec, kind, graph, workers);
}

std::string DescribeLocalPlan(const apapo::v1::JobSpec& spec,
                              const apapo::v1::Plan& plan) {
  auto stage_plan = planning::StagePlanFor(spec, plan);
  if (!stage_plan.ok()) return std::string(stage_plan.status().message());
  const bool planned = std::find(plan.notes().begin(), plan.notes().end(),
                                 kPlannedNote) != plan.notes().end();
  return stage_plan->Describe(spec, planned ? "planned" : "");
}

absl::Status RunLocalJob(const apapo::v1::JobSpec& job_spec,
                         const LocalJobOptions& options) {
  apapo::v1::JobSpec spec = job_spec;
  spec.mutable_resources()->set_threads_per_worker(std::max(1, options.threads));
  // Plan and check the stages here, so a bad spec fails before any process
  // starts.
  APAPO_ASSIGN_OR_RETURN(auto proto_graph, GraphForJob(spec, TorchScriptGraph));
  APAPO_ASSIGN_OR_RETURN(AnalyzedGraph graph,
                         AnalyzedGraph::Create(std::move(proto_graph)));
  APAPO_ASSIGN_OR_RETURN(apapo::v1::Plan plan,
                         PlanLocalRun(spec, graph, options.workers));
  APAPO_ASSIGN_OR_RETURN(planning::StagePlan stage_plan,
                         planning::StagePlanFor(spec, plan));
  APAPO_ASSIGN_OR_RETURN(AnalyzedGraph planned, PlannedGraph(graph, stage_plan));
  APAPO_RETURN_IF_ERROR(LayoutStages(planned, stage_plan.stage_nodes).status());
  const std::string description = DescribeLocalPlan(spec, plan);
  std::fprintf(stderr, "[apapo] plan: %s\n", description.c_str());

  APAPO_ASSIGN_OR_RETURN(std::unique_ptr<JobStore> store, StartJobStore());
  const int world = stage_plan.world_size;
  std::vector<std::unique_ptr<TorchJobRunner>> runners;
  std::vector<apapo::v1::AssignStage> assignments;
  for (int rank = 0; rank < world; ++rank) {
    TorchJobRunnerOptions ro;
    ro.exe = options.exe;
    ro.data_roots = ConfinedDataRoots();  // --confine_to reaches the stages
    runners.push_back(std::make_unique<TorchJobRunner>(ro));
    auto [stage, replica] = stage_plan.StageOf(rank);
    apapo::v1::AssignStage a;
    a.set_job_id(kLocalJobId);
    *a.mutable_spec() = spec;
    *a.mutable_plan() = plan;
    a.set_stage(stage);
    a.set_replica(replica);
    apapo::v1::Rendezvous* rv = a.mutable_rendezvous();
    rv->set_rank(rank);
    rv->set_world_size(world);
    rv->set_store_host("127.0.0.1");
    rv->set_store_port(store->port());
    rv->set_local_host("127.0.0.1");
    rv->set_prefix(kLocalJobId);
    rv->mutable_timeout()->set_seconds(
        absl::ToInt64Seconds(options.timeout));
    assignments.push_back(std::move(a));
  }

  const absl::Time start = absl::Now();
  ProgressPrinter printer;
  std::vector<RankOutcome> outcomes(world);
  absl::Mutex mu;
  int first_failure = -1;  // guarded by mu
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      RankOutcome& out = outcomes[rank];
      out.status = runners[rank]->Train(
          assignments[rank],
          [&printer](const apapo::v1::MetricsReport& m) { printer.OnReport(m); },
          &out.final_metrics);
      if (out.status.ok()) return;
      absl::MutexLock lock(&mu);
      if (first_failure >= 0) return;  // stopped because of another rank
      first_failure = rank;
      // The peers of a failed rank cannot finish: stop them now instead of
      // letting them run into their transfer timeouts.
      for (int r = 0; r < world; ++r) {
        if (r != rank) runners[r]->Stop(kLocalJobId);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const double wall = absl::ToDoubleSeconds(absl::Now() - start);
  if (first_failure >= 0) return outcomes[first_failure].status;

  const apapo::v1::LocalRunSummary summary = Summarize(
      spec, planned.graph().name(), description, options.workers, wall, outcomes);
  google::protobuf::util::JsonPrintOptions json;
  json.add_whitespace = true;
  json.preserve_proto_field_names = true;
  json.always_print_primitive_fields = true;
  std::string text;
  if (auto st = google::protobuf::util::MessageToJsonString(summary, &text, json);
      !st.ok()) {
    return absl::InternalError(absl::StrCat("summary to JSON: ", st.ToString()));
  }
  std::fprintf(stderr, "[apapo] done: %s", text.c_str());
  if (options.summary_path.empty()) return absl::OkStatus();
  return WriteSummary(text, options.summary_path);
}

}  // namespace worker
}  // namespace apapo

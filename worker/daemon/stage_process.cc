#include "worker/daemon/stage_process.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/util/time_util.h"
#include "partitioner/plan_proto.h"
#include "partitioner/schedule.h"
#include "worker/daemon/stage_channel.h"
#include "worker/data.h"
#include "worker/model_graph.h"
#include "worker/stage_executor.h"
#include "worker/torchscript_model.h"
#include "worker/transport.h"

namespace apapo::worker {
namespace {

using apapo::v1::AssignStage;
using apapo::v1::MetricsReport;

constexpr absl::Duration kDefaultTimeout = absl::Seconds(120);

absl::Status Prefixed(const std::string& label, const absl::Status& s) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(label, ": ", s.message()));
}

// The executor's and transport's errors already carry the label.
absl::Status Labelled(const std::string& label, const absl::Status& s) {
  if (s.ok() || absl::StrContains(s.message(), label)) return s;
  return Prefixed(label, s);
}

// The schedule the plan prescribes, and the node ids of each stage.
struct StagePlan {
  schedule::ScheduleOptions schedule;
  std::vector<std::vector<std::string>> stage_nodes;
};

absl::StatusOr<StagePlan> PlanFromAssignment(const AssignStage& a) {
  const apapo::v1::Plan& plan = a.plan();
  StagePlan out;
  if (plan.stages_size() == 0) {
    return absl::InvalidArgumentError("plan: no stages");
  }
  auto kind = partitioner::ScheduleFromProto(plan.schedule(), "plan.schedule");
  if (!kind.ok()) return kind.status();
  if (*kind == schedule::ScheduleKind::kDataParallel &&
      plan.stages_size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "plan: data parallelism needs exactly one stage, got ",
        plan.stages_size()));
  }
  out.schedule.kind = *kind;
  out.schedule.num_stages = plan.stages_size();
  bool replicated = false;
  std::vector<int> replicas;
  for (int i = 0; i < plan.stages_size(); ++i) {
    const apapo::v1::Stage& st = plan.stages(i);
    if (st.node_ids().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan.stages[", i, "]: no node ids"));
    }
    out.stage_nodes.emplace_back(st.node_ids().begin(), st.node_ids().end());
    replicas.push_back(std::max(1, st.replicas()));
    replicated |= replicas.back() > 1;
  }
  if (replicated) out.schedule.replicas = replicas;
  const apapo::v1::JobSpec& spec = a.spec();
  out.schedule.micro_batches_per_iteration =
      plan.micro_batches() > 0 ? plan.micro_batches()
      : spec.schedule().has_micro_batches()
          ? spec.schedule().micro_batches()
          : schedule::DefaultMicroBatches(out.schedule.kind, replicas,
                                          spec.data().batch_size());
  if (spec.schedule().has_max_staleness()) {
    // Stage 0's gradient delay is its in-flight depth minus one.
    out.schedule.max_in_flight = spec.schedule().max_staleness() + 1;
  }
  if (absl::Status s = schedule::ValidateScheduleOptions(out.schedule);
      !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("plan: ", s.message()));
  }
  return out;
}

// Turns the executor's progress callbacks (every step) into MetricsReports
// at most every kStageReportInterval, with the throughput since the previous
// report and the durations of the steps since then (time between successive
// updates, not counting intervals that span an evaluation).
class ProgressReporter {
 public:
  // `trains_progress`: this replica is the one the executor calls
  // on_progress on (the last stage's replica 0); the others report their
  // stage counters alone (OnStageReport).
  ProgressReporter(const AssignStage& a, int64_t batch_size,
                   bool trains_progress,
                   std::function<void(const MetricsReport&)> report)
      : job_id_(a.job_id()),
        stage_(a.stage()),
        rank_(a.rendezvous().rank()),
        batch_size_(batch_size),
        trains_progress_(trains_progress),
        report_(std::move(report)),
        last_time_(absl::Now()) {}

  // The executor's counters so far (every step, before OnProgress). Kept for
  // the next progress report; a stage without progress reports sends them on
  // their own, at most every kStageReportInterval.
  void OnStageReport(const StageReport& r) {
    if (!trains_progress_ && counters_.has_value() &&
        r.steps == counters_->steps + 1 &&
        step_seconds_.size() < kMaxPendingSteps) {
      // Training time between two successive updates: train_seconds counts
      // training phases only, so an evaluation in between is left out.
      const double d = r.train_seconds - counters_->train_seconds;
      if (d > 0) step_seconds_.push_back(d);
    }
    counters_ = r;
    if (trains_progress_ || !report_) return;
    const absl::Time now = absl::Now();
    if (sent_ > 0 && now - last_time_ < kStageReportInterval) return;
    MetricsReport m;
    m.set_job_id(job_id_);
    *m.mutable_time() = google::protobuf::util::TimeUtil::GetCurrentTime();
    m.set_step(r.steps);
    m.set_samples(r.samples);
    m.set_samples_per_second(r.train_seconds > 0 ? r.samples / r.train_seconds
                                                 : 0);
    FillStageMetrics(r, stage_, rank_, m.mutable_stage());
    TakeStepSeconds(m.mutable_stage());
    last_time_ = now;
    ++sent_;
    report_(m);
  }

  void OnProgress(const TrainingProgress& p) {
    const absl::Time now = absl::Now();
    // The executor reports an evaluation right after the step's own
    // progress: same step, or a new accuracy.
    const bool evaluated =
        p.test_accuracy >= 0 &&
        (p.step == last_.step || p.test_accuracy != last_.test_accuracy);
    if (!evaluated && p.step > last_.step && last_step_time_.has_value() &&
        step_seconds_.size() < kMaxPendingSteps) {
      step_seconds_.push_back(absl::ToDoubleSeconds(now - *last_step_time_));
    }
    last_step_time_ = now;
    last_ = p;
    if (!report_ || (sent_ > 0 && !evaluated &&
                     now - last_time_ < kStageReportInterval)) {
      return;
    }
    MetricsReport m = Base(p);
    const double dt = absl::ToDoubleSeconds(now - last_time_);
    m.set_samples_per_second(
        dt > 0 && p.step > last_step_
            ? static_cast<double>(p.step - last_step_) * batch_size_ / dt
            : p.samples_per_second);
    if (p.test_accuracy >= 0) m.set_test_accuracy(p.test_accuracy);
    TakeStepSeconds(m.mutable_stage());
    last_time_ = now;
    last_step_ = p.step;
    ++sent_;
    report_(m);
  }

  MetricsReport Base(const TrainingProgress& p) const {
    MetricsReport m;
    m.set_job_id(job_id_);
    *m.mutable_time() = google::protobuf::util::TimeUtil::GetCurrentTime();
    m.set_step(p.step);
    m.set_total_steps(p.total_steps);
    m.set_epoch(static_cast<int32_t>(p.epoch));
    m.set_samples(p.step * batch_size_);
    m.set_has_loss(true);
    m.set_loss(p.loss);
    if (counters_.has_value()) {
      FillStageMetrics(*counters_, stage_, rank_, m.mutable_stage());
    } else {
      m.mutable_stage()->set_stage(stage_);
      m.mutable_stage()->set_rank(rank_);
    }
    return m;
  }

  // Moves the step durations not reported yet into `stage`.
  void TakeStepSeconds(apapo::v1::StageMetrics* stage) {
    for (double d : step_seconds_) stage->add_step_seconds(d);
    step_seconds_.clear();
  }

  const TrainingProgress& last() const { return last_; }

 private:
  static constexpr size_t kMaxPendingSteps = 100000;

  const std::string job_id_;
  const int stage_;
  const int rank_;
  const int64_t batch_size_;
  const bool trains_progress_;
  const std::function<void(const MetricsReport&)> report_;
  std::optional<StageReport> counters_;
  TrainingProgress last_;
  absl::Time last_time_;
  int64_t last_step_ = 0;
  int64_t sent_ = 0;
  std::optional<absl::Time> last_step_time_;
  std::vector<double> step_seconds_;
};

absl::Status RunAssignmentOrThrow(
    const AssignStage& a, const std::string& label,
    std::function<void(const MetricsReport&)> report,
    MetricsReport* final_metrics) {
  const apapo::v1::JobSpec& spec = a.spec();
  const apapo::v1::Rendezvous& rv = a.rendezvous();
  auto plan = PlanFromAssignment(a);
  if (!plan.ok()) return Prefixed(label, plan.status());
  const schedule::ScheduleOptions& sched = plan->schedule;
  if (a.stage() < 0 || a.stage() >= sched.num_stages || a.replica() < 0 ||
      a.replica() >= sched.Replicas(a.stage())) {
    return absl::InvalidArgumentError(absl::StrCat(
        label, ": the plan has no such stage replica (", sched.num_stages,
        " stage(s))"));
  }
  int world = 0;
  for (int s = 0; s < sched.num_stages; ++s) world += sched.Replicas(s);
  const int world_size = rv.world_size() > 0 ? rv.world_size() : 1;
  if (world != world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        label, ": the plan has ", world, " stage replica(s) but the ",
        "rendezvous world size is ", world_size));
  }
  const int expected_rank =
      StageExecutor::RankOf(sched, a.stage(), a.replica());
  if (rv.rank() != expected_rank) {
    return absl::InvalidArgumentError(absl::StrCat(
        label, ": ranks are numbered stage-major, so this replica is rank ",
        expected_rank, ", not ", rv.rank()));
  }

  auto proto_graph = GraphForJob(spec, TorchScriptGraph);
  if (!proto_graph.ok()) return Prefixed(label, proto_graph.status());
  // The plan's stages name the nodes of the split graph.
  std::vector<std::pair<std::string, int>> splits;
  for (const auto& split : a.plan().splits()) {
    splits.emplace_back(split.node_id(), split.parts());
  }
  proto_graph = SplitLinearLayers(*std::move(proto_graph), splits);
  if (!proto_graph.ok()) return Prefixed(label, proto_graph.status());
  auto graph = AnalyzedGraph::Create(*std::move(proto_graph));
  if (!graph.ok()) return Prefixed(label, graph.status());
  auto layouts = LayoutStages(*graph, plan->stage_nodes);
  if (!layouts.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": the plan does not fit the model '",
                     graph->graph().name(), "': ", layouts.status().message()));
  }
  auto data = LoadData(spec.data(), spec.seed());
  if (!data.ok()) return Prefixed(label, data.status());

  std::unique_ptr<Transport> transport;
  if (world_size > 1) {
    GlooTransportOptions t;
    t.store_host = rv.store_host().empty() ? "127.0.0.1" : rv.store_host();
    t.store_port = rv.store_port();
    t.host = rv.local_host().empty() ? "127.0.0.1" : rv.local_host();
    t.store_prefix = rv.prefix().empty() ? a.job_id() : rv.prefix();
    t.rank = rv.rank();
    t.world_size = world_size;
    t.timeout = rv.has_timeout()
                    ? absl::Seconds(rv.timeout().seconds()) +
                          absl::Nanoseconds(rv.timeout().nanos())
                    : kDefaultTimeout;
    if (t.timeout <= absl::ZeroDuration()) t.timeout = kDefaultTimeout;
    t.label = label;
    int next = 0;
    for (int s = 0; s < sched.num_stages; ++s) {
      std::vector<int> group;
      for (int r = 0; r < sched.Replicas(s); ++r) group.push_back(next++);
      t.groups.push_back(group);
    }
    if (t.store_port <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(label, ": the rendezvous has no store port"));
    }
    auto created = CreateGlooTransport(t);
    if (!created.ok()) return Labelled(label, created.status());
    transport = *std::move(created);
  }

  const int64_t batch_size = spec.data().batch_size();
  ProgressReporter progress(
      a, batch_size,
      a.stage() == sched.num_stages - 1 && a.replica() == 0,
      std::move(report));
  ExecutorConfig c;
  c.graph = &*graph;
  c.layouts = *layouts;
  c.stage = a.stage();
  c.replica = a.replica();
  c.schedule = sched;
  ApplyJobSpec(spec, &c);
  // Every step; ProgressReporter throttles by time.
  c.progress_every = 1;
  c.on_progress = [&progress](const TrainingProgress& p) {
    progress.OnProgress(p);
  };
  c.on_stage_report = [&progress](const StageReport& r) {
    progress.OnStageReport(r);
  };
  auto exec = StageExecutor::Create(c, transport.get(), data->train.get(),
                                    data->test.get());
  if (!exec.ok()) return Labelled(label, exec.status());
  if (absl::Status run = (*exec)->Run(); !run.ok()) {
    return Labelled(label, run);
  }

  const StageReport r = (*exec)->Report();
  MetricsReport m;
  m.set_job_id(a.job_id());
  *m.mutable_time() = google::protobuf::util::TimeUtil::GetCurrentTime();
  m.set_step(r.steps);
  m.set_total_steps(progress.last().total_steps > 0
                        ? progress.last().total_steps
                        : r.steps);
  m.set_epoch(static_cast<int32_t>(progress.last().epoch));
  // This replica's share: the coordinator sums the last stage's replicas.
  // (Progress reports come from replica 0 alone and carry the pipeline's.)
  m.set_samples(r.samples);
  m.set_samples_per_second(
      r.train_seconds > 0 ? r.samples / r.train_seconds : 0);
  if (a.stage() == sched.num_stages - 1) {
    m.set_has_loss(true);
    m.set_loss(r.final_loss);
  }
  if (r.test_accuracy >= 0) m.set_test_accuracy(r.test_accuracy);
  auto* sm = m.mutable_stage();
  FillStageMetrics(r, a.stage(), rv.rank(), sm);
  progress.TakeStepSeconds(sm);
  if (final_metrics != nullptr) *final_metrics = std::move(m);
  return absl::OkStatus();
}

void BoundComputeThreads(int threads) {
  at::set_num_threads(threads);
  // OpenBLAS keeps its own pool (see docs/BAZEL_OFFLINE.md); the parent also
  // sets OPENBLAS_NUM_THREADS, which it reads at load time.
  using SetThreads = void (*)(int);
  if (auto fn = reinterpret_cast<SetThreads>(
          dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    fn(threads);
  }
}

class TcpJobStore : public JobStore {
 public:
  explicit TcpJobStore(std::unique_ptr<StoreServer> server)
      : server_(std::move(server)) {}
  int port() const override { return server_->port(); }

 private:
  std::unique_ptr<StoreServer> server_;
};

}  // namespace

absl::Status RunAssignment(const AssignStage& a,
                           std::function<void(const MetricsReport&)> report,
                           MetricsReport* final_metrics) {
  const std::string label =
      absl::StrCat("stage ", a.stage(), " replica ", a.replica(), " (rank ",
                   a.rendezvous().rank(), ")");
  try {
    return RunAssignmentOrThrow(a, label, std::move(report), final_metrics);
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat(label, ": LibTorch error: ", e.what()));
  }
}

int RunAssignmentChildMain(const std::string& path) {
  // Frames go to the original stdout; anything else printed to stdout
  // (library chatter) would corrupt them, so stdout becomes stderr.
  const int out_fd = fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 3);
  if (out_fd < 0 || dup2(STDERR_FILENO, STDOUT_FILENO) < 0) {
    std::fprintf(stderr, "apapo-worker: cannot set up the daemon pipe: %s\n",
                 std::strerror(errno));
    std::fflush(stderr);
    _exit(2);
  }
  FrameWriter writer(out_fd);
  auto finish = [&](const absl::Status& s, int code) {
    if (!s.ok()) {
      std::fprintf(stderr, "apapo-worker stage process: %s\n",
                   s.ToString().c_str());
    }
    (void)writer.Write(FrameType::kStatus, EncodeStatus(s));
    std::fflush(stderr);
    // No unwinding: c10d's teardown can block on peers that are gone.
    _exit(code);
    return code;
  };

  AssignStage a;
  {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    if (!in || !a.ParseFromString(ss.str())) {
      return finish(absl::InvalidArgumentError(absl::StrCat(
                        "cannot read a serialized AssignStage from '", path,
                        "'")),
                    2);
    }
  }
  const int threads = a.spec().resources().threads_per_worker() > 0
                          ? a.spec().resources().threads_per_worker()
                          : 1;
  BoundComputeThreads(threads);
  MetricsReport final_metrics;
  absl::Status status = RunAssignment(
      a,
      [&writer](const MetricsReport& m) {
        // A broken pipe means the daemon is gone: SIGPIPE ends us.
        (void)writer.Write(FrameType::kMetrics, m.SerializeAsString());
      },
      &final_metrics);
  if (status.ok()) {
    (void)writer.Write(FrameType::kFinal, final_metrics.SerializeAsString());
  }
  return finish(status, status.ok() ? 0 : 1);
}

absl::StatusOr<std::unique_ptr<JobStore>> StartJobStore() {
  // c10d's TCPStore server listens on every interface whatever host it is
  // given, so ranks on other hosts reach it at the worker's --host.
  auto server = StartStoreServer("127.0.0.1");
  if (!server.ok()) return server.status();
  return std::unique_ptr<JobStore>(new TcpJobStore(*std::move(server)));
}

}  // namespace apapo::worker

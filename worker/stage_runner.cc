#include "worker/stage_runner.h"

#include <torch/torch.h>

#include <algorithm>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/proto_time.h"
#include "common/status_macros.h"
#include "worker/checkpoint_store.h"
#include "worker/file_system.h"
#include "worker/model_graph.h"
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

// The runner's StageObserver: turns the executor's counters and progress
// (every step) into MetricsReports at most every kStageReportInterval, with the throughput since the previous
// report and the durations of the steps since then (time between successive
// updates, not counting intervals that span an evaluation).
class ProgressReporter : public StageObserver {
 public:
  // `trains_progress`: this replica is the one the executor calls
  // OnProgress on (the last stage's replica 0); the others report their
  // stage counters alone (OnCounters).
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
  void OnCounters(const StageReport& r) override {
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
    *m.mutable_time() = apapo::NowTimestamp();
    m.set_step(r.steps);
    m.set_resumed_step(r.resumed_step);
    m.set_checkpoint_step(r.checkpoint_step);
    m.set_samples(r.samples);
    m.set_samples_per_second(
        SteadySamplesPerSecond(r, static_cast<double>(r.samples)));
    FillStageMetrics(r, stage_, rank_, m.mutable_stage());
    TakeStepSeconds(m.mutable_stage());
    last_time_ = now;
    ++sent_;
    report_(m);
  }

  void OnProgress(const TrainingProgress& p) override {
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

  // The trace window's spans, in a report of their own (metrics.proto's
  // MetricsReport.trace): job_id and the trace, nothing else.
  void OnTrace(const apapo::v1::StageTrace& trace) override {
    if (!report_) return;
    MetricsReport m;
    m.set_job_id(job_id_);
    *m.mutable_trace() = trace;
    report_(m);
  }

  MetricsReport Base(const TrainingProgress& p) const {
    MetricsReport m;
    m.set_job_id(job_id_);
    *m.mutable_time() = apapo::NowTimestamp();
    m.set_step(p.step);
    m.set_total_steps(p.total_steps);
    m.set_epoch(static_cast<int32_t>(p.epoch));
    m.set_samples(p.step * batch_size_);
    m.set_has_loss(true);
    m.set_loss(p.loss);
    if (counters_.has_value()) {
      m.set_resumed_step(counters_->resumed_step);
      m.set_checkpoint_step(counters_->checkpoint_step);
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


// The rank's Gloo transport; null for a world of one.
absl::StatusOr<std::unique_ptr<Transport>> JoinProcessGroup(
    const AssignStage& a, const planning::StagePlan& plan,
    const std::string& label) {
  const apapo::v1::Rendezvous& rv = a.rendezvous();
  if (plan.world_size <= 1) return std::unique_ptr<Transport>();
  GlooTransportOptions t;
  t.store_host = rv.store_host().empty() ? "127.0.0.1" : rv.store_host();
  t.store_port = rv.store_port();
  t.host = rv.local_host().empty() ? "127.0.0.1" : rv.local_host();
  t.store_prefix = rv.prefix().empty() ? a.job_id() : rv.prefix();
  t.rank = rv.rank();
  t.world_size = plan.world_size;
  t.timeout = rv.has_timeout() ? absl::Seconds(rv.timeout().seconds()) +
                                     absl::Nanoseconds(rv.timeout().nanos())
                               : kDefaultTimeout;
  if (t.timeout <= absl::ZeroDuration()) t.timeout = kDefaultTimeout;
  t.label = label;
  // The stages' replica groups, then every rank (StageExecutor's
  // convention: evaluation results are summed over the last group).
  std::vector<int> world;
  for (int s = 0; s < plan.schedule.num_stages; ++s) {
    std::vector<int> group;
    for (int r = 0; r < plan.schedule.Replicas(s); ++r) {
      group.push_back(plan.RankOf(s, r));
      world.push_back(plan.RankOf(s, r));
    }
    t.groups.push_back(group);
  }
  t.groups.push_back(world);
  if (t.store_port <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": the rendezvous has no store port"));
  }
  auto created = CreateGlooTransport(t);
  if (!created.ok()) return Labelled(label, created.status());
  return created;
}

absl::Status RunStageOrThrow(const AssignStage& a, const std::string& label,
                             std::function<void(const MetricsReport&)> report,
                             MetricsReport* final_metrics,
                             const StageRunHooks& hooks) {
  const apapo::v1::JobSpec& spec = a.spec();
  const apapo::v1::Rendezvous& rv = a.rendezvous();
  APAPO_ASSIGN_OR_RETURN(planning::StagePlan plan,
                         planning::StagePlanFor(spec, a.plan()),
                         Prefixed(label, _));
  APAPO_ASSIGN_OR_RETURN(ExecutorConfig c,
                         ExecutorConfigFor(spec, plan, a.stage(), a.replica()),
                         Prefixed(label, _));
  const int world_size = rv.world_size() > 0 ? rv.world_size() : 1;
  if (plan.world_size != world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        label, ": the plan has ", plan.world_size, " stage replica(s) but the ",
        "rendezvous world size is ", world_size));
  }
  const int expected_rank = plan.RankOf(a.stage(), a.replica());
  if (rv.rank() != expected_rank) {
    return absl::InvalidArgumentError(absl::StrCat(
        label, ": ranks are numbered stage-major, so this replica is rank ",
        expected_rank, ", not ", rv.rank()));
  }

  // The plan's stages name the nodes of the split graph.
  APAPO_ASSIGN_OR_RETURN(apapo::v1::ModelGraph proto_graph,
                         GraphForJob(spec, TorchScriptGraph),
                         Prefixed(label, _));
  APAPO_ASSIGN_OR_RETURN(proto_graph,
                         SplitLinearLayers(std::move(proto_graph), plan.splits),
                         Prefixed(label, _));
  APAPO_ASSIGN_OR_RETURN(AnalyzedGraph graph,
                         AnalyzedGraph::Create(std::move(proto_graph)),
                         Prefixed(label, _));
  APAPO_ASSIGN_OR_RETURN(
      c.layouts, LayoutStages(graph, plan.stage_nodes),
      absl::InvalidArgumentError(absl::StrCat(
          label, ": the plan does not fit the model '", graph.graph().name(),
          "': ", _.message())));
  c.graph = &graph;
  DataSplit loaded;
  const DataSplit* data = hooks.data;
  if (data == nullptr) {
    APAPO_ASSIGN_OR_RETURN(loaded, LoadData(spec.data(), spec.seed()),
                           Prefixed(label, _));
    data = &loaded;
  }
  APAPO_ASSIGN_OR_RETURN(std::unique_ptr<Transport> transport,
                         JoinProcessGroup(a, plan, label));

  const int64_t batch_size = spec.data().batch_size();
  ProgressReporter progress(
      a, batch_size,
      a.stage() == plan.schedule.num_stages - 1 && a.replica() == 0,
      std::move(report));
  // Every step; ProgressReporter throttles by time.
  c.progress_every = 1;
  c.observer = &progress;
  std::unique_ptr<CheckpointStore> checkpoints;
  if (!spec.checkpoint().directory().empty()) {
    checkpoints = std::make_unique<FileCheckpointStore>(
        spec.checkpoint().directory(), spec.checkpoint().every_steps(),
        &graph, LocalFileSystem());
    c.checkpoint.store = checkpoints.get();
  }
  if (hooks.configure) hooks.configure(&c);
  APAPO_ASSIGN_OR_RETURN(
      std::unique_ptr<StageExecutor> exec,
      StageExecutor::Create(c, transport.get(), data->train.get(),
                            data->test.get()),
      Labelled(label, _));
  absl::Status run = exec->Run();
  if (hooks.finished) hooks.finished(*exec);
  if (!run.ok()) return Labelled(label, run);

  const StageReport r = exec->Report();
  MetricsReport m;
  m.set_job_id(a.job_id());
  *m.mutable_time() = apapo::NowTimestamp();
  m.set_step(r.steps);
  m.set_resumed_step(r.resumed_step);
  m.set_checkpoint_step(r.checkpoint_step);
  m.set_total_steps(progress.last().total_steps > 0
                        ? progress.last().total_steps
                        : r.steps);
  m.set_epoch(static_cast<int32_t>(progress.last().epoch));
  // This replica's share: the coordinator sums the last stage's replicas.
  // (Progress reports come from replica 0 alone and carry the pipeline's.)
  m.set_samples(r.samples);
  m.set_samples_per_second(
      SteadySamplesPerSecond(r, static_cast<double>(r.samples)));
  if (a.stage() == plan.schedule.num_stages - 1) {
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

}  // namespace

absl::StatusOr<ExecutorConfig> ExecutorConfigFor(const apapo::v1::JobSpec& spec,
                                                 const planning::StagePlan& plan,
                                                 int stage, int replica) {
  if (stage < 0 || stage >= plan.schedule.num_stages || replica < 0 ||
      replica >= plan.schedule.Replicas(stage)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the plan has no such stage replica (", plan.schedule.num_stages,
        " stage(s))"));
  }
  ExecutorConfig c;
  c.stage = stage;
  c.replica = replica;
  c.schedule = plan.schedule;
  c.seed = spec.seed();
  c.data.batch_size = spec.data().batch_size();
  c.data.shuffle = spec.data().shuffle();
  c.optimizer = spec.optimizer();
  c.weight_prediction = planning::WeightPredictionRequested(spec);
  c.wire_precision = WirePrecisionFor(spec);
  c.skip_zeros = plan.skip_zeros;
  c.split_backward = plan.split_backward;
  c.allreduce_in_parts = plan.allreduce_in_parts;
  // No epoch limit means "until max_steps".
  c.limits.epochs = spec.limits().epochs() > 0 ? spec.limits().epochs() : 1 << 20;
  c.limits.max_steps = spec.limits().max_steps();
  c.limits.target_accuracy = spec.limits().target_accuracy();
  c.evaluation.every_epochs =
      spec.eval_every_epochs() > 0 ? spec.eval_every_epochs() : 1;
  c.evaluation.batch_size = spec.data().eval_batch_size() > 0
                                ? spec.data().eval_batch_size()
                                : std::max(spec.data().batch_size(), 500);
  // The store itself is the caller's (it owns the files).
  c.checkpoint.every_steps = spec.checkpoint().every_steps();
  c.checkpoint.resume = spec.checkpoint().resume();
  return c;
}

absl::Status RunStage(const AssignStage& a,
                      std::function<void(const MetricsReport&)> report,
                      MetricsReport* final_metrics, const StageRunHooks& hooks) {
  const std::string label =
      absl::StrCat("stage ", a.stage(), " replica ", a.replica(), " (rank ",
                   a.rendezvous().rank(), ")");
  try {
    return RunStageOrThrow(a, label, std::move(report), final_metrics, hooks);
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat(label, ": LibTorch error: ", e.what()));
  }
}

}  // namespace apapo::worker

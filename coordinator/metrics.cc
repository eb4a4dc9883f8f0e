#include "coordinator/metrics.h"

#include <algorithm>
#include <cctype>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/time_util.h"

namespace apapo::coordinator {
namespace {

std::string Lower(std::string s, const std::string& prefix) {
  if (s.rfind(prefix, 0) == 0) s = s.substr(prefix.size());
  std::transform(s.begin(), s.end(), s.begin(), ::tolower);
  return s;
}

prometheus::ClientMetric GaugeMetric(
    double value, std::vector<prometheus::ClientMetric::Label> labels) {
  prometheus::ClientMetric m;
  m.label = std::move(labels);
  m.gauge.value = value;
  return m;
}

}  // namespace

// Jobs and workers by state, and heartbeat ages, read at scrape time.
class CoordinatorMetrics::StateCollector : public prometheus::Collectable {
 public:
  StateCollector(JobManager* jobs, WorkerRegistry* workers, Clock* clock)
      : jobs_(jobs), workers_(workers), clock_(clock) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<prometheus::MetricFamily> out(3);
    auto& jobs = out[0];
    jobs.name = "apapo_jobs";
    jobs.help = "Jobs known to the coordinator, by state.";
    jobs.type = prometheus::MetricType::Gauge;
    auto job_counts = jobs_->CountByState();
    for (int s = apapo::v1::JOB_STATE_QUEUED; s <= apapo::v1::JOB_STATE_CANCELLED; ++s) {
      auto state = static_cast<apapo::v1::JobState>(s);
      jobs.metric.push_back(GaugeMetric(
          job_counts[state],
          {{"state", Lower(apapo::v1::JobState_Name(state), "JOB_STATE_")}}));
    }
    auto& workers = out[1];
    workers.name = "apapo_workers";
    workers.help = "Registered worker daemons, by state.";
    workers.type = prometheus::MetricType::Gauge;
    auto worker_counts = workers_->CountByState();
    for (int s = apapo::v1::WORKER_STATE_IDLE; s <= apapo::v1::WORKER_STATE_LOST; ++s) {
      auto state = static_cast<apapo::v1::WorkerState>(s);
      workers.metric.push_back(GaugeMetric(
          worker_counts[state],
          {{"state", Lower(apapo::v1::WorkerState_Name(state), "WORKER_STATE_")}}));
    }
    auto& age = out[2];
    age.name = "apapo_worker_heartbeat_age_seconds";
    age.help = "Seconds since each connected worker's last heartbeat.";
    age.type = prometheus::MetricType::Gauge;
    absl::Time now = clock_->Now();
    for (const auto& [worker, last] : workers_->LastHeartbeats()) {
      age.metric.push_back(GaugeMetric(absl::ToDoubleSeconds(now - last),
                                       {{"worker", worker}}));
    }
    return out;
  }

 private:
  JobManager* const jobs_;
  WorkerRegistry* const workers_;
  Clock* const clock_;
};

CoordinatorMetrics::CoordinatorMetrics(prometheus::Registry* registry,
                                       JobManager* jobs,
                                       WorkerRegistry* workers, Clock* clock,
                                       absl::Duration retention)
    : clock_(clock),
      retention_(retention),
      state_(std::make_shared<StateCollector>(jobs, workers, clock)),
      submitted_(prometheus::BuildCounter()
                     .Name("apapo_jobs_submitted_total")
                     .Help("Jobs accepted by SubmitJob.")
                     .Register(*registry)),
      finished_(prometheus::BuildCounter()
                    .Name("apapo_jobs_finished_total")
                    .Help("Jobs that reached a final state, by state (succeeded, "
                          "failed, cancelled).")
                    .Register(*registry)),
      registrations_(prometheus::BuildCounter()
                         .Name("apapo_worker_registrations_total")
                         .Help("Worker registrations, reconnects included.")
                         .Register(*registry)),
      lost_(prometheus::BuildCounter()
                .Name("apapo_workers_lost_total")
                .Help("Workers marked lost (stream ended or heartbeat timeout).")
                .Register(*registry)),
      samples_per_second_(prometheus::BuildGauge()
                              .Name("apapo_stage_samples_per_second")
                              .Help("Recent training throughput of a stage replica.")
                              .Register(*registry)),
      samples_(prometheus::BuildCounter()
                   .Name("apapo_stage_samples_total")
                   .Help("Training samples processed by a stage replica.")
                   .Register(*registry)),
      step_seconds_(prometheus::BuildHistogram()
                        .Name("apapo_stage_step_seconds")
                        .Help("Duration of optimizer steps on a stage replica.")
                        .Register(*registry)),
      bytes_sent_(prometheus::BuildCounter()
                      .Name("apapo_stage_sent_bytes_total")
                      .Help("Bytes a stage replica sent to other ranks.")
                      .Register(*registry)),
      stage_seconds_(prometheus::BuildCounter()
                         .Name("apapo_stage_time_seconds_total")
                         .Help("Stage replica time by activity: busy (compute), "
                               "idle (waiting), comm (exposed communication), "
                               "checkpoint (handing a snapshot to the writer).")
                         .Register(*registry)),
      checkpoint_write_cpu_(
          prometheus::BuildCounter()
              .Name("apapo_stage_checkpoint_write_cpu_seconds_total")
              .Help("CPU time of a stage replica's background checkpoint writes.")
              .Register(*registry)),
      loss_(prometheus::BuildGauge()
                .Name("apapo_job_loss")
                .Help("Recent training loss reported by the last stage.")
                .Register(*registry)),
      accuracy_(prometheus::BuildGauge()
                    .Name("apapo_job_test_accuracy_ratio")
                    .Help("Last test-set accuracy, 0..1.")
                    .Register(*registry)),
      staleness_(prometheus::BuildGauge()
                     .Name("apapo_stage_max_staleness_updates")
                     .Help("Largest gradient delay seen on a stage, in updates.")
                     .Register(*registry)),
      restarts_(prometheus::BuildCounter()
                    .Name("apapo_job_restarts_total")
                    .Help("Restarts of jobs after a fault (a lost worker, a stage "
                          "failed by its peer), re-planned on the workers left.")
                    .Register(*registry)),
      recovery_seconds_(prometheus::BuildHistogram()
                            .Name("apapo_job_recovery_seconds")
                            .Help("Seconds from a fault to the first step the "
                                  "restarted job trained.")
                            .Register(*registry)) {
  recovery_ = &recovery_seconds_.Add(
      {}, prometheus::Histogram::BucketBoundaries{1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600});
  restarts_.Add({});
  // Unlabelled counters exist from the start at 0, so rate() and increase()
  // see their first event (a counter that appears at 1 has no increase).
  submitted_.Add({});
  for (apapo::v1::JobState state :
       {apapo::v1::JOB_STATE_SUCCEEDED, apapo::v1::JOB_STATE_FAILED,
        apapo::v1::JOB_STATE_CANCELLED}) {
    finished_.Add({{"state", Lower(apapo::v1::JobState_Name(state), "JOB_STATE_")}});
  }
  registrations_.Add({});
  lost_.Add({});
}

std::shared_ptr<prometheus::Collectable> CoordinatorMetrics::state_collectable()
    const {
  return state_;
}

void CoordinatorMetrics::OnJobSubmitted() { submitted_.Add({}).Increment(); }

void CoordinatorMetrics::OnJobFinished(apapo::v1::JobState state) {
  finished_.Add({{"state", Lower(apapo::v1::JobState_Name(state), "JOB_STATE_")}})
      .Increment();
}

void CoordinatorMetrics::OnWorkerRegistered(const std::string&) {
  registrations_.Add({}).Increment();
}

void CoordinatorMetrics::OnWorkerLost(const std::string&) {
  lost_.Add({}).Increment();
}

CoordinatorMetrics::StageSeries& CoordinatorMetrics::SeriesLocked(
    JobSeries& job, const std::string& job_id, const std::string& worker,
    int stage) {
  auto [it, inserted] = job.stages.try_emplace({worker, stage});
  StageSeries& s = it->second;
  if (!inserted) return s;
  std::map<std::string, std::string> labels{
      {"job_id", job_id}, {"stage", absl::StrCat(stage)}, {"worker", worker}};
  auto with_activity = [&](const char* activity) {
    auto l = labels;
    l["activity"] = activity;
    return &stage_seconds_.Add(l);
  };
  static const auto* kBuckets = new prometheus::Histogram::BucketBoundaries{
      0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
  s.samples_per_second = &samples_per_second_.Add(labels);
  s.staleness = &staleness_.Add(labels);
  s.step_seconds = &step_seconds_.Add(labels, *kBuckets);
  s.samples = &samples_.Add(labels);
  s.bytes_sent = &bytes_sent_.Add(labels);
  s.busy = with_activity("busy");
  s.idle = with_activity("idle");
  s.comm = with_activity("comm");
  s.checkpoint = with_activity("checkpoint");
  s.checkpoint_write_cpu = &checkpoint_write_cpu_.Add(labels);
  return s;
}

void CoordinatorMetrics::OnMetrics(const std::string& job_id,
                                   const apapo::v1::MetricsReport& report) {
  const auto& m = report.stage();
  absl::MutexLock lock(&mu_);
  ExpireLocked();
  JobSeries& job = jobs_[job_id];
  StageSeries& s = SeriesLocked(job, job_id, report.worker_id(), m.stage());
  s.samples_per_second->Set(report.samples_per_second());
  s.staleness->Set(m.max_staleness());
  for (double d : m.step_seconds()) s.step_seconds->Observe(d);
  if (report.has_loss()) {
    if (job.loss == nullptr) job.loss = &loss_.Add({{"job_id", job_id}});
    job.loss->Set(report.loss());
  }
  if (report.has_test_accuracy()) {
    if (job.accuracy == nullptr) job.accuracy = &accuracy_.Add({{"job_id", job_id}});
    job.accuracy->Set(report.test_accuracy());
  }
  // Workers report running totals: add what grew since the last report.
  auto add = [](prometheus::Counter* counter, double now, double& before) {
    if (now > before) {
      counter->Increment(now - before);
      before = now;
    }
  };
  add(s.samples, static_cast<double>(report.samples()), s.last_samples);
  add(s.bytes_sent, static_cast<double>(m.bytes_sent()), s.last_bytes);
  add(s.busy, m.busy_seconds(), s.last_busy);
  add(s.idle, m.idle_seconds(), s.last_idle);
  add(s.comm, m.comm_exposed_seconds(), s.last_comm);
  add(s.checkpoint, m.checkpoint_seconds(), s.last_checkpoint);
  add(s.checkpoint_write_cpu, m.checkpoint_write_cpu_seconds(),
      s.last_checkpoint_write_cpu);
}

void CoordinatorMetrics::OnJobRestarted(const std::string& job_id) {
  restarts_.Add({}).Increment();
  // The restarted stages count their totals from 0 again.
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  for (auto& [key, s] : it->second.stages) {
    s.last_samples = s.last_bytes = 0;
    s.last_busy = s.last_idle = s.last_comm = 0;
    s.last_checkpoint = s.last_checkpoint_write_cpu = 0;
  }
}

void CoordinatorMetrics::OnJobRecovered(const std::string&, double seconds) {
  recovery_->Observe(seconds);
}

void CoordinatorMetrics::OnJobEnded(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it != jobs_.end() && !it->second.ended) {
    it->second.ended = true;
    ended_.emplace_back(clock_->Now(), job_id);
  }
  ExpireLocked();
}

void CoordinatorMetrics::ExpireLocked() {
  const absl::Time now = clock_->Now();
  while (!ended_.empty() && now - ended_.front().first >= retention_) {
    auto it = jobs_.find(ended_.front().second);
    ended_.pop_front();
    if (it == jobs_.end()) continue;
    RemoveLocked(it->second);
    jobs_.erase(it);
  }
}

void CoordinatorMetrics::RemoveLocked(JobSeries& job) {
  if (job.loss != nullptr) loss_.Remove(job.loss);
  if (job.accuracy != nullptr) accuracy_.Remove(job.accuracy);
  for (auto& [key, s] : job.stages) {
    samples_per_second_.Remove(s.samples_per_second);
    staleness_.Remove(s.staleness);
    step_seconds_.Remove(s.step_seconds);
    samples_.Remove(s.samples);
    bytes_sent_.Remove(s.bytes_sent);
    stage_seconds_.Remove(s.busy);
    stage_seconds_.Remove(s.idle);
    stage_seconds_.Remove(s.comm);
    stage_seconds_.Remove(s.checkpoint);
    checkpoint_write_cpu_.Remove(s.checkpoint_write_cpu);
  }
}

}  // namespace apapo::coordinator

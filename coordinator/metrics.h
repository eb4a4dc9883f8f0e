// CoordinatorMetrics: the coordinator's Prometheus metrics (prometheus-cpp),
// named per Prometheus conventions with the apapo_ prefix and base units.
//
// State gauges (jobs and workers by state, heartbeat age) are computed at
// scrape time from the JobManager and WorkerRegistry (a Collectable); the
// rest is fed by events: metrics reports (OnMetrics), registrations and lost
// workers. Heartbeats cost the metrics nothing. Cumulative counters reported
// by workers are turned into Prometheus counters by adding the increase
// since the previous report.
//
// A report touches only its own series: they are looked up once per (job,
// worker, stage) and kept, so a report costs O(series it updates), not a
// label-set search per family. A job's series are removed `retention` after
// it ends (checked on each event), so a long-lived coordinator does not
// accumulate them.
//
// Thread-safety: all methods are thread-safe.
#ifndef APAPO_COORDINATOR_METRICS_H_
#define APAPO_COORDINATOR_METRICS_H_

#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/clock.h"
#include "coordinator/job_manager.h"
#include "coordinator/scheduler.h"
#include "coordinator/worker_registry.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace apapo::coordinator {

class CoordinatorMetrics : public SchedulerObserver {
 public:
  // Registers every family in `registry`. The other pointers must outlive
  // this object.
  CoordinatorMetrics(prometheus::Registry* registry, JobManager* jobs,
                     WorkerRegistry* workers, Clock* clock,
                     absl::Duration retention = absl::Minutes(5));

  // The scrape-time state collectable; register it with the Exposer too.
  std::shared_ptr<prometheus::Collectable> state_collectable() const;

  void OnMetrics(const std::string& job_id,
                 const apapo::v1::MetricsReport& report) override;
  void OnJobEnded(const std::string& job_id) override;
  void OnJobRestarted(const std::string& job_id) override;
  void OnJobRecovered(const std::string& job_id, double seconds) override;
  void OnWorkerRegistered(const std::string& worker_id);
  void OnWorkerLost(const std::string& worker_id);
  void OnJobSubmitted();
  // A job reached a final state (JobManager's end hook).
  void OnJobFinished(apapo::v1::JobState state);

 private:
  class StateCollector;
  // One stage replica's series, and the cumulative values last reported.
  struct StageSeries {
    prometheus::Gauge* samples_per_second = nullptr;
    prometheus::Gauge* staleness = nullptr;
    prometheus::Histogram* step_seconds = nullptr;
    prometheus::Counter* samples = nullptr;
    prometheus::Counter* bytes_sent = nullptr;
    prometheus::Counter* busy = nullptr;
    prometheus::Counter* idle = nullptr;
    prometheus::Counter* comm = nullptr;
    prometheus::Counter* checkpoint = nullptr;
    prometheus::Counter* checkpoint_write_cpu = nullptr;
    double last_samples = 0, last_bytes = 0;
    double last_busy = 0, last_idle = 0, last_comm = 0;
    double last_checkpoint = 0, last_checkpoint_write_cpu = 0;
  };
  struct JobSeries {
    prometheus::Gauge* loss = nullptr;
    prometheus::Gauge* accuracy = nullptr;
    std::map<std::pair<std::string, int>, StageSeries> stages;  // (worker, stage)
    bool ended = false;
  };

  StageSeries& SeriesLocked(JobSeries& job, const std::string& job_id,
                            const std::string& worker, int stage)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes the series of jobs that ended more than `retention_` ago.
  void ExpireLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RemoveLocked(JobSeries& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Clock* const clock_;
  const absl::Duration retention_;

  std::shared_ptr<StateCollector> state_;
  prometheus::Family<prometheus::Counter>& submitted_;
  prometheus::Family<prometheus::Counter>& finished_;
  prometheus::Family<prometheus::Counter>& registrations_;
  prometheus::Family<prometheus::Counter>& lost_;
  prometheus::Family<prometheus::Gauge>& samples_per_second_;
  prometheus::Family<prometheus::Counter>& samples_;
  prometheus::Family<prometheus::Histogram>& step_seconds_;
  prometheus::Family<prometheus::Counter>& bytes_sent_;
  prometheus::Family<prometheus::Counter>& stage_seconds_;
  prometheus::Family<prometheus::Counter>& checkpoint_write_cpu_;
  prometheus::Family<prometheus::Gauge>& loss_;
  prometheus::Family<prometheus::Gauge>& accuracy_;
  prometheus::Family<prometheus::Gauge>& staleness_;
  prometheus::Family<prometheus::Counter>& restarts_;
  prometheus::Family<prometheus::Histogram>& recovery_seconds_;
  prometheus::Histogram* recovery_ = nullptr;  // the unlabelled series

  absl::Mutex mu_;
  std::map<std::string, JobSeries> jobs_ ABSL_GUARDED_BY(mu_);
  // Ended jobs with series, oldest first: (end time, job id).
  std::deque<std::pair<absl::Time, std::string>> ended_ ABSL_GUARDED_BY(mu_);
};

}  // namespace apapo::coordinator

#endif  // APAPO_COORDINATOR_METRICS_H_

// CoordinatorMetrics: the coordinator's Prometheus metrics (prometheus-cpp),
// named per Prometheus conventions with the apapo_ prefix and base units.
//
// State gauges (jobs and workers by state, heartbeat age) are computed at
// scrape time from the JobManager and WorkerRegistry (a Collectable); the
// rest is fed by events: metrics reports (OnMetrics), registrations and lost
// workers. Cumulative counters reported by workers are turned into
// Prometheus counters by adding the increase since the previous report.
//
// Thread-safety: all methods are thread-safe.
#ifndef APAPO_COORDINATOR_METRICS_H_
#define APAPO_COORDINATOR_METRICS_H_

#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/synchronization/mutex.h"
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
                     WorkerRegistry* workers, Clock* clock);

  // The scrape-time state collectable; register it with the Exposer too.
  std::shared_ptr<prometheus::Collectable> state_collectable() const;

  void OnMetrics(const std::string& job_id,
                 const apapo::v1::MetricsReport& report) override;
  void OnWorkerRegistered(const std::string& worker_id);
  void OnWorkerLost(const std::string& worker_id);
  void OnJobSubmitted();

 private:
  class StateCollector;
  struct Last {
    double busy = 0, idle = 0, comm = 0;
    int64_t bytes = 0, samples = 0;
  };

  std::shared_ptr<StateCollector> state_;
  prometheus::Family<prometheus::Counter>& submitted_;
  prometheus::Family<prometheus::Counter>& registrations_;
  prometheus::Family<prometheus::Counter>& lost_;
  prometheus::Family<prometheus::Gauge>& samples_per_second_;
  prometheus::Family<prometheus::Counter>& samples_;
  prometheus::Family<prometheus::Histogram>& step_seconds_;
  prometheus::Family<prometheus::Counter>& bytes_sent_;
  prometheus::Family<prometheus::Counter>& stage_seconds_;
  prometheus::Family<prometheus::Gauge>& loss_;
  prometheus::Family<prometheus::Gauge>& accuracy_;
  prometheus::Family<prometheus::Gauge>& staleness_;

  absl::Mutex mu_;
  std::map<std::pair<std::string, std::string>, Last> last_ ABSL_GUARDED_BY(mu_);
};

}  // namespace apapo::coordinator

#endif  // APAPO_COORDINATOR_METRICS_H_

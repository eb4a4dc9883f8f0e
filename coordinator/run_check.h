// RunCheck: a running plan's first steps against its prediction.
//
// A plan is made from a profile taken minutes before the run, on machines
// whose speed drifts (bench/cluster/README.md: the same model's profiled
// step moved 2x within one benchmark), and from a cost model that prices
// some things (Gloo's all-reduce on busy cores) worse than they run. When
// the error is large it changes the choice: two hosts on a fast link were
// planned as data parallelism, which ran at 0.73x the pipeline the planner
// rejected. So the coordinator measures each stage over a window of steps
// once the run is warm, compares the rate with the prediction and, when
// they differ by more than a tolerance, turns the measurement into
// calibration factors: per worker, its compute per step measured over
// predicted (busy seconds: forward, backward, update, packing what it
// sends); for the job, the all-reduce per step measured over predicted on
// the stages that have replicas. The scheduler re-plans on the profiles
// scaled by those factors (CalibratedProfiles) and restarts the job on the
// new plan when it predicts enough over what the run measured.
//
// Thread-safety: pure functions.
#ifndef APAPO_COORDINATOR_RUN_CHECK_H_
#define APAPO_COORDINATOR_RUN_CHECK_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "proto/apapo/v1/metrics.pb.h"
#include "proto/apapo/v1/plan.pb.h"
#include "proto/apapo/v1/profile.pb.h"
#include "proto/apapo/v1/worker.pb.h"

namespace apapo::coordinator {

// Calibration factors are kept within [1/kMaxCalibration, kMaxCalibration]:
// a window that measured something stranger than that (a stage stopped
// in a debugger, a clock step) does not make a profile of it. A worker
// held to a quarter of a core computes 6-8x its profile (the e2e test's
// cpu cgroup): a bound of 4 left the running plan simulating at 1.8x its
// measurement and the planner keeping it.
inline constexpr double kMaxCalibration = 10.0;

struct RunCheck {
  // The window, in the slowest stage's steps.
  int64_t steps = 0;
  // Samples/s over the window: the mini-batch over the slowest worker's
  // accounted seconds per step (busy, idle, exposed communication and
  // checkpoint hand-off: the training loop's time, evaluations left out).
  double measured_samples_per_second = 0;
  double predicted_samples_per_second = 0;
  // Per worker of the plan: measured busy seconds per step over the
  // stage's predicted compute_seconds.
  std::map<std::string, double> compute_factor;
  // Measured exposed communication per step over the predicted all-reduce
  // on replicated stages (their median); unset when no stage has replicas.
  std::optional<double> allreduce_factor;
  // The workers of each replicated stage that gave it: whose all-reduce
  // it measured (CalibratedProfiles scales the timings of that span).
  std::vector<std::vector<std::string>> allreduce_groups;

  // predicted / measured - 1.
  double Error() const;
  // Whether Error() is within `tolerance` as Describe() prints it, in whole
  // percent: a check that reads "(+10%)" is within 10%, one at 10.4% too.
  bool Within(double tolerance) const;
  // "measured 372.4 samples/s over 20 steps, predicted 451.0 (+21%);
  //  compute x1.14 on w-1, x1.31 on w-2; all-reduce x1.80".
  std::string Describe() const;
};

// The check over the window from `first` to `last` (each worker's report at
// the window's ends, both counting from the same stage start). Empty when
// a worker of the plan is missing, made no step, or accounted no time.
std::optional<RunCheck> CheckRun(
    const apapo::v1::Plan& plan, int batch_size,
    const std::map<std::string, apapo::v1::MetricsReport>& first,
    const std::map<std::string, apapo::v1::MetricsReport>& last);

// The profiles as the run measured them: each worker's compute times
// scaled by its factor, the all-reduce timings of the span the run's
// replicas all-reduced over by the job's: a host's own
// (ProfileResult.host_allreduce) where a replicated stage stayed inside
// the workers it names, those over every worker where one did not (and
// where the check names no stage). A worker
// whose relative_speed is set (profiles of an adopted job share one model
// profile) gets it rescaled against the reference worker's factor, so
// that speeds stay relative to the reference profile.
std::map<std::string, apapo::v1::ProfileResult> CalibratedProfiles(
    const std::map<std::string, apapo::v1::ProfileResult>& profiles,
    const RunCheck& check, const std::string& reference_worker);

// Whether two plans run the same stages on the same workers in the same
// schedule (the predictions and notes aside).
bool SameShape(const apapo::v1::Plan& a, const apapo::v1::Plan& b);

// "2 stage(s) (1, 1 replica(s)) async" / "1 stage(s) (2 replica(s)) ...".
std::string ShapeOf(const apapo::v1::Plan& plan);

}  // namespace apapo::coordinator

#endif  // APAPO_COORDINATOR_RUN_CHECK_H_

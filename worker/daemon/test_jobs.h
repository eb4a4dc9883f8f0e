// Tiny synthetic jobs and hand-written plans for the tests of the daemon's
// LibTorch runtime (stage_process, torch_job_runner).
//
// The model is the built-in mlp on 20-feature synthetic samples with 4
// classes, hidden 32, 2 hidden layers: nodes input, fc1, relu1, fc2, relu2,
// fc3, loss.
//
// Thread-safety: pure functions.
#ifndef APAPO_WORKER_DAEMON_TEST_JOBS_H_
#define APAPO_WORKER_DAEMON_TEST_JOBS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "proto/apapo/v1/worker.pb.h"

namespace apapo::worker::test_jobs {

// batch 32, 4 micro-batches, SGD; `samples_per_epoch` synthetic samples.
apapo::v1::JobSpec TinyMlpSpec(int epochs, int64_t samples_per_epoch = 512);

// A plan with one stage per entry of `stages` (node ids), one replica each.
apapo::v1::Plan PlanOf(const std::vector<std::vector<std::string>>& stages,
                       apapo::v1::ScheduleKind kind =
                           apapo::v1::SCHEDULE_KIND_ASYNC);
// [input fc1 relu1] | [fc2 relu2 fc3 loss].
apapo::v1::Plan TwoStagePlan();
// Everything in one stage.
apapo::v1::Plan OneStagePlan();

// The AssignStage the coordinator would send for (stage, replica 0) of a
// plan without replication (rank = stage).
apapo::v1::AssignStage Assignment(const std::string& job_id,
                                  const apapo::v1::JobSpec& spec,
                                  const apapo::v1::Plan& plan, int stage,
                                  int store_port);

}  // namespace apapo::worker::test_jobs

#endif  // APAPO_WORKER_DAEMON_TEST_JOBS_H_

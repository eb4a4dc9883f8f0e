#include "worker/stage_observer.h"

namespace apapo::worker {

void FillStageMetrics(const StageReport& r, int stage, int rank,
                      apapo::v1::StageMetrics* sm) {
  sm->set_stage(stage);
  sm->set_rank(rank);
  sm->set_busy_seconds(r.busy_seconds);
  sm->set_idle_seconds(r.idle_seconds);
  sm->set_comm_exposed_seconds(r.comm_exposed_seconds);
  sm->set_comm_total_seconds(r.comm_total_seconds);
  sm->set_bytes_sent(r.bytes_sent);
  sm->set_bytes_received(r.bytes_received);
  sm->set_forward_micro_batches(r.forward_micro_batches);
  sm->set_backward_micro_batches(r.backward_micro_batches);
  sm->set_max_staleness(static_cast<int32_t>(r.max_staleness));
  sm->set_max_weight_versions(r.max_weight_versions);
}

}  // namespace apapo::worker

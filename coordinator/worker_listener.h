// WorkerMessageListener: receives what workers report on their Connect
// streams (profiles, metrics, acknowledgements, stage outcomes). Kept apart
// from the gRPC adapter so logic (the scheduler) needs no grpc++ header.
//
// Thread-safety: called on each stream's reader thread, concurrently for
// different workers.
#ifndef APAPO_COORDINATOR_WORKER_LISTENER_H_
#define APAPO_COORDINATOR_WORKER_LISTENER_H_

#include <string>

#include "proto/apapo/v1/worker.pb.h"

namespace apapo::coordinator {

class WorkerMessageListener {
 public:
  virtual ~WorkerMessageListener() = default;
  virtual void OnWorkerMessage(const std::string& worker_id,
                               const apapo::v1::WorkerMessage& message) = 0;
};

}  // namespace apapo::coordinator

#endif  // APAPO_COORDINATOR_WORKER_LISTENER_H_

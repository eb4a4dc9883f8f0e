#include "worker/daemon/test_jobs.h"

namespace apapo::worker::test_jobs {

apapo::v1::JobSpec TinyMlpSpec(int epochs, int64_t samples_per_epoch) {
  apapo::v1::JobSpec spec;
  spec.set_name("tiny");
  auto* builtin = spec.mutable_model()->mutable_builtin();
  builtin->set_name("mlp");
  (*builtin->mutable_hyper_parameters())["hidden"].set_i(32);
  (*builtin->mutable_hyper_parameters())["layers"].set_i(2);
  auto* synthetic = spec.mutable_data()->mutable_synthetic();
  synthetic->add_sample_shape(20);
  synthetic->set_num_classes(4);
  synthetic->set_samples_per_epoch(samples_per_epoch);
  spec.mutable_data()->set_batch_size(32);
  spec.mutable_data()->set_eval_batch_size(64);
  spec.mutable_data()->set_shuffle(true);
  spec.mutable_optimizer()->mutable_sgd()->set_momentum(0.9);
  spec.mutable_optimizer()->set_learning_rate(0.05);
  spec.mutable_schedule()->set_kind(apapo::v1::SCHEDULE_KIND_ASYNC);
  spec.mutable_schedule()->set_micro_batches(4);
  spec.mutable_resources()->set_workers(2);
  spec.mutable_resources()->set_threads_per_worker(1);
  spec.mutable_limits()->set_epochs(epochs);
  spec.set_seed(3);
  return spec;
}

apapo::v1::Plan PlanOf(const std::vector<std::vector<std::string>>& stages,
                       apapo::v1::ScheduleKind kind) {
  apapo::v1::Plan plan;
  plan.set_model("mlp");
  plan.set_schedule(kind);
  plan.set_micro_batches(4);
  int rank = 0;
  for (size_t s = 0; s < stages.size(); ++s) {
    apapo::v1::Stage* stage = plan.add_stages();
    stage->set_index(static_cast<int>(s));
    for (const std::string& id : stages[s]) stage->add_node_ids(id);
    stage->set_replicas(1);
    apapo::v1::StageReplica* replica = stage->add_placement();
    replica->set_worker_id(std::string("w") + std::to_string(rank));
    replica->set_rank(rank++);
  }
  plan.set_num_workers(rank);
  return plan;
}

apapo::v1::Plan TwoStagePlan() {
  return PlanOf({{"input", "fc1", "relu1"}, {"fc2", "relu2", "fc3", "loss"}});
}

apapo::v1::Plan OneStagePlan() {
  return PlanOf({{"input", "fc1", "relu1", "fc2", "relu2", "fc3", "loss"}});
}

apapo::v1::AssignStage Assignment(const std::string& job_id,
                                  const apapo::v1::JobSpec& spec,
                                  const apapo::v1::Plan& plan, int stage,
                                  int store_port) {
  apapo::v1::AssignStage a;
  a.set_job_id(job_id);
  *a.mutable_spec() = spec;
  *a.mutable_plan() = plan;
  a.set_stage(stage);
  a.set_replica(0);
  auto* rv = a.mutable_rendezvous();
  rv->set_store_host("127.0.0.1");
  rv->set_store_port(store_port);
  rv->set_prefix(job_id);
  rv->set_world_size(plan.stages_size());
  rv->set_rank(stage);
  rv->mutable_timeout()->set_seconds(30);
  rv->set_backend("gloo");
  return a;
}

}  // namespace apapo::worker::test_jobs

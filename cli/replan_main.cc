// apapo-replan: plans a job again, offline, on what the coordinator planned
// it on: its JobSpec, and the measured ModelProfile and ClusterSpec (binary
// protos as `bench/cluster/run.py --save_plans` writes them, or text format
// in files named *.txtpb: cli/spec_file.h's LoadMessage). --schedule
// merges ScheduleSpec fields in text format into the spec first, to ask
// what the planner would have done with another bound; the plan is made by
// the coordinator's planner (PartitionerPlanner, the coordinator's budget)
// and printed: its prediction, stages, splits and notes.
//
// Exit codes: 0 ok, 2 bad input (one line "flag: reason" on stderr; a spec
// the coordinator would refuse is one), 3 no plan (the planner's error on
// stderr).

#include <cstdio>
#include <iostream>
#include <map>
#include <string>
#include <tuple>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "cli/spec_file.h"
#include "coordinator/spec_validator.h"
#include "planning/partitioner_planner.h"
#include "proto/apapo/v1/job.pb.h"
#include "proto/apapo/v1/plan.pb.h"
#include "proto/apapo/v1/profile.pb.h"

ABSL_FLAG(std::string, spec, "", "the job's JobSpec (binary, or text in *.txtpb)");
ABSL_FLAG(std::string, profile, "", "the measured ModelProfile (binary, or text in *.txtpb)");
ABSL_FLAG(std::string, cluster, "", "the measured ClusterSpec (binary, or text in *.txtpb)");
ABSL_FLAG(std::string, schedule, "",
          "ScheduleSpec fields in text format merged into the spec's schedule, "
          "e.g. \"max_staleness: 3\"");

namespace {

void Print(const apapo::v1::Plan& plan) {
  std::printf("%s, m=%d: predicted %.1f samples/s\n",
              apapo::v1::ScheduleKind_Name(plan.schedule()).c_str(), plan.micro_batches(),
              plan.prediction().samples_per_second());
  for (const auto& s : plan.stages()) {
    std::printf("  stage %d: %d node(s) %s .. %s, %d replica(s), %.2f ms compute, "
                "depth %d, staleness %d\n",
                s.index(), s.node_ids_size(),
                s.node_ids_size() > 0 ? s.node_ids(0).c_str() : "-",
                s.node_ids_size() > 0 ? s.node_ids(s.node_ids_size() - 1).c_str() : "-",
                s.replicas(), 1e3 * s.compute_seconds(), s.in_flight_depth(), s.staleness());
  }
  for (const auto& split : plan.splits()) {
    std::printf("  split %s in %d parts\n", split.node_id().c_str(), split.parts());
  }
  std::map<std::string, double> alternatives(
      plan.prediction().alternatives_samples_per_second().begin(),
      plan.prediction().alternatives_samples_per_second().end());
  for (const auto& [name, rate] : alternatives) {
    std::printf("  alternative %s: %.1f samples/s\n", name.c_str(), rate);
  }
  for (const auto& note : plan.notes()) std::printf("  - %s\n", note.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "apapo-replan --spec=S.pb --profile=P.pb --cluster=C.pb [--schedule='max_staleness: 3']");
  absl::ParseCommandLine(argc, argv);
  apapo::v1::JobSpec spec;
  apapo::v1::ModelProfile profile;
  apapo::v1::ClusterSpec cluster;
  for (const auto& [flag, path, message] :
       {std::tuple<const char*, std::string, google::protobuf::Message*>{
            "spec", absl::GetFlag(FLAGS_spec), &spec},
        {"profile", absl::GetFlag(FLAGS_profile), &profile},
        {"cluster", absl::GetFlag(FLAGS_cluster), &cluster}}) {
    absl::Status s = path.empty() ? absl::InvalidArgumentError("required")
                                  : apapo::cli::LoadMessage(path, message);
    if (!s.ok()) {
      std::cerr << "--" << flag << ": " << s.message() << "\n";
      return 2;
    }
  }
  if (const std::string text = absl::GetFlag(FLAGS_schedule); !text.empty()) {
    apapo::v1::ScheduleSpec extra;
    if (absl::Status s = apapo::cli::ParseTextMessage("--schedule", text, &extra); !s.ok()) {
      std::cerr << s.message() << "\n";
      return 2;
    }
    spec.mutable_schedule()->MergeFrom(extra);
  }
  // As the coordinator takes a job: a spec it would refuse is not planned.
  if (absl::Status s = apapo::coordinator::ValidateJobSpec(spec); !s.ok()) {
    std::cerr << "--spec: " << s.message() << "\n";
    return 2;
  }
  apapo::planning::PartitionerPlanner planner;
  absl::StatusOr<apapo::v1::Plan> plan = planner.MakePlan(spec, profile, cluster);
  if (!plan.ok()) {
    std::cerr << plan.status() << "\n";
    return 3;
  }
  Print(*plan);
  return 0;
}

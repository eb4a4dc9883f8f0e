// apapo-replan: plans a job again, offline, on what the coordinator planned
// it on: its JobSpec, and the measured ModelProfile and ClusterSpec (binary
// protos as `bench/cluster/run.py --save_plans` writes them, or text format
// in files named *.txtpb). --schedule
// merges ScheduleSpec fields in text format into the spec first, to ask
// what the planner would have done with another bound; the plan is made by
// the coordinator's planner (PartitionerPlanner, the coordinator's budget)
// and printed: its prediction, stages, splits and notes.
//
// Exit codes: 0 ok, 2 bad input (one line "flag: reason" on stderr), 3 no
// plan (the planner's error on stderr).

#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
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

// The first error of a text-format parse, as "LINE:COLUMN: message", in
// place of protobuf's log lines.
class FirstError : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    if (first_.empty()) first_ = absl::StrCat(line + 1, ":", column + 1, ": ", message);
  }
  const std::string& first() const { return first_; }

 private:
  std::string first_;
};

// Parses `text` into `message`; the first error where it is not that
// message in text format.
std::optional<std::string> ParseText(const std::string& text,
                                     google::protobuf::Message* message) {
  FirstError errors;
  google::protobuf::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  if (parser.ParseFromString(text, message)) return std::nullopt;
  return errors.first().empty() ? std::string("not parsed") : errors.first();
}

// Reads `flag`'s file into `message`: text format where its name ends in
// .txtpb, else binary. False (and one line on stderr) where it cannot.
bool ReadProto(const char* flag, const std::string& path, google::protobuf::Message* message) {
  if (path.empty()) {
    std::cerr << "--" << flag << ": required\n";
    return false;
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  if (!in || !(bytes << in.rdbuf())) {
    std::cerr << "--" << flag << ": cannot read " << path << "\n";
    return false;
  }
  const std::string& name = message->GetDescriptor()->full_name();
  if (absl::EndsWith(path, ".txtpb")) {
    if (std::optional<std::string> error = ParseText(bytes.str(), message)) {
      std::cerr << "--" << flag << ": " << path << " is not a text " << name << ": " << *error
                << "\n";
      return false;
    }
  } else if (!message->ParseFromString(bytes.str())) {
    std::cerr << "--" << flag << ": " << path << " is not a binary " << name << "\n";
    return false;
  }
  return true;
}

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
  if (!ReadProto("spec", absl::GetFlag(FLAGS_spec), &spec) ||
      !ReadProto("profile", absl::GetFlag(FLAGS_profile), &profile) ||
      !ReadProto("cluster", absl::GetFlag(FLAGS_cluster), &cluster)) {
    return 2;
  }
  if (const std::string text = absl::GetFlag(FLAGS_schedule); !text.empty()) {
    apapo::v1::ScheduleSpec extra;
    if (std::optional<std::string> error = ParseText(text, &extra)) {
      std::cerr << "--schedule: not ScheduleSpec fields in text format: " << *error << "\n";
      return 2;
    }
    spec.mutable_schedule()->MergeFrom(extra);
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

// libFuzzer target: a JobSpec as a client sends it, in the text format
// (apapoctl submit FILE) when the first byte is even, else as JSON (any
// gRPC-JSON gateway). Whatever parses goes through what SubmitJob runs: the
// validator, the data-root check and the micro-batch arithmetic. Nothing may
// crash; every refusal must be INVALID_ARGUMENT naming a `spec.` field.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/spec_paths.h"
#include "coordinator/spec_validator.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "proto/apapo/v1/job.pb.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  apapo::v1::JobSpec spec;
  if (data[0] % 2 == 0) {
    google::protobuf::TextFormat::Parser parser;
    parser.AllowPartialMessage(false);
    if (!parser.ParseFromString(text, &spec)) return 0;
  } else if (!google::protobuf::util::JsonStringToMessage(text, &spec).ok()) {
    return 0;
  }
  const absl::Status valid = apapo::coordinator::ValidateJobSpec(spec);
  if (!valid.ok()) {
    if (valid.code() != absl::StatusCode::kInvalidArgument ||
        valid.message().rfind("spec", 0) != 0) {
      std::abort();  // a refusal that names no field
    }
    return 0;
  }
  (void)apapo::coordinator::EffectiveMicroBatches(spec);
  const absl::Status paths =
      apapo::CheckSpecPaths(spec, {"/usr/share/datasets", "/var/lib/apapo"});
  if (!paths.ok() && paths.code() != absl::StatusCode::kInvalidArgument) std::abort();
  return 0;
}

// Reading a JobSpec from a file: protobuf text format (.textproto, .txtpb,
// .pbtxt) or JSON (.json, or any file whose first non-blank byte is '{'
// and that parses as JSON).
//
// Thread-safety: pure functions.
#ifndef APAPO_CLI_SPEC_FILE_H_
#define APAPO_CLI_SPEC_FILE_H_

#include <string>

#include "absl/status/statusor.h"
#include "proto/apapo/v1/job.pb.h"

namespace apapo::cli {

// INVALID_ARGUMENT with "FILE:LINE:COLUMN: reason" for a syntax error,
// NOT_FOUND if the file cannot be read.
absl::StatusOr<apapo::v1::JobSpec> LoadJobSpec(const std::string& path);

// Parses `text` (named `path` in errors) as text format or JSON.
absl::StatusOr<apapo::v1::JobSpec> ParseJobSpec(const std::string& path,
                                                const std::string& text);

}  // namespace apapo::cli

#endif  // APAPO_CLI_SPEC_FILE_H_

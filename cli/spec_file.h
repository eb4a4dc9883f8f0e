// Reading a JobSpec from a file: protobuf text format (.textproto, .txtpb,
// .pbtxt) or JSON (.json, or any file whose first non-blank byte is '{'
// and that parses as JSON). And any API message from a file in text format
// or binary (LoadMessage).
//
// Thread-safety: pure functions.
#ifndef APAPO_CLI_SPEC_FILE_H_
#define APAPO_CLI_SPEC_FILE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "google/protobuf/message.h"
#include "proto/apapo/v1/job.pb.h"

namespace apapo::cli {

// INVALID_ARGUMENT with "FILE:LINE:COLUMN: reason" for a syntax error,
// NOT_FOUND if the file cannot be read.
absl::StatusOr<apapo::v1::JobSpec> LoadJobSpec(const std::string& path);

// Parses `text` (named `path` in errors) as text format or JSON.
absl::StatusOr<apapo::v1::JobSpec> ParseJobSpec(const std::string& path,
                                                const std::string& text);

// Parses `text` (named `path` in errors) into `message` in text format:
// INVALID_ARGUMENT with "FILE:LINE:COLUMN: reason" where it is not.
absl::Status ParseTextMessage(const std::string& path, const std::string& text,
                              google::protobuf::Message* message);

// Reads `message` from the file `path`: text format where its name ends in
// .textproto, .txtpb or .pbtxt, else binary. NOT_FOUND if the file cannot
// be read; INVALID_ARGUMENT naming the file (and, in text, the line and
// column) if it is not that message.
absl::Status LoadMessage(const std::string& path, google::protobuf::Message* message);

}  // namespace apapo::cli

#endif  // APAPO_CLI_SPEC_FILE_H_

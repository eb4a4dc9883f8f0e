#include "cli/spec_file.h"

#include <fstream>
#include <iterator>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"

namespace apapo::cli {
namespace {

// Collects the first text-format error with its position.
class FirstError : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    if (message_.empty()) {
      line_ = line + 1;
      column_ = column + 1;
      message_ = message;
    }
  }
  int line_ = 0, column_ = 0;
  std::string message_;
};

// The bytes of the file `path`; NOT_FOUND where it cannot be read.
absl::StatusOr<std::string> ReadWhole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace

absl::StatusOr<apapo::v1::JobSpec> ParseJobSpec(const std::string& path,
                                                const std::string& text) {
  apapo::v1::JobSpec spec;
  absl::string_view trimmed = absl::StripLeadingAsciiWhitespace(text);
  bool json = absl::EndsWith(path, ".json") || absl::StartsWith(trimmed, "{");
  if (json) {
    google::protobuf::util::JsonParseOptions options;
    auto status = google::protobuf::util::JsonStringToMessage(text, &spec, options);
    if (!status.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": not a valid JobSpec in JSON: ",
                       std::string(status.message().data(), status.message().size())));
    }
    return spec;
  }
  if (absl::Status s = ParseTextMessage(path, text, &spec); !s.ok()) return s;
  return spec;
}

absl::Status ParseTextMessage(const std::string& path, const std::string& text,
                              google::protobuf::Message* message) {
  google::protobuf::TextFormat::Parser parser;
  FirstError errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text, message)) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ":", errors.line_, ":", errors.column_, ": ", errors.message_));
  }
  return absl::OkStatus();
}

absl::StatusOr<apapo::v1::JobSpec> LoadJobSpec(const std::string& path) {
  absl::StatusOr<std::string> text = ReadWhole(path);
  if (!text.ok()) {
    return absl::NotFoundError(absl::StrCat("cannot read job spec ", path));
  }
  return ParseJobSpec(path, *text);
}

absl::Status LoadMessage(const std::string& path, google::protobuf::Message* message) {
  absl::StatusOr<std::string> bytes = ReadWhole(path);
  if (!bytes.ok()) return bytes.status();
  for (const char* text_suffix : {".textproto", ".txtpb", ".pbtxt"}) {
    if (absl::EndsWith(path, text_suffix)) return ParseTextMessage(path, *bytes, message);
  }
  if (!message->ParseFromString(*bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": not a binary ", message->GetDescriptor()->full_name()));
  }
  return absl::OkStatus();
}

}  // namespace apapo::cli

#include "cli/chrome_trace.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace apapo::cli {
namespace {

std::string Quote(absl::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c >= 0x7f) {
      out += absl::StrFormat("\\u%04x", c);  // bytes as code points: valid JSON
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

void Metadata(std::string* out, const char* name, int pid,
              const std::string& args) {
  absl::StrAppend(out, out->back() == '[' ? "\n" : ",\n", "{\"name\":\"", name,
                  "\",\"ph\":\"M\",\"pid\":", pid, ",\"tid\":1,\"args\":{",
                  args, "}}");
}

void Process(std::string* out, int pid, const apapo::v1::StageTrace& t,
             bool simulated) {
  std::string name = absl::StrCat(simulated ? "simulated " : "", "stage ",
                                  t.stage(), " replica ", t.replica());
  if (!simulated) {
    absl::StrAppend(&name, " (rank ", t.rank(),
                    t.worker_id().empty() ? "" : ", ", t.worker_id(), ")");
  }
  Metadata(out, "process_name", pid, absl::StrCat("\"name\":", Quote(name)));
  Metadata(out, "process_labels", pid,
           absl::StrCat("\"labels\":", Quote(simulated ? "simulated" : "measured")));
  Metadata(out, "process_sort_index", pid, absl::StrCat("\"sort_index\":", pid));
  Metadata(out, "thread_name", pid, "\"name\":\"ops\"");
  for (const apapo::v1::TraceSpan& s : t.spans()) {
    absl::StrAppend(
        out, ",\n{\"name\":", Quote(SpanKindName(s.kind())),
        ",\"cat\":", Quote(simulated ? "simulated" : "measured"),
        ",\"ph\":\"X\",\"pid\":", pid, ",\"tid\":1",
        absl::StrFormat(",\"ts\":%.3f,\"dur\":%.3f", s.start_ns() / 1e3,
                        s.duration_ns() / 1e3),
        ",\"args\":{\"micro_batch\":", s.micro_batch(), ",\"step\":", s.step(),
        "}}");
  }
}

}  // namespace

absl::string_view SpanKindName(apapo::v1::SpanKind kind) {
  switch (kind) {
    case apapo::v1::SPAN_KIND_FORWARD: return "forward";
    case apapo::v1::SPAN_KIND_BACKWARD: return "backward";
    case apapo::v1::SPAN_KIND_SEND: return "send";
    case apapo::v1::SPAN_KIND_RECV: return "recv";
    case apapo::v1::SPAN_KIND_ALL_REDUCE: return "all-reduce";
    case apapo::v1::SPAN_KIND_OPTIMIZER: return "optimizer";
    case apapo::v1::SPAN_KIND_FLUSH: return "flush";
    default: return "other";
  }
}

std::string ChromeTraceJson(const apapo::v1::GetTraceResponse& trace) {
  std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[";
  for (int i = 0; i < trace.stages_size(); ++i) {
    Process(&out, 1 + i, trace.stages(i), /*simulated=*/false);
  }
  for (int i = 0; i < trace.simulated_size(); ++i) {
    Process(&out, kSimulatedPidBase + 1 + i, trace.simulated(i),
            /*simulated=*/true);
  }
  absl::StrAppend(&out, "\n]}\n");
  return out;
}

}  // namespace apapo::cli

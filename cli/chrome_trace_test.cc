#include "cli/chrome_trace.h"

#include <set>
#include <string>

#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"

namespace apapo::cli {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;

apapo::v1::StageTrace Trace(int stage, const std::string& worker) {
  apapo::v1::StageTrace t;
  t.set_stage(stage);
  t.set_rank(stage);
  t.set_worker_id(worker);
  int64_t at = 0;
  for (auto kind : {apapo::v1::SPAN_KIND_RECV, apapo::v1::SPAN_KIND_FORWARD,
                    apapo::v1::SPAN_KIND_SEND, apapo::v1::SPAN_KIND_BACKWARD,
                    apapo::v1::SPAN_KIND_OPTIMIZER}) {
    apapo::v1::TraceSpan* s = t.add_spans();
    s->set_kind(kind);
    s->set_micro_batch(kind == apapo::v1::SPAN_KIND_OPTIMIZER ? -1 : 3);
    s->set_step(7);
    s->set_start_ns(at);
    s->set_duration_ns(1500);
    at += 2000;
  }
  return t;
}

TEST(ChromeTraceTest, ValidJsonWithRequiredFields) {
  apapo::v1::GetTraceResponse r;
  *r.add_stages() = Trace(0, "w-\"1\"\n");  // escaped
  *r.add_stages() = Trace(1, "w-2");
  *r.add_simulated() = Trace(0, "");
  *r.add_simulated() = Trace(1, "");
  const std::string json = ChromeTraceJson(r);
  Struct root;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &root).ok())
      << json;
  const auto& events = root.fields().at("traceEvents").list_value().values();
  int spans = 0;
  std::set<std::string> names, labels;
  for (const Value& e : events) {
    const auto& f = e.struct_value().fields();
    ASSERT_TRUE(f.count("ph") && f.count("pid") && f.count("tid") &&
                f.count("name"));
    const int pid = static_cast<int>(f.at("pid").number_value());
    if (f.at("ph").string_value() == "M") {
      const auto& args = f.at("args").struct_value().fields();
      if (f.at("name").string_value() == "process_name") {
        names.insert(args.at("name").string_value());
      } else if (f.at("name").string_value() == "process_labels") {
        labels.insert(args.at("labels").string_value());
        EXPECT_EQ(args.at("labels").string_value(),
                  pid > kSimulatedPidBase ? "simulated" : "measured");
      }
      continue;
    }
    ASSERT_EQ(f.at("ph").string_value(), "X");
    ASSERT_TRUE(f.count("ts") && f.count("dur"));
    EXPECT_DOUBLE_EQ(f.at("dur").number_value(), 1.5);  // microseconds
    ++spans;
  }
  EXPECT_EQ(spans, 20);
  EXPECT_EQ(names, (std::set<std::string>{
                       "stage 0 replica 0 (rank 0, w-\"1\"\n)",
                       "stage 1 replica 0 (rank 1, w-2)",
                       "simulated stage 0 replica 0",
                       "simulated stage 1 replica 0"}));
  EXPECT_EQ(labels, (std::set<std::string>{"measured", "simulated"}));
}

TEST(ChromeTraceTest, EmptyTraceIsValid) {
  Struct root;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(
                  ChromeTraceJson(apapo::v1::GetTraceResponse()), &root)
                  .ok());
  EXPECT_EQ(root.fields().at("traceEvents").list_value().values_size(), 0);
}

TEST(ChromeTraceTest, KindNames) {
  EXPECT_EQ(SpanKindName(apapo::v1::SPAN_KIND_ALL_REDUCE), "all-reduce");
  EXPECT_EQ(SpanKindName(apapo::v1::SPAN_KIND_RECV), "recv");
}

}  // namespace
}  // namespace apapo::cli

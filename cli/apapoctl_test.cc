// apapoctl's commands against a real coordinator JobService on loopback.
#include "cli/apapoctl.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "coordinator/job_service.h"
#include "coordinator/server.h"
#include "coordinator/worker_service.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace apapo::cli {
namespace {

using ::testing::ContainsRegex;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

std::string WriteFile(const std::string& name, const std::string& text) {
  const char* dir = std::getenv("TEST_TMPDIR");
  std::string path = std::string(dir ? dir : "/tmp") + "/" + name;
  std::ofstream(path) << text;
  return path;
}

constexpr char kSpec[] = R"pb(
  name: "ctl"
  model { builtin { name: "mlp" } }
  data { fashion_mnist {} batch_size: 64 }
  optimizer { sgd {} learning_rate: 0.1 }
  resources { workers: 1 }
  limits { epochs: 1 }
)pb";

// An output stream buffer safe to write from one thread and read from
// another, which a test can wait on.
class LockedBuf : public std::streambuf {
 public:
  bool WaitFor(const std::string& text, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto has = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return text_.find(text) != std::string::npos;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&has), timeout);
  }
  std::string text() {
    absl::MutexLock lock(&mu_);
    return text_;
  }

 protected:
  int overflow(int c) override {
    if (c != EOF) {
      absl::MutexLock lock(&mu_);
      text_.push_back(static_cast<char>(c));
    }
    return c;
  }
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    absl::MutexLock lock(&mu_);
    text_.append(s, n);
    return n;
  }

 private:
  absl::Mutex mu_;
  std::string text_ ABSL_GUARDED_BY(mu_);
};

class ApapoctlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto port = server_.Start("127.0.0.1:0");
    ASSERT_TRUE(port.ok()) << port.status();
    address_ = "127.0.0.1:" + std::to_string(*port);
    Connect(address_);
  }
  void TearDown() override { server_.Shutdown(); }

  void Connect(const std::string& address) {
    auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
    job_stub_ = apapo::v1::JobService::NewStub(channel);
    worker_stub_ = apapo::v1::WorkerService::NewStub(channel);
  }

  int Run(std::vector<std::string> args, SubmitOverrides o = {}) {
    out_.str("");
    err_.str("");
    Apapoctl ctl(job_stub_.get(), worker_stub_.get(), out_, err_,
                 absl::Seconds(10));
    return ctl.Run(args, o, /*watch_after_submit=*/false, /*interactive=*/false);
  }

  coordinator::MemoryJobStore store_;
  coordinator::RealClock clock_;
  coordinator::JobManager jobs_{&store_, &clock_};
  coordinator::JobServiceImpl service_{&jobs_, absl::Milliseconds(20)};
  coordinator::WorkerRegistry registry_{&clock_, absl::Seconds(60)};
  coordinator::WorkerServiceImpl worker_service_{&registry_, nullptr};
  coordinator::CoordinatorServer server_{{&service_, &worker_service_}};
  std::string address_;
  std::unique_ptr<apapo::v1::JobService::Stub> job_stub_;
  std::unique_ptr<apapo::v1::WorkerService::Stub> worker_stub_;
  std::ostringstream out_, err_;
};

TEST_F(ApapoctlTest, SubmitListGetCancelWatch) {
  std::string file = WriteFile("ok.textproto", kSpec);
  ASSERT_EQ(Run({"submit", file}), kExitOk) << err_.str();
  EXPECT_EQ(out_.str(), "job-000001\n");
  ASSERT_EQ(Run({"list"}), kExitOk);
  EXPECT_THAT(out_.str(), HasSubstr("job-000001"));
  EXPECT_THAT(out_.str(), HasSubstr("queued"));
  ASSERT_EQ(Run({"get", "job-000001"}), kExitOk);
  EXPECT_THAT(out_.str(), HasSubstr("name: \"ctl\""));
  ASSERT_EQ(Run({"cancel", "job-000001"}), kExitOk);
  EXPECT_EQ(out_.str(), "job-000001 cancelled\n");
  EXPECT_EQ(Run({"cancel", "job-000001"}), kExitRefused);
  EXPECT_THAT(err_.str(), StartsWith("apapoctl: cancel job-000001: job-000001 "
                                     "has already ended"));
  EXPECT_EQ(Run({"watch", "job-000001"}), kExitJobFailed);
  EXPECT_THAT(out_.str(), HasSubstr("job-000001 cancelled\n"));
  EXPECT_THAT(out_.str(), HasSubstr("cancelled: apapoctl cancel"));
}

TEST_F(ApapoctlTest, WorkersPagesThroughTheWholeFleet) {
  // More workers than one page holds (WorkerRegistry::kDefaultPageSize).
  const int n = coordinator::WorkerRegistry::kDefaultPageSize + 7;
  std::vector<std::shared_ptr<coordinator::WorkerSession>> sessions;
  for (int i = 0; i < n; ++i) {
    apapo::v1::WorkerInfo info;
    info.set_worker_id(absl::StrFormat("w-%04d", i));
    info.set_host("198.18.0.1");
    info.set_cores(i == 0 ? 2 : 1);
    if (i == 0) info.set_cpu_quota(2.5);  // a container's CPU limit
    auto session = registry_.Register(info);
    ASSERT_TRUE(session.ok());
    sessions.push_back(*session);
  }
  ASSERT_TRUE(registry_.Reserve("job-000001", 2, {}).ok());
  registry_.Disconnect(*sessions.back(), "gone");
  ASSERT_EQ(Run({"workers"}), kExitOk) << err_.str();
  const std::string text = out_.str();
  EXPECT_THAT(text, HasSubstr("CORES  CPU LIMIT"));
  EXPECT_THAT(text, ContainsRegex("w-0000 +198.18.0.1 +busy +2 +2.50 "));
  EXPECT_THAT(text, ContainsRegex("w-0001 +198.18.0.1 +busy +1 +- "));
  EXPECT_THAT(text, HasSubstr(absl::StrFormat("w-%04d ", n - 1)));
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), n + 2);  // + header, total
  EXPECT_THAT(text, EndsWith(absl::StrFormat(
                        "%d worker(s): 2 busy, %d idle, 1 lost\n", n, n - 3)));
}

TEST_F(ApapoctlTest, OverridesApplyAndInvalidSpecIsOneLineUsageError) {
  std::string file = WriteFile("ov.textproto", kSpec);
  SubmitOverrides o;
  o.micro_batches = 0;
  EXPECT_EQ(Run({"submit", file}, o), kExitUsage);
  EXPECT_EQ(err_.str(),
            "apapoctl: submit " + file +
                ": spec.schedule.micro_batches: must be >= 1, got 0 "
                "(INVALID_ARGUMENT)\n");
  o = {};
  o.schedule = "fastest";
  EXPECT_EQ(Run({"submit", file}, o), kExitUsage);
  EXPECT_THAT(err_.str(), HasSubstr("--schedule: unknown schedule \"fastest\""));
  o = {};
  o.name = "renamed";
  o.schedule = "gpipe";
  ASSERT_EQ(Run({"submit", file}, o), kExitOk);
  auto job = jobs_.Get("job-000001");
  EXPECT_EQ(job->spec().name(), "renamed");
  EXPECT_EQ(job->spec().schedule().kind(), apapo::v1::SCHEDULE_KIND_GPIPE);
}

TEST_F(ApapoctlTest, SyntaxErrorNotFoundAndUsage) {
  std::string bad = WriteFile("bad.textproto", "name: \"x\"\nlimits { epochs: }\n");
  EXPECT_EQ(Run({"submit", bad}), kExitUsage);
  EXPECT_THAT(err_.str(), HasSubstr(bad + ":2:"));
  EXPECT_EQ(Run({"get", "job-000777"}), kExitNotFound);
  EXPECT_THAT(err_.str(), HasSubstr("(NOT_FOUND)"));
  EXPECT_EQ(Run({"plan", "job-000777"}), kExitNotFound);
  EXPECT_EQ(Run({"frobnicate"}), kExitUsage);
  EXPECT_EQ(Run({"get"}), kExitUsage);
  EXPECT_EQ(Run({}), kExitUsage);
}

TEST_F(ApapoctlTest, WatchReconnectsWhenTheCoordinatorRestarts) {
  std::string file = WriteFile("watched.textproto", kSpec);
  ASSERT_EQ(Run({"submit", file}), kExitOk) << err_.str();
  LockedBuf out, err;
  std::ostream out_stream(&out), err_stream(&err);
  int code = -1;
  std::thread watcher([&] {
    Apapoctl ctl(job_stub_.get(), worker_stub_.get(), out_stream, err_stream,
                 absl::Seconds(10), /*reconnect_for=*/absl::Seconds(60));
    code = ctl.Run({"watch", "job-000001"}, {}, false, false);
  });
  ASSERT_TRUE(out.WaitFor("job-000001 queued: submitted", absl::Seconds(30)));
  // The coordinator goes away mid-watch and comes back on the same port
  // (same job state); the job ends while the watch is reconnecting.
  server_.Shutdown();
  ASSERT_TRUE(err.WaitFor("coordinator unavailable", absl::Seconds(30))) << err.text();
  ASSERT_TRUE(jobs_.Cancel("job-000001", "while away").ok());
  coordinator::JobServiceImpl service(&jobs_, absl::Milliseconds(20));
  coordinator::CoordinatorServer restarted({&service});
  ASSERT_TRUE(restarted.Start(address_).ok());
  watcher.join();
  restarted.Shutdown();
  EXPECT_EQ(code, kExitJobFailed) << err.text();
  EXPECT_THAT(err.text(), HasSubstr("reconnecting for up to 1m"));
  EXPECT_THAT(err.text(), HasSubstr("job-000001: reconnected"));
  // Each event once: the watch resumed after the last one it printed.
  const std::string text = out.text();
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 3)
      << text;  // submitted, cancelled, the final line
  EXPECT_THAT(text, HasSubstr("cancelled: while away"));
  EXPECT_THAT(text, EndsWith("job-000001 cancelled\n"));
}

TEST_F(ApapoctlTest, UnreachableCoordinatorIsUnavailable) {
  server_.Shutdown();  // its port is now closed
  Connect(address_);
  EXPECT_EQ(Run({"list"}), kExitUnavailable);
  EXPECT_THAT(err_.str(), StartsWith("apapoctl: list: "));
  EXPECT_THAT(err_.str(), HasSubstr("(UNAVAILABLE)"));
}

TEST(FormatTest, ProgressBar) {
  apapo::v1::Job job;
  job.set_state(apapo::v1::JOB_STATE_RUNNING);
  job.mutable_spec()->mutable_limits()->set_epochs(3);
  auto* p = job.mutable_progress();
  p->set_step(50);
  p->set_total_steps(100);
  p->set_epoch(2);
  p->set_samples_per_second(1234.4);
  p->set_loss(0.5);
  p->set_test_accuracy(0.8812);
  p->mutable_eta()->set_seconds(125);
  EXPECT_EQ(FormatProgress(job),
            "[############------------]  50% running    epoch 2/3 step 50/100 "
            "1234 samples/s loss 0.5000 acc 88.12% ETA 2m05s");
  // With the stages' counters: each stage's busy share, in stage order.
  auto* s1 = p->add_stages();
  s1->set_stage(1);
  s1->set_busy_seconds(9);
  s1->set_idle_seconds(1);
  auto* s0 = p->add_stages();
  s0->set_stage(0);
  s0->set_busy_seconds(3);
  s0->set_idle_seconds(1);
  EXPECT_THAT(FormatProgress(job), EndsWith("ETA 2m05s busy s0 75% s1 90%"));
}

TEST(FormatTest, PlanTableShowsPredictionsAndMeasurements) {
  apapo::v1::GetPlanResponse r;
  auto* plan = r.mutable_plan();
  plan->set_model("mlp");
  plan->set_num_workers(2);
  plan->set_schedule(apapo::v1::SCHEDULE_KIND_ASYNC);
  plan->set_micro_batches(4);
  for (int i = 0; i < 2; ++i) {
    auto* s = plan->add_stages();
    s->set_index(i);
    s->add_node_ids(i == 0 ? "fc1" : "fc4");
    s->set_replicas(1);
    s->add_placement()->set_worker_id(i == 0 ? "w-a" : "w-b");
    s->set_compute_seconds(0.05);
    s->set_peak_memory_bytes(100 << 20);
    auto* m = r.mutable_measured()->add_stages();
    m->set_stage(i);
    m->set_busy_seconds(10);
    m->set_idle_seconds(1);
    m->set_steps(i == 0 ? 200 : 0);  // stage 1 has not said over how many
  }
  plan->mutable_prediction()->set_samples_per_second(2000);
  r.mutable_measured()->set_samples_per_second(1500);
  std::string table = FormatPlan(r);
  EXPECT_THAT(table, HasSubstr("2 stage(s) on 2 worker(s), schedule async"));
  EXPECT_THAT(table, HasSubstr("w-b"));
  EXPECT_THAT(table, HasSubstr("100.0 MiB"));
  EXPECT_THAT(table, HasSubstr("10.00"));
  // Stage 0 measured beside its prediction: 10 s over 200 steps.
  EXPECT_THAT(table, HasSubstr("busy s/mb"));
  EXPECT_THAT(table, ContainsRegex("\n0 .* 0\\.05000 .* 10\\.00 +1\\.00 +0\\.05000\n"));
  EXPECT_THAT(table, ContainsRegex("\n1 .* 10\\.00 +1\\.00 +-\n"));
  EXPECT_THAT(table, HasSubstr("measured:  1500.0 samples/s (0.75x the prediction)"));
  EXPECT_THAT(table, Not(HasSubstr("checkpoint")));

  // A checkpointing job is measured against the rate that counts them.
  plan->mutable_prediction()->set_checkpoint_seconds(0.85);
  plan->mutable_prediction()->set_checkpoint_every_steps(100);
  plan->mutable_prediction()->set_samples_per_second_with_checkpoints(1875);
  table = FormatPlan(r);
  EXPECT_THAT(table, HasSubstr("predicted with a checkpoint every 100 steps (0.850 s each): "
                               "1875.0 samples/s"));
  EXPECT_THAT(table, HasSubstr("measured:  1500.0 samples/s (0.80x the prediction with "
                               "checkpoints)"));
}

TEST(FormatTest, PlanShowsTheMeasuredLinksSlowestFirst) {
  apapo::v1::GetPlanResponse r;
  auto* level = r.mutable_cluster()->add_levels();
  level->set_group_size(2);
  level->set_bandwidth_bytes_per_second(2.5e8);
  for (const auto& [from, to, bw] :
       std::vector<std::tuple<std::string, std::string, double>>{
           {"w-a", "w-b", 3.0e9}, {"w-b", "w-a", 2.5e8}}) {
    auto* l = r.mutable_cluster()->add_links();
    l->set_from_worker(from);
    l->set_to_worker(to);
    l->set_bandwidth_bytes_per_second(bw);
    l->set_latency_seconds(42e-6);
    l->set_message_bytes(4 << 20);
    if (from == "w-a") l->set_cpu_seconds_per_byte(0.61e-9);
  }
  std::string table = FormatPlan(r);
  EXPECT_THAT(table, HasSubstr("network: 2 worker(s) at 250.0 MB/s (slowest measured link)\n"));
  EXPECT_THAT(table, Not(HasSubstr("assumed")));
  EXPECT_THAT(table, Not(HasSubstr("token bucket")));
  EXPECT_THAT(table, HasSubstr(
      "  link w-b -> w-a: 250.0 MB/s, latency 42.0 us (measured with 4.0 MiB messages)\n"
      "  link w-a -> w-b: 3.00 GB/s, latency 42.0 us, 0.61 ns of CPU per byte "
      "(measured with 4.0 MiB messages)\n"));
  EXPECT_THAT(table, Not(HasSubstr("all-reduce of")));
  for (double seconds : {0.030, 0.012, 0.015}) {
    auto* a = r.mutable_cluster()->add_allreduces();
    a->set_ranks(2);
    a->set_bytes(4 << 20);
    a->set_seconds(seconds);
  }
  EXPECT_THAT(FormatPlan(r),
              HasSubstr("  all-reduce of 4.0 MiB over 2 worker(s): 15.0 ms "
                        "(median of 3 timing(s))\n"));
  // A larger size the workers also timed gets its own line, after.
  for (double seconds : {0.300, 0.200}) {
    auto* a = r.mutable_cluster()->add_allreduces();
    a->set_ranks(2);
    a->set_bytes(64 << 20);
    a->set_seconds(seconds);
  }
  std::swap(*r.mutable_cluster()->mutable_allreduces(0),
            *r.mutable_cluster()->mutable_allreduces(4));
  EXPECT_THAT(FormatPlan(r),
              HasSubstr("  all-reduce of 4.0 MiB over 2 worker(s): 15.0 ms "
                        "(median of 3 timing(s))\n"
                        "  all-reduce of 64.0 MiB over 2 worker(s): 300.0 ms "
                        "(median of 2 timing(s))\n"));
  EXPECT_THAT(FormatPlan(r), Not(HasSubstr("transfer CPU")));
  for (const auto& [w, bytes, cpu] :
       std::vector<std::tuple<std::string, int64_t, double>>{
           {"w-a", 4 << 20, 0.2e-9}, {"w-b", 4 << 20, 0.3e-9},
           {"w-a", 19 << 20, 0.8e-9}, {"w-b", 19 << 20, 0.6e-9}}) {
    auto* t = r.mutable_cluster()->add_transfer_cpu();
    t->set_worker_id(w);
    t->set_message_bytes(bytes);
    t->set_cpu_seconds_per_byte(cpu);
  }
  EXPECT_THAT(FormatPlan(r),
              HasSubstr("  transfer CPU by message size: 4.0 MiB 0.30 ns, "
                        "19.0 MiB 0.80 ns per byte (timed on each worker's "
                        "loopback)\n"));
  // A link that passes a token bucket at once after it idled: on its line
  // and on the level the planner charges.
  r.mutable_cluster()->mutable_links(1)->set_burst_bytes(102400);
  level->set_burst_bytes(102400);
  table = FormatPlan(r);
  EXPECT_THAT(table, HasSubstr("network: 2 worker(s) at 250.0 MB/s (slowest measured link), "
                               "token bucket 100.0 KiB\n"));
  EXPECT_THAT(table, HasSubstr("  link w-b -> w-a: 250.0 MB/s, latency 42.0 us, token bucket "
                               "100.0 KiB (measured with 4.0 MiB messages)\n"));
  EXPECT_THAT(table, HasSubstr("  link w-a -> w-b: 3.00 GB/s, latency 42.0 us, 0.61 ns of CPU "
                               "per byte (measured with 4.0 MiB messages)\n"));
  // The fastest round trip's rate, which the levels are grouped by.
  r.mutable_cluster()->mutable_links(1)->set_peak_bandwidth_bytes_per_second(2.7e8);
  EXPECT_THAT(FormatPlan(r), HasSubstr("  link w-b -> w-a: 250.0 MB/s (peak 270.0 MB/s), "
                                       "latency 42.0 us, token bucket "));
  // A worker's figure that is not finite is not printed.
  r.mutable_cluster()->mutable_links(1)->set_peak_bandwidth_bytes_per_second(
      std::numeric_limits<double>::quiet_NaN());
  EXPECT_THAT(FormatPlan(r), HasSubstr("  link w-b -> w-a: 250.0 MB/s, latency 42.0 us, "));
  r.mutable_cluster()->mutable_links(0)->set_burst_bytes(
      std::numeric_limits<double>::infinity());
  EXPECT_THAT(FormatPlan(r), HasSubstr("  link w-a -> w-b: 3.00 GB/s, latency 42.0 us, 0.61 ns "
                                       "of CPU per byte (measured with 4.0 MiB messages)\n"));

  r.mutable_cluster()->clear_links();
  level->set_burst_bytes(0);
  level->set_group_size(1);
  level->set_bandwidth_bytes_per_second(1e9);
  EXPECT_THAT(FormatPlan(r),
              HasSubstr("network: 1 worker(s) at 1.00 GB/s (assumed: no links measured)"));
}

}  // namespace
}  // namespace apapo::cli

namespace apapo::cli {
namespace {

TEST_F(ApapoctlTest, TraceWritesChromeJsonToStdoutOrAFile) {
  EXPECT_EQ(Run({"trace", "job-000009"}), kExitNotFound);
  EXPECT_THAT(err_.str(), HasSubstr("trace job-000009"));
  EXPECT_EQ(Run({"trace"}), kExitUsage);

  ASSERT_EQ(Run({"submit", WriteFile("trace.textproto", kSpec)}), kExitOk);
  apapo::v1::StageTrace t;
  t.set_stage(0);
  t.set_worker_id("w-1");
  apapo::v1::TraceSpan* s = t.add_spans();
  s->set_kind(apapo::v1::SPAN_KIND_FORWARD);
  s->set_duration_ns(2500);
  ASSERT_TRUE(jobs_.AddStageTrace("job-000001", t).ok());
  ASSERT_EQ(Run({"trace", "job-000001"}), kExitOk) << err_.str();
  EXPECT_THAT(out_.str(), StartsWith("{\"displayTimeUnit\""));
  EXPECT_THAT(out_.str(), HasSubstr("\"name\":\"forward\""));
  EXPECT_THAT(out_.str(), HasSubstr("\"dur\":2.500"));

  const std::string path = WriteFile("trace.json", "");
  out_.str("");
  Apapoctl ctl(job_stub_.get(), worker_stub_.get(), out_, err_, absl::Seconds(10));
  ctl.SetTraceOut(path);
  ASSERT_EQ(ctl.Run({"trace", "job-000001"}, {}, false, false), kExitOk);
  EXPECT_THAT(out_.str(), StartsWith("wrote " + path + ": 1 measured stage "
                                     "replica(s), 1 span(s); 0 simulated ("));
  std::ifstream in(path);
  std::stringstream json;
  json << in.rdbuf();
  EXPECT_THAT(json.str(), HasSubstr("stage 0 replica 0 (rank 0, w-1)"));
}

}  // namespace
}  // namespace apapo::cli

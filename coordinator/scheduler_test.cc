#include "coordinator/scheduler.h"

#include <array>
#include <functional>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "coordinator/fake_clock.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"

namespace apapo::coordinator {
namespace {

using ::testing::HasSubstr;
using apapo::v1::CoordinatorMessage;
using apapo::v1::WorkerMessage;

// Two stages, one replica each, on the first two workers of the cluster
// (one stage when the cluster has one worker).
class FakePlanner : public planning::Planner {
 public:
  absl::StatusOr<apapo::v1::Plan> MakePlan(
      const apapo::v1::JobSpec&, const apapo::v1::ModelProfile& profile,
      const apapo::v1::ClusterSpec& cluster) override {
    seen_cluster = cluster;
    seen_profile = profile;
    if (gate != nullptr) {
      entered.Notify();
      gate->WaitForNotification();
    }
    if (!error.ok()) return error;
    if (custom) return custom(profile, cluster);
    apapo::v1::Plan plan;
    plan.set_model(profile.model());
    const int stages = std::min(2, cluster.workers_size());
    for (int s = 0; s < stages; ++s) {
      auto* st = plan.add_stages();
      st->set_index(s);
      st->set_replicas(1);
      st->add_node_ids(stages == 1 ? "fc1,fc2" : s == 0 ? "fc1" : "fc2");
      st->add_placement()->set_worker_id(cluster.workers(s).worker_id());
    }
    plan.mutable_prediction()->set_samples_per_second(100.0 * stages);
    return plan;
  }
  absl::Status error;
  // When set, the plan (the tests' own planner logic).
  std::function<apapo::v1::Plan(const apapo::v1::ModelProfile&,
                                const apapo::v1::ClusterSpec&)>
      custom;
  apapo::v1::ClusterSpec seen_cluster;
  apapo::v1::ModelProfile seen_profile;
  // When set, MakePlan notifies `entered` and blocks until `*gate` opens
  // (one plan per test).
  absl::Notification* gate = nullptr;
  absl::Notification entered;
};

// How long a test waits for something that should happen at once.
constexpr absl::Duration kWait = absl::Seconds(20);

// Runs `f` on a thread of its own, so a test can check with a deadline that
// a call does not block. `unblock` runs before the join and frees whatever
// `f` may be stuck on, so a failing test ends instead of hanging.
class Background {
 public:
  Background(std::function<void()> f, std::function<void()> unblock)
      : unblock_(std::move(unblock)), thread_([this, f] {
          f();
          done_.Notify();
        }) {}
  ~Background() {
    unblock_();
    thread_.join();
  }
  bool DoneWithin(absl::Duration timeout) {
    return done_.WaitForNotificationWithTimeout(timeout);
  }

 private:
  std::function<void()> unblock_;
  absl::Notification done_;
  std::thread thread_;
};

class SchedulerTest : public ::testing::Test {
 protected:
  SchedulerTest() {
    jobs_.SetCancelHook([this](const apapo::v1::Job& j) { scheduler_.OnCancelled(j); });
    registry_.SetLostHook([this](const std::string& w, const std::string& j,
                                 const std::string& r) {
      scheduler_.OnWorkerLost(w, j, r);
    });
  }

  void AddWorker(const std::string& id, const std::string& host = "127.0.0.1",
                 const std::string& core_set = "", int core_set_size = 0,
                 double cpu_quota = 0) {
    apapo::v1::WorkerInfo info;
    info.set_worker_id(id);
    info.set_host(host);
    info.set_core_set(core_set);
    info.set_core_set_size(core_set_size);
    info.set_cpu_quota(cpu_quota);
    auto session = registry_.Register(info);
    EXPECT_TRUE(session.ok());
    if (session.ok()) sessions_[id] = *session;
  }

  // The next command queued for `worker` (must exist now).
  CoordinatorMessage Next(const std::string& worker) {
    auto m = sessions_[worker]->TakeCommand();
    EXPECT_TRUE(m.has_value()) << "no command for " << worker;
    return m.value_or(CoordinatorMessage());
  }
  bool HasCommand(const std::string& worker) {
    return sessions_[worker]->TakeCommand().has_value();
  }

  std::string Submit(int workers, absl::Duration max_duration = absl::ZeroDuration()) {
    apapo::v1::JobSpec spec;
    EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(
        R"pb(name: "s" model { builtin { name: "mlp" } }
             data { fashion_mnist {} batch_size: 100 }
             optimizer { sgd {} learning_rate: 0.1 }
             limits { epochs: 1 })pb",
        &spec));
    spec.mutable_resources()->set_workers(workers);
    spec.mutable_resources()->set_threads_per_worker(threads_per_worker_);
    if (max_restarts_ >= 0) {
      spec.mutable_fault_tolerance()->set_max_restarts(max_restarts_);
    }
    if (min_workers_ > 0) spec.mutable_fault_tolerance()->set_min_workers(min_workers_);
    if (max_workers_ > 0) spec.mutable_fault_tolerance()->set_max_workers(max_workers_);
    spec.mutable_schedule()->set_replan_on_measurement(replan_on_measurement_);
    if (max_duration > absl::ZeroDuration()) {
      spec.mutable_limits()->mutable_max_duration()->set_seconds(
          absl::ToInt64Seconds(max_duration));
    }
    auto job = jobs_.Submit(spec);
    EXPECT_TRUE(job.ok()) << job.status();
    return job->id();
  }

  void Ack(const std::string& worker, int64_t command, int port = 0, int code = 0,
           const std::string& message = "boom") {
    WorkerMessage m;
    m.mutable_ack()->set_command_id(command);
    m.mutable_ack()->set_store_port(port);
    m.mutable_ack()->set_code(code);
    m.mutable_ack()->set_message(code ? message : "");
    scheduler_.OnWorkerMessage(worker, m);
  }

  // The link test's two-phase start on w-1, w-2: w-1 hosts the rendezvous
  // and reports `port`; only then does w-2 get its command. Returns both.
  std::pair<CoordinatorMessage, CoordinatorMessage> StartProfiling(int port = 6000) {
    CoordinatorMessage p0 = Next("w-1");
    EXPECT_TRUE(p0.has_profile());
    EXPECT_EQ(p0.profile().rendezvous().rank(), 0);
    EXPECT_EQ(p0.profile().rendezvous().store_port(), 0);
    EXPECT_EQ(p0.profile().rendezvous().world_size(), 2);
    EXPECT_FALSE(HasCommand("w-2"));  // waits for the store port
    Ack("w-1", p0.command_id(), port);
    CoordinatorMessage p1 = Next("w-2");
    EXPECT_TRUE(p1.has_profile());
    EXPECT_EQ(p1.profile().rendezvous().rank(), 1);
    EXPECT_EQ(p1.profile().rendezvous().store_port(), port);
    return {p0, p1};
  }

  // A job on w-1..w-4, registered now, to where each has its profile
  // command (w-1 hosting the store on port 6000). Returns its id.
  std::string ProfileFour() {
    for (const char* w : {"w-1", "w-2", "w-3", "w-4"}) AddWorker(w);
    std::string id = Submit(4);
    scheduler_.RunOnce();
    CoordinatorMessage host = Next("w-1");
    Ack("w-1", host.command_id(), 6000);
    for (const char* w : {"w-2", "w-3", "w-4"}) EXPECT_TRUE(Next(w).has_profile());
    return id;
  }

  void Profile(const std::string& worker, const std::string& job, double seconds,
               std::vector<apapo::v1::LinkMeasurement> links = {},
               std::vector<apapo::v1::TransferCpuMeasurement> transfers = {},
               std::vector<std::string> host_allreduce_among = {}) {
    WorkerMessage m;
    if (!host_allreduce_among.empty()) {
      auto* a = m.mutable_profile_result()->mutable_host_allreduce();
      a->set_ranks(static_cast<int>(host_allreduce_among.size()));
      a->set_bytes(4 << 20);
      a->set_seconds(0.01);
      for (const auto& id : host_allreduce_among) a->add_worker_ids(id);
    }
    for (auto& l : links) *m.mutable_profile_result()->add_links() = l;
    for (auto& t : transfers) *m.mutable_profile_result()->add_transfer_cpu() = t;
    m.mutable_profile_result()->set_job_id(job);
    auto* n = m.mutable_profile_result()->mutable_profile()->add_nodes();
    n->set_id("fc1");
    n->set_forward_seconds(seconds);
    if (two_nodes_) {
      // fc2 as long as fc1, mini-batches of 100: what the simulator needs.
      auto* fc2 = m.mutable_profile_result()->mutable_profile()->add_nodes();
      fc2->set_id("fc2");
      fc2->add_inputs("fc1");
      fc2->set_forward_seconds(seconds);
      m.mutable_profile_result()->mutable_profile()->set_batch_size(100);
    }
    m.mutable_profile_result()->mutable_profile()->set_model("mlp");
    scheduler_.OnWorkerMessage(worker, m);
  }

  // Drives a job on w-1, w-2 (registered on `core_set` of `cores` CPUs) to
  // RUNNING.
  std::string StartRunningJob(absl::Duration max_duration = absl::ZeroDuration(),
                              const std::string& core_set = "", int cores = 0) {
    AddWorker("w-1", "127.0.0.1", core_set, cores);
    AddWorker("w-2", "127.0.0.1", core_set, cores);
    std::string id = Submit(2, max_duration);
    scheduler_.RunOnce();
    EXPECT_EQ(jobs_.Get(id)->state(), apapo::v1::JOB_STATE_PROFILING);
    StartProfiling();
    Profile("w-1", id, 1.0);
    Profile("w-2", id, 2.0);
    if (core_set.empty() || cores >= 2) {  // a core each (not scaled)
      // Measured at half w-1's speed: profiled once more, and as slow.
      CoordinatorMessage again = Next("w-2");
      EXPECT_TRUE(again.has_profile());
      EXPECT_FALSE(again.profile().has_rendezvous());
      scheduler_.RunOnce();
      EXPECT_EQ(jobs_.Get(id)->state(), apapo::v1::JOB_STATE_PROFILING);
      Profile("w-2", id, 2.0);
    }
    scheduler_.RunOnce();
    EXPECT_EQ(jobs_.Get(id)->state(), apapo::v1::JOB_STATE_PLANNING);
    CoordinatorMessage a0 = Next("w-1");
    EXPECT_EQ(a0.assign().rendezvous().store_port(), 0);
    EXPECT_EQ(a0.assign().rendezvous().rank(), 0);
    EXPECT_EQ(a0.assign().rendezvous().world_size(), 2);
    EXPECT_FALSE(HasCommand("w-2"));  // waits for the store port
    Ack("w-1", a0.command_id(), 5555);
    CoordinatorMessage a1 = Next("w-2");
    EXPECT_EQ(a1.assign().rendezvous().store_port(), 5555);
    EXPECT_EQ(a1.assign().rendezvous().rank(), 1);
    EXPECT_EQ(a1.assign().stage(), 1);
    Ack("w-2", a1.command_id());
    EXPECT_TRUE(Next("w-1").has_start());
    EXPECT_TRUE(Next("w-2").has_start());
    EXPECT_EQ(jobs_.Get(id)->state(), apapo::v1::JOB_STATE_RUNNING);
    return id;
  }

  // Lets a gated FakePlanner return (idempotent).
  void OpenGate() {
    if (!gate_.HasBeenNotified()) gate_.Notify();
  }

  // Brings a job on w-1, w-2 to the point where its plan is computed next.
  std::string ProfiledJob() { return ProfiledAt(1.0); }

  // A job on w-1, w-2 whose profiles are in: w-1's at 1 s, w-2's at
  // `w2_seconds` (so w-2 at 1 / w2_seconds of w-1's speed).
  std::string ProfiledAt(double w2_seconds) {
    AddWorker("w-1");
    AddWorker("w-2");
    std::string id = Submit(2);
    scheduler_.RunOnce();
    StartProfiling();
    Profile("w-1", id, 1.0);
    Profile("w-2", id, w2_seconds);
    return id;
  }
  // A job on w-1, w-2, both registered on `core_set` of `cores` CPUs, sent
  // its profiling commands.
  std::string ProfilingOnCoreSet(const std::string& core_set, int cores) {
    AddWorker("w-1", "127.0.0.1", core_set, cores);
    AddWorker("w-2", "127.0.0.1", core_set, cores);
    std::string id = Submit(2);
    scheduler_.RunOnce();
    StartProfiling();
    return id;
  }

  static SchedulerOptions Options() {
    SchedulerOptions o;
    o.checkpoint_root = "/var/lib/apapo/checkpoints";
    return o;
  }

  // spec.fault_tolerance of the jobs Submit makes (-1 / 0: unset).
  int max_restarts_ = -1;
  int min_workers_ = 0;
  int max_workers_ = 0;
  bool replan_on_measurement_ = false;
  bool two_nodes_ = false;  // Profile() adds fc2 and a batch size
  int threads_per_worker_ = 0;  // spec.resources of the jobs Submit makes
  absl::Notification gate_;
  MemoryJobStore store_;
  FakeClock clock_;
  JobManager jobs_{&store_, &clock_};
  WorkerRegistry registry_{&clock_, absl::Seconds(1)};
  FakePlanner planner_;
  Scheduler scheduler_{&jobs_, &registry_, &planner_, &clock_, Options()};
  std::map<std::string, std::shared_ptr<WorkerSession>> sessions_;
};

// Two one-thread workers pinned to one core profile at half the speed each
// has alone: the planner gets the reference profile scaled to that, each
// worker's core set as the registry has it (not as its result claims), and
// the job's events say so.
TEST_F(SchedulerTest, WorkersSharingACoreAreProfiledAsAlone) {
  std::string id = ProfilingOnCoreSet("boot/0", 1);
  Profile("w-1", id, 1.0);
  WorkerMessage claim;
  claim.mutable_profile_result()->set_job_id(id);
  claim.mutable_profile_result()->mutable_resources()->set_core_set("boot/9");
  claim.mutable_profile_result()->mutable_resources()->set_core_set_size(64);
  auto* n = claim.mutable_profile_result()->mutable_profile()->add_nodes();
  n->set_id("fc1");
  n->set_forward_seconds(2.0);
  claim.mutable_profile_result()->mutable_profile()->set_model("mlp");
  scheduler_.OnWorkerMessage("w-2", claim);
  scheduler_.RunOnce();
  ASSERT_EQ(planner_.seen_cluster.workers_size(), 2);
  EXPECT_DOUBLE_EQ(planner_.seen_profile.nodes(0).forward_seconds(), 0.5);
  for (const auto& w : planner_.seen_cluster.workers()) {
    EXPECT_EQ(w.core_set(), "boot/0") << w.worker_id();
    EXPECT_EQ(w.core_set_size(), 1);
    EXPECT_EQ(w.threads(), 1);
  }
  // Relative speeds from the times alone: w-2 still took twice as long.
  EXPECT_DOUBLE_EQ(planner_.seen_cluster.workers(1).relative_speed(), 0.5);
  std::string events;
  const auto change = jobs_.WaitForChange(id, -1, 0, absl::InfinitePast());
  ASSERT_TRUE(change.ok());
  for (const auto& e : change->events) {
    events += e.message() + "\n";
  }
  EXPECT_THAT(events, HasSubstr("w-1 shares 1 core(s) with 1 of the job's workers"));
  EXPECT_THAT(events, HasSubstr("scaled to 0.50"));
}

// A job on w-3, w-4 profiles on the 2 cores where another job trains on
// w-1, w-2: each had half a core, and the planner is told of the others'
// threads.
TEST_F(SchedulerTest, OtherJobsOnTheSameCoresCount) {
  StartRunningJob(absl::ZeroDuration(), "boot/0-1", 2);
  AddWorker("w-3", "127.0.0.1", "boot/0-1", 2);
  AddWorker("w-4", "127.0.0.1", "boot/0-1", 2);
  std::string id = Submit(2);
  scheduler_.RunOnce();
  CoordinatorMessage p0 = Next("w-3");
  ASSERT_TRUE(p0.has_profile());
  Ack("w-3", p0.command_id(), 6001);
  ASSERT_TRUE(Next("w-4").has_profile());
  Profile("w-3", id, 1.0);
  Profile("w-4", id, 1.0);
  scheduler_.RunOnce();
  ASSERT_EQ(planner_.seen_cluster.workers_size(), 2);
  EXPECT_EQ(planner_.seen_cluster.workers(0).worker_id(), "w-3");
  EXPECT_DOUBLE_EQ(planner_.seen_profile.nodes(0).forward_seconds(), 0.5);
  for (const auto& w : planner_.seen_cluster.workers()) {
    EXPECT_EQ(w.threads_elsewhere(), 2) << w.worker_id();
  }
  const auto change = jobs_.WaitForChange(id, -1, 0, absl::InfinitePast());
  ASSERT_TRUE(change.ok());
  std::string events;
  for (const auto& e : change->events) events += e.message() + "\n";
  EXPECT_THAT(events, HasSubstr("w-3 shares 2 core(s) with 1 of the job's workers at 1 "
                                "thread(s) each and 2 thread(s) of other jobs: its "
                                "profile is scaled to 0.50"));
}

// Two one-thread workers on a 2-core set have a core each: as measured.
TEST_F(SchedulerTest, WorkersWithCoresEnoughAreProfiledAsMeasured) {
  std::string id = ProfilingOnCoreSet("boot/0-1", 2);
  Profile("w-1", id, 1.0);
  Profile("w-2", id, 1.0);
  scheduler_.RunOnce();
  ASSERT_EQ(planner_.seen_cluster.workers_size(), 2);
  EXPECT_DOUBLE_EQ(planner_.seen_profile.nodes(0).forward_seconds(), 1.0);
  EXPECT_EQ(planner_.seen_cluster.workers(0).core_set(), "boot/0-1");
  EXPECT_EQ(planner_.seen_cluster.workers(0).core_set_size(), 2);
}

// A job of 2 threads per worker on two workers of one 2-core set, each
// registered with `cpu_quota`: the threads the planner counts per worker,
// and the factor their profiles were scaled by (1: as measured).
struct QuotaSeen {
  int threads = 0;
  double scale = 0;
};

class SchedulerQuotaTest : public SchedulerTest {
 protected:
  QuotaSeen ProfileUnderQuota(double cpu_quota) {
    threads_per_worker_ = 2;
    AddWorker("w-1", "127.0.0.1", "boot/0-1", 2, cpu_quota);
    AddWorker("w-2", "127.0.0.1", "boot/0-1", 2, cpu_quota);
    std::string id = Submit(2);
    scheduler_.RunOnce();
    StartProfiling();
    Profile("w-1", id, 1.0);
    Profile("w-2", id, 1.0);
    scheduler_.RunOnce();
    EXPECT_EQ(planner_.seen_cluster.workers_size(), 2);
    if (planner_.seen_cluster.workers_size() != 2) return {};
    EXPECT_EQ(planner_.seen_cluster.workers(0).threads(),
              planner_.seen_cluster.workers(1).threads());
    return {planner_.seen_cluster.workers(0).threads(),
            planner_.seen_profile.nodes(0).forward_seconds()};
  }
};

// Without a quota, 2 workers of 2 threads crowd 2 cores: each profiled at
// half its speed alone.
TEST_F(SchedulerQuotaTest, TwoThreadsEachOnTwoCoresCrowdThem) {
  const QuotaSeen seen = ProfileUnderQuota(0);
  EXPECT_EQ(seen.threads, 2);
  EXPECT_DOUBLE_EQ(seen.scale, 0.5);
}

// A cgroup quota of one core each (a container's CPU limit): their stages
// compute with 1 thread (StageThreads), which the 2 cores hold, so the
// profiles stand as measured; alone, a quota'd worker is no faster.
TEST_F(SchedulerQuotaTest, AQuotaOfACoreEachBoundsTheThreadsCounted) {
  const QuotaSeen seen = ProfileUnderQuota(1.0);
  EXPECT_EQ(seen.threads, 1);
  EXPECT_DOUBLE_EQ(seen.scale, 1.0);
}

TEST_F(SchedulerTest, FullLifecycleToSucceededWithProgress) {
  std::string id = StartRunningJob();
  // Relative speed from the profiles: w-2 took twice as long.
  EXPECT_DOUBLE_EQ(planner_.seen_cluster.workers(1).relative_speed(), 0.5);
  EXPECT_EQ(jobs_.GetPlan(id)->plan().stages(1).placement(0).rank(), 1);

  WorkerMessage metrics;
  auto* r = metrics.mutable_metrics();
  r->set_job_id(id);
  r->set_step(300);
  r->set_total_steps(600);
  r->set_epoch(1);
  r->set_samples_per_second(1000);
  r->set_has_loss(true);
  r->set_loss(0.4);
  r->set_test_accuracy(0.87);
  r->mutable_stage()->set_stage(1);
  r->mutable_stage()->set_busy_seconds(10);
  r->mutable_stage()->set_comm_total_seconds(2);
  r->mutable_stage()->set_comm_exposed_seconds(0.5);
  r->mutable_stage()->set_max_staleness(1);
  scheduler_.OnWorkerMessage("w-2", metrics);
  auto p = jobs_.Get(id)->progress();
  EXPECT_EQ(p.step(), 300);
  EXPECT_DOUBLE_EQ(p.loss(), 0.4);
  EXPECT_DOUBLE_EQ(p.test_accuracy(), 0.87);
  EXPECT_EQ(p.eta().seconds(), 30);  // 300 steps at 10 steps/s
  ASSERT_EQ(p.stages_size(), 1);
  EXPECT_DOUBLE_EQ(p.stages(0).comm_hidden_fraction(), 0.75);
  EXPECT_EQ(p.stages(0).steps(), 300);  // its busy seconds' steps

  for (const char* w : {"w-1", "w-2"}) {
    WorkerMessage done;
    done.mutable_outcome()->set_job_id(id);
    scheduler_.OnWorkerMessage(w, done);
  }
  auto job = jobs_.Get(id);
  EXPECT_EQ(job->state(), apapo::v1::JOB_STATE_SUCCEEDED);
  EXPECT_THAT(jobs_.WaitForChange(id, -1, 0, absl::InfinitePast())->events.back().message(),
              HasSubstr("test accuracy 87.00%"));
  EXPECT_EQ(registry_.CountByState()[apapo::v1::WORKER_STATE_IDLE], 2);
}

TEST_F(SchedulerTest, WaitsForWorkersThenRunsWhenOneJoins) {
  AddWorker("w-1");
  std::string id = Submit(2);
  scheduler_.RunOnce();
  scheduler_.RunOnce();
  EXPECT_EQ(jobs_.Get(id)->state(), apapo::v1::JOB_STATE_QUEUED);
  auto events = jobs_.WaitForChange(id, -1, 0, absl::InfinitePast())->events;
  ASSERT_EQ(events.size(), 2u);  // submitted + one "waiting" note, not one per pass
  EXPECT_THAT(events[1].message(), HasSubstr("needs 2 idle worker(s), 1 available"));
  AddWorker("w-2");
  scheduler_.RunOnce();
  EXPECT_EQ(jobs_.Get(id)->state(), apapo::v1::JOB_STATE_PROFILING);
}

TEST_F(SchedulerTest, LostWorkerFailsTheJobNamingItAndFreesTheOthers) {
  max_restarts_ = 0;  // the fault fails the job
  std::string id = StartRunningJob();
  registry_.Disconnect(*sessions_["w-2"], "stream closed");
  auto job = jobs_.Get(id);
  EXPECT_EQ(job->state(), apapo::v1::JOB_STATE_FAILED);
  EXPECT_EQ(job->error(),
            "worker w-2 lost: stream closed; not restarted: "
            "spec.fault_tolerance.max_restarts (0) used up");
  EXPECT_EQ(job->error_code(), static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_TRUE(Next("w-1").has_stop());
  EXPECT_EQ(registry_.CountByState()[apapo::v1::WORKER_STATE_IDLE], 1);
}

TEST_F(SchedulerTest, StageFailureStopsEveryStage) {
  max_restarts_ = 0;  // the fault fails the job
  std::string id = StartRunningJob();
  WorkerMessage failed;
  failed.mutable_outcome()->set_job_id(id);
  failed.mutable_outcome()->set_stage(0);
  failed.mutable_outcome()->set_code(static_cast<int>(absl::StatusCode::kDeadlineExceeded));
  failed.mutable_outcome()->set_message("recv from rank 1 timed out after 60s");
  scheduler_.OnWorkerMessage("w-1", failed);
  auto job = jobs_.Get(id);
  EXPECT_EQ(job->state(), apapo::v1::JOB_STATE_FAILED);
  EXPECT_EQ(job->error(),
            "stage 0 on w-1: recv from rank 1 timed out after 60s; not restarted: "
            "spec.fault_tolerance.max_restarts (0) used up");
  EXPECT_TRUE(Next("w-2").has_stop());
  EXPECT_EQ(registry_.CountByState()[apapo::v1::WORKER_STATE_IDLE], 2);
}

TEST_F(SchedulerTest, CancelStopsStagesAndFreesWorkers) {
  std::string id = StartRunningJob();
  ASSERT_TRUE(jobs_.Cancel(id, "user").ok());
  EXPECT_TRUE(Next("w-1").has_stop());
  EXPECT_TRUE(Next("w-2").has_stop());
  EXPECT_EQ(registry_.CountByState()[apapo::v1::WORKER_STATE_IDLE], 2);
  // Late messages of the cancelled job are ignored.
  WorkerMessage done;
  done.mutable_outcome()->set_job_id(id);
  scheduler_.OnWorkerMessage("w-1", done);
  EXPECT_EQ(jobs_.Get(id)->state(), apapo::v1::JOB_STATE_CANCELLED);
}

TEST_F(SchedulerTest, AJobPastItsMaxDurationIsStoppedAndFailed) {
  std::string id = StartRunningJob(absl::Seconds(60));
  clock_.Advance(absl::Seconds(59));
  scheduler_.RunOnce();
  EXPECT_EQ(jobs_.Get(id)->state(), apapo::v1::JOB_STATE_RUNNING);
  clock_.Advance(absl::Seconds(2));
  scheduler_.RunOnce();
  auto job = jobs_.Get(id);
  EXPECT_EQ(job->state(), apapo::v1::JOB_STATE_FAILED);
  EXPECT_EQ(job->error_code(), static_cast<int>(absl::StatusCode::kDeadlineExceeded));
  EXPECT_EQ(job->error(),
            "ran past spec.limits.max_duration (1m): stopped after 1m1s");
  // Every stage is told to stop, and the workers are free again.
  EXPECT_TRUE(Next("w-1").has_stop());
  EXPECT_TRUE(Next("w-2").has_stop());
  EXPECT_EQ(registry_.CountByState()[apapo::v1::WORKER_STATE_IDLE], 2);
}

TEST_F(SchedulerTest, ProfilingDeadlineFailsNamingTheSilentWorker) {
  AddWorker("w-1");
  AddWorker("w-2");
  std::string id = Submit(2);
  scheduler_.RunOnce();
  Profile("w-1", id, 1.0);
  clock_.Advance(SchedulerOptions().profile_timeout + absl::Seconds(1));
  scheduler_.RunOnce();
  auto job = jobs_.Get(id);
  EXPECT_EQ(job->state(), apapo::v1::JOB_STATE_FAILED);
  EXPECT_THAT(job->error(), HasSubstr("profiling did not finish in time; waiting on w-2"));
  EXPECT_EQ(job->error_code(), static_cast<int>(absl::StatusCode::kDeadlineExceeded));
}

TEST_F(SchedulerTest, PlannerErrorFailsTheJobWithItsReason) {
  planner_.error = absl::ResourceExhaustedError("stage 0 needs 3 GiB, workers have 1 GiB");
  AddWorker("w-1");
  std::string id = Submit(1);
  scheduler_.RunOnce();
  Profile("w-1", id, 1.0);
  scheduler_.RunOnce();
  auto job = jobs_.Get(id);
  EXPECT_EQ(job->state(), apapo::v1::JOB_STATE_FAILED);
  EXPECT_EQ(job->error(), "planning failed: stage 0 needs 3 GiB, workers have 1 GiB");
  EXPECT_EQ(registry_.CountByState()[apapo::v1::WORKER_STATE_IDLE], 1);
}

TEST_F(SchedulerTest, RefusedAssignmentFailsTheJob) {
  std::string id = ProfiledJob();
  scheduler_.RunOnce();
  CoordinatorMessage a0 = Next("w-1");
  Ack("w-1", a0.command_id(), 0, static_cast<int>(absl::StatusCode::kInvalidArgument));
  auto job = jobs_.Get(id);
  EXPECT_EQ(job->state(), apapo::v1::JOB_STATE_FAILED);
  EXPECT_EQ(job->error(), "worker w-1: boom");
}

apapo::v1::LinkMeasurement Link(const std::string& from, const std::string& to,
                                double bandwidth, double latency) {
  apapo::v1::LinkMeasurement l;
  l.set_from_worker(from);
  l.set_to_worker(to);
  l.set_bandwidth_bytes_per_second(bandwidth);
  l.set_latency_seconds(latency);
  l.set_message_bytes(4 << 20);
  return l;
}

// All of a job's events, one per line.
std::string Events(JobManager& jobs, const std::string& id) {
  std::string events;
  const auto change = jobs.WaitForChange(id, -1, 0, absl::InfinitePast());
  if (!change.ok()) return change.status().ToString();
  for (const auto& e : change->events) events += e.message() + "\n";
  return events;
}

// w-2 profiled at 0.4x w-1's speed in a slow spell: it is profiled once
// more, alone (no link test), before anything is planned; its faster
// second profile is what the planner gets, with the first's links.
TEST_F(SchedulerTest, AWorkerProfiledSlowIsProfiledAgainAndTheFasterProfileKept) {
  // Two one-thread workers on a 2-core set: a core each, measured as is.
  AddWorker("w-1", "127.0.0.1", "boot/0-1", 2);
  AddWorker("w-2", "127.0.0.1", "boot/0-1", 2);
  std::string id = Submit(2);
  scheduler_.RunOnce();
  StartProfiling();
  Profile("w-1", id, 1.0, {Link("w-1", "w-2", 3.0e8, 1e-4)});
  Profile("w-2", id, 2.5, {Link("w-2", "w-1", 2.5e8, 2e-4)});
  EXPECT_FALSE(HasCommand("w-1"));
  CoordinatorMessage again = Next("w-2");
  ASSERT_TRUE(again.has_profile());
  EXPECT_EQ(again.profile().job_id(), id);
  EXPECT_FALSE(again.profile().has_rendezvous());
  EXPECT_EQ(again.profile().peers_size(), 0);
  EXPECT_EQ(again.profile().spec().name(), "s");
  scheduler_.RunOnce();
  EXPECT_EQ(planner_.seen_cluster.workers_size(), 0);  // waits for it
  EXPECT_EQ(jobs_.Get(id)->state(), apapo::v1::JOB_STATE_PROFILING);
  Profile("w-2", id, 1.1);
  scheduler_.RunOnce();
  ASSERT_EQ(planner_.seen_cluster.workers_size(), 2);
  EXPECT_NEAR(planner_.seen_cluster.workers(1).relative_speed(), 1.0 / 1.1, 1e-9);
  EXPECT_EQ(planner_.seen_cluster.links_size(), 2);  // the first round's
  const std::string events = Events(jobs_, id);
  EXPECT_THAT(events, HasSubstr("w-2 computed at 0.40x the fastest worker's speed: "
                                "profiling it once more, alone"));
  EXPECT_THAT(events, HasSubstr("w-2 profiled again: 0.44x the time of its first "
                                "profile; the second is kept"));
  EXPECT_THAT(events, ::testing::Not(HasSubstr("w-1 computed at")));
}

// The first round ran side by side in a slow spell: w-2, profiled alone,
// comes back 5x faster, and w-1, as crowded in the first round, now reads
// at 0.34x of it. w-1 is profiled alone too before anything is planned
// (planned on the two rounds as they were, the job would run w-2 alone),
// and nobody a third time.
TEST_F(SchedulerTest, OneProfiledAloneFarFasterHasTheOthersProfiledAloneToo) {
  const std::string id = ProfiledAt(1.6);  // w-2 at 0.63x w-1's speed
  ASSERT_TRUE(Next("w-2").has_profile());
  EXPECT_FALSE(HasCommand("w-1"));
  Profile("w-2", id, 0.34);
  CoordinatorMessage again = Next("w-1");
  ASSERT_TRUE(again.has_profile());
  EXPECT_FALSE(again.profile().has_rendezvous());
  EXPECT_EQ(again.profile().peers_size(), 0);
  scheduler_.RunOnce();
  EXPECT_EQ(planner_.seen_cluster.workers_size(), 0);  // waits for it
  Profile("w-1", id, 0.35);
  EXPECT_FALSE(HasCommand("w-1"));
  EXPECT_FALSE(HasCommand("w-2"));
  scheduler_.RunOnce();
  ASSERT_EQ(planner_.seen_cluster.workers_size(), 2);
  // Speeds are relative to the first worker's.
  EXPECT_NEAR(planner_.seen_cluster.workers(1).relative_speed(), 0.35 / 0.34, 1e-9);
  const std::string events = Events(jobs_, id);
  EXPECT_THAT(events, HasSubstr("w-2 profiled again: 0.21x the time of its first "
                                "profile; the second is kept"));
  EXPECT_THAT(events, HasSubstr("w-1 computed at 0.34x the speed of w-2, which was "
                                "profiled alone: profiling it once more, alone"));
  EXPECT_THAT(events, HasSubstr("w-1 profiled again: 0.35x the time of its first "
                                "profile; the second is kept"));
}

// The same, but w-1 is no faster alone: its first profile stands, w-2 is
// not profiled a third time, and the job is planned with w-1 slow.
TEST_F(SchedulerTest, AWorkerProfiledAgainIsNotProfiledAThirdTime) {
  const std::string id = ProfiledAt(1.6);
  ASSERT_TRUE(Next("w-2").has_profile());
  Profile("w-2", id, 0.34);
  ASSERT_TRUE(Next("w-1").has_profile());
  Profile("w-1", id, 1.1);
  EXPECT_FALSE(HasCommand("w-1"));
  EXPECT_FALSE(HasCommand("w-2"));
  scheduler_.RunOnce();
  ASSERT_EQ(planner_.seen_cluster.workers_size(), 2);
  EXPECT_NEAR(planner_.seen_cluster.workers(1).relative_speed(), 1.0 / 0.34, 1e-9);
  EXPECT_THAT(Events(jobs_, id), HasSubstr("w-1 profiled again: 1.10x the time of its "
                                           "first profile; the first is kept"));
}

// Slow again (or slower): the first profile stands, and only once.
TEST_F(SchedulerTest, AWorkerSlowTwiceKeepsItsFasterProfileAndIsPlannedSlow) {
  const std::string id = ProfiledAt(2.0);
  ASSERT_TRUE(Next("w-2").has_profile());
  Profile("w-2", id, 3.0);
  EXPECT_FALSE(HasCommand("w-2"));
  scheduler_.RunOnce();
  ASSERT_EQ(planner_.seen_cluster.workers_size(), 2);
  EXPECT_DOUBLE_EQ(planner_.seen_cluster.workers(1).relative_speed(), 0.5);
  EXPECT_THAT(Events(jobs_, id), HasSubstr("w-2 profiled again: 1.50x the time of its "
                                           "first profile; the first is kept"));
}

// Within remeasure_below_speed (0.8) nobody is profiled again. (Workers
// that share a core set with the job's others never are: their profiles
// were scaled to alone; WorkersSharingACoreAreProfiledAsAlone plans w-2 at
// 0.5x without a second profile.)
TEST_F(SchedulerTest, WorkersNearTheFastestAreNotProfiledAgain) {
  const std::string id = ProfiledAt(1.2);
  EXPECT_FALSE(HasCommand("w-2"));
  scheduler_.RunOnce();
  EXPECT_EQ(planner_.seen_cluster.workers_size(), 2);
}

// A second profile that fails (its process killed): the first stands and
// the job is planned on it, not failed.
TEST_F(SchedulerTest, ASecondProfileThatFailsKeepsTheFirst) {
  const std::string id = ProfiledAt(2.0);
  CoordinatorMessage again = Next("w-2");
  ASSERT_TRUE(again.has_profile());
  Ack("w-2", again.command_id(), 0, static_cast<int>(absl::StatusCode::kInternal),
      "profiling job-1: the model's process was killed by signal 9");
  EXPECT_EQ(jobs_.Get(id)->state(), apapo::v1::JOB_STATE_PROFILING);
  scheduler_.RunOnce();
  EXPECT_EQ(jobs_.Get(id)->state(), apapo::v1::JOB_STATE_PLANNING);
  ASSERT_EQ(planner_.seen_cluster.workers_size(), 2);
  EXPECT_DOUBLE_EQ(planner_.seen_cluster.workers(1).relative_speed(), 0.5);
  EXPECT_THAT(Events(jobs_, id),
              HasSubstr("w-2's second profile failed (profiling job-1: the model's "
                        "process was killed by signal 9); its first is kept"));
}

TEST_F(SchedulerTest, ASecondProfileThatDoesNotComeFailsTheJobNamingTheWorker) {
  const std::string id = ProfiledAt(2.0);
  ASSERT_TRUE(Next("w-2").has_profile());
  clock_.Advance(Options().profile_timeout + absl::Seconds(1));
  scheduler_.RunOnce();
  auto job = jobs_.Get(id);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->state(), apapo::v1::JOB_STATE_FAILED);
  EXPECT_THAT(job->error(), HasSubstr("profiling did not finish in time; waiting on w-2"));
}

TEST_F(SchedulerTest, TheSlowestMeasuredLinkIsTheClustersBandwidth) {
  AddWorker("w-1", "10.0.0.1");
  AddWorker("w-2", "10.0.0.2");
  std::string id = Submit(2);
  scheduler_.RunOnce();
  auto [p0, p1] = StartProfiling(7000);
  // The rendezvous is the first worker's, for these two workers.
  const auto& rv = p1.profile().rendezvous();
  EXPECT_EQ(rv.store_host(), "10.0.0.1");
  EXPECT_EQ(rv.prefix(), id + "/profile");
  EXPECT_EQ(rv.timeout().seconds(),
            absl::ToInt64Seconds(SchedulerOptions().transfer_timeout));
  EXPECT_THAT(p1.profile().peers(), ::testing::ElementsAre("w-1", "w-2"));
  EXPECT_EQ(p0.profile().spec().resources().workers(), 2);
  // The host's final ack (profiling done) is not a second port report.
  Ack("w-1", p0.command_id(), 0);
  EXPECT_EQ(jobs_.Get(id)->state(), apapo::v1::JOB_STATE_PROFILING);

  // w-2 also timed its transfers by size (a model with large activations);
  // the planner gets them named by worker (the worker does not name itself).
  apapo::v1::TransferCpuMeasurement t4, t19;
  t4.set_message_bytes(4 << 20);
  t4.set_cpu_seconds_per_byte(0.2e-9);
  t19.set_message_bytes(19 << 20);
  t19.set_cpu_seconds_per_byte(0.8e-9);
  t19.set_worker_id("w-1");  // forged: the coordinator sets the sender's id
  Profile("w-1", id, 1.0, {Link("w-1", "w-2", 3.0e8, 1e-4)});
  Profile("w-2", id, 1.0, {Link("w-2", "w-1", 2.5e8, 2e-4)}, {t4, t19});
  scheduler_.RunOnce();
  ASSERT_EQ(jobs_.Get(id)->state(), apapo::v1::JOB_STATE_PLANNING);
  const apapo::v1::ClusterSpec& seen = planner_.seen_cluster;
  ASSERT_EQ(seen.transfer_cpu_size(), 2);
  EXPECT_EQ(seen.transfer_cpu(0).worker_id(), "w-2");
  EXPECT_EQ(seen.transfer_cpu(1).worker_id(), "w-2");
  EXPECT_EQ(seen.transfer_cpu(1).message_bytes(), 19 << 20);
  EXPECT_DOUBLE_EQ(seen.transfer_cpu(1).cpu_seconds_per_byte(), 0.8e-9);

  ASSERT_EQ(seen.levels_size(), 1);
  EXPECT_DOUBLE_EQ(seen.levels(0).bandwidth_bytes_per_second(), 2.5e8);
  EXPECT_DOUBLE_EQ(seen.levels(0).latency_seconds(), 2e-4);
  EXPECT_EQ(seen.links_size(), 2);
  // GetPlan shows the links and the bandwidth planned with.
  auto stored = jobs_.GetPlan(id);
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(stored->cluster().links_size(), 2);
  EXPECT_DOUBLE_EQ(stored->cluster().levels(0).bandwidth_bytes_per_second(), 2.5e8);
  bool noted = false;
  auto change = jobs_.WaitForChange(id, -1, 0, absl::InfinitePast());
  ASSERT_TRUE(change.ok()) << change.status();
  for (const auto& e : change->events) {
    noted |= absl::StrContains(
        e.message(), "links measured: 2; network one level: slowest link 0.25 GB/s");
  }
  EXPECT_TRUE(noted);
  // The stages' own rendezvous is a new one (port 0 again, its own prefix).
  CoordinatorMessage a0 = Next("w-1");
  EXPECT_EQ(a0.assign().rendezvous().store_port(), 0);
  EXPECT_EQ(a0.assign().rendezvous().prefix(), id);
}

// A worker sends 3 transfer CPU figures; one that sends thousands would
// make the planner's cost curve (walked in its inner loop) long: the
// coordinator keeps the first 8 of each worker's.
TEST_F(SchedulerTest, AWorkersTransferCpuFiguresAreCapped) {
  AddWorker("w-1");
  AddWorker("w-2");
  std::string id = Submit(2);
  scheduler_.RunOnce();
  StartProfiling();
  std::vector<apapo::v1::TransferCpuMeasurement> many(5000);
  for (size_t i = 0; i < many.size(); ++i) {
    many[i].set_message_bytes(static_cast<int64_t>(i + 1) << 20);
    many[i].set_cpu_seconds_per_byte(1e-9);
  }
  Profile("w-1", id, 1.0, {}, many);
  Profile("w-2", id, 1.0, {}, {many[0], many[1]});
  scheduler_.RunOnce();
  ASSERT_EQ(jobs_.Get(id)->state(), apapo::v1::JOB_STATE_PLANNING);
  const apapo::v1::ClusterSpec& seen = planner_.seen_cluster;
  int from_w1 = 0, from_w2 = 0;
  for (const auto& t : seen.transfer_cpu()) {
    (t.worker_id() == "w-1" ? from_w1 : from_w2)++;
  }
  EXPECT_EQ(from_w1, 8);
  EXPECT_EQ(from_w2, 2);
}

TEST_F(SchedulerTest, LinksFastWithinHostsAndSlowBetweenMakeTwoLevels) {
  // w-1 and w-3 share a host, as do w-2 and w-4.
  const std::string id = ProfileFour();
  auto links_of = [](const std::string& me) {
    std::vector<apapo::v1::LinkMeasurement> links;
    for (const char* other : {"w-1", "w-2", "w-3", "w-4"}) {
      if (me == other) continue;
      const bool same_host = (me.back() - '0') % 2 == (other[2] - '0') % 2;
      links.push_back(Link(me, other, same_host ? 1.2e9 : 1.18e8,
                           same_host ? 2e-5 : 2e-4));
    }
    return links;
  };
  for (const char* w : {"w-1", "w-2", "w-3", "w-4"}) Profile(w, id, 1.0, links_of(w));
  scheduler_.RunOnce();
  ASSERT_EQ(jobs_.Get(id)->state(), apapo::v1::JOB_STATE_PLANNING);
  const apapo::v1::ClusterSpec& seen = planner_.seen_cluster;
  ASSERT_EQ(seen.levels_size(), 2);
  EXPECT_EQ(seen.levels(0).group_size(), 2);
  EXPECT_DOUBLE_EQ(seen.levels(0).bandwidth_bytes_per_second(), 1.2e9);
  EXPECT_EQ(seen.levels(1).group_size(), 2);
  EXPECT_DOUBLE_EQ(seen.levels(1).bandwidth_bytes_per_second(), 1.18e8);
  // Workers in plan order: each host's two workers side by side.
  std::vector<std::string> order;
  for (const auto& w : seen.workers()) order.push_back(w.worker_id());
  EXPECT_THAT(order, ::testing::ElementsAre("w-1", "w-3", "w-2", "w-4"));
}

// A worker's all-reduce inside its host reaches the planner only where it
// names the worker itself among distinct workers the job holds, as many
// as took part: a worker does not speak for others.
TEST_F(SchedulerTest, AHostsAllReduceIsKeptOnlyWhereItNamesTheJobsWorkersAndItsOwn) {
  const std::string id = ProfileFour();
  Profile("w-1", id, 1.0, {}, {}, {"w-1", "w-3"});   // kept
  Profile("w-2", id, 1.0, {}, {}, {"w-2", "w-9"});   // w-9: not the job's
  Profile("w-3", id, 1.0, {}, {}, {"w-1", "w-4"});   // not w-3's own
  Profile("w-4", id, 1.0, {}, {}, {"w-4", "w-4"});   // the same twice
  scheduler_.RunOnce();
  ASSERT_EQ(jobs_.Get(id)->state(), apapo::v1::JOB_STATE_PLANNING);
  std::vector<std::string> kept;
  for (const auto& a : planner_.seen_cluster.allreduces()) {
    kept.push_back(absl::StrJoin(a.worker_ids(), ","));
  }
  EXPECT_THAT(kept, ::testing::ElementsAre("w-1,w-3"));
}

TEST_F(SchedulerTest, SingleWorkerJobSkipsTheLinkTest) {
  planner_.error = absl::ResourceExhaustedError("stop here");
  AddWorker("w-1");
  std::string id = Submit(1);
  scheduler_.RunOnce();
  CoordinatorMessage p = Next("w-1");
  ASSERT_TRUE(p.has_profile());
  EXPECT_FALSE(p.profile().has_rendezvous());
  EXPECT_EQ(p.profile().peers_size(), 0);
  Profile("w-1", id, 1.0);
  scheduler_.RunOnce();
  // Nothing measured: the assumed 1 GB/s.
  EXPECT_DOUBLE_EQ(planner_.seen_cluster.levels(0).bandwidth_bytes_per_second(), 1e9);
  EXPECT_EQ(planner_.seen_cluster.links_size(), 0);
}

TEST_F(SchedulerTest, FailedLinkTestFailsTheJobNamingBothWorkers) {
  AddWorker("w-1");
  AddWorker("w-2");
  std::string id = Submit(2);
  scheduler_.RunOnce();
  auto [p0, p1] = StartProfiling();
  Ack("w-2", p1.command_id(), 0, static_cast<int>(absl::StatusCode::kUnavailable),
      "link test with worker w-1 (rank 0): connection closed by peer");
  auto job = jobs_.Get(id);
  EXPECT_EQ(job->state(), apapo::v1::JOB_STATE_FAILED);
  EXPECT_EQ(job->error(),
            "worker w-2: link test with worker w-1 (rank 0): connection closed by peer");
  EXPECT_EQ(job->error_code(), static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_TRUE(Next("w-1").has_stop());  // ends w-1's half of the test
  EXPECT_EQ(registry_.CountByState()[apapo::v1::WORKER_STATE_IDLE], 2);
}

TEST_F(SchedulerTest, LinkTestHostWithoutAPortFailsTheJob) {
  AddWorker("w-1");
  AddWorker("w-2");
  std::string id = Submit(2);
  scheduler_.RunOnce();
  CoordinatorMessage p0 = Next("w-1");
  Ack("w-1", p0.command_id(), 0);
  auto job = jobs_.Get(id);
  EXPECT_EQ(job->state(), apapo::v1::JOB_STATE_FAILED);
  EXPECT_THAT(job->error(), HasSubstr("w-1 did not report the port"));
  EXPECT_TRUE(Next("w-2").has_stop());  // never a profile command
  EXPECT_EQ(registry_.CountByState()[apapo::v1::WORKER_STATE_IDLE], 2);
}

TEST_F(SchedulerTest, EventsAreServedWhileThePlannerRuns) {
  planner_.gate = &gate_;
  std::string id = ProfiledJob();
  AddWorker("w-3");
  std::string other = Submit(1);
  {
    Background planning([&] { scheduler_.RunOnce(); }, [&] { OpenGate(); });
    ASSERT_TRUE(planner_.entered.WaitForNotificationWithTimeout(kWait));
    // Calls that take the scheduler's lock do not wait for the planner: a
    // wake-up, a second pass that admits another job onto w-3, and a
    // worker's message.
    Background events(
        [&] {
          scheduler_.Wake();
          scheduler_.RunOnce();
          WorkerMessage ack;
          ack.mutable_ack()->set_command_id(12345);
          scheduler_.OnWorkerMessage("w-3", ack);
        },
        [&] { OpenGate(); });
    EXPECT_TRUE(events.DoneWithin(kWait)) << "blocked behind the planner";
    EXPECT_EQ(jobs_.Get(other)->state(), apapo::v1::JOB_STATE_PROFILING);
    EXPECT_TRUE(Next("w-3").has_profile());
    // The second pass did not plan the job again, nor assign anything yet.
    EXPECT_EQ(jobs_.Get(id)->state(), apapo::v1::JOB_STATE_PLANNING);
    EXPECT_FALSE(HasCommand("w-1"));
    OpenGate();
    EXPECT_TRUE(planning.DoneWithin(kWait));
  }
  CoordinatorMessage a0 = Next("w-1");
  ASSERT_TRUE(a0.has_assign());
  EXPECT_EQ(a0.assign().job_id(), id);
  EXPECT_EQ(a0.assign().rendezvous().rank(), 0);
}

TEST_F(SchedulerTest, CancelWhilePlanningDiscardsTheLatePlan) {
  planner_.gate = &gate_;
  std::string id = ProfiledJob();
  {
    Background planning([&] { scheduler_.RunOnce(); }, [&] { OpenGate(); });
    ASSERT_TRUE(planner_.entered.WaitForNotificationWithTimeout(kWait));
    Background cancel([&] { EXPECT_TRUE(jobs_.Cancel(id, "user").ok()); },
                      [&] { OpenGate(); });
    EXPECT_TRUE(cancel.DoneWithin(kWait)) << "blocked behind the planner";
    EXPECT_TRUE(Next("w-1").has_stop());
    EXPECT_TRUE(Next("w-2").has_stop());
    OpenGate();
    EXPECT_TRUE(planning.DoneWithin(kWait));
  }
  EXPECT_EQ(jobs_.Get(id)->state(), apapo::v1::JOB_STATE_CANCELLED);
  // The plan that came back after the cancel was not applied.
  EXPECT_FALSE(HasCommand("w-1"));
  EXPECT_FALSE(HasCommand("w-2"));
  EXPECT_EQ(jobs_.GetPlan(id).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(registry_.CountByState()[apapo::v1::WORKER_STATE_IDLE], 2);
}

TEST_F(SchedulerTest, WorkerLostWhilePlanningFailsTheJobAndDiscardsThePlan) {
  max_restarts_ = 0;  // the fault fails the job
  planner_.gate = &gate_;
  std::string id = ProfiledJob();
  {
    Background planning([&] { scheduler_.RunOnce(); }, [&] { OpenGate(); });
    ASSERT_TRUE(planner_.entered.WaitForNotificationWithTimeout(kWait));
    Background lose(
        [&] { registry_.Disconnect(*sessions_["w-2"], "stream closed"); },
        [&] { OpenGate(); });
    EXPECT_TRUE(lose.DoneWithin(kWait)) << "blocked behind the planner";
    OpenGate();
    EXPECT_TRUE(planning.DoneWithin(kWait));
  }
  auto job = jobs_.Get(id);
  EXPECT_EQ(job->state(), apapo::v1::JOB_STATE_FAILED);
  EXPECT_THAT(job->error(), HasSubstr("worker w-2 lost: stream closed"));
  EXPECT_TRUE(Next("w-1").has_stop());
  EXPECT_FALSE(HasCommand("w-1"));  // no assignment after the stop
  EXPECT_EQ(registry_.CountByState()[apapo::v1::WORKER_STATE_IDLE], 1);
}

// ---- restarts after faults (spec.fault_tolerance) ----

void SendOutcome(Scheduler& scheduler, const std::string& worker, const std::string& job,
                 absl::StatusCode code, const std::string& message = "") {
  WorkerMessage m;
  m.mutable_outcome()->set_job_id(job);
  m.mutable_outcome()->set_code(static_cast<int>(code));
  m.mutable_outcome()->set_message(message);
  scheduler.OnWorkerMessage(worker, m);
}

void SendMetrics(Scheduler& scheduler, const std::string& worker, const std::string& job,
                 int stage, int64_t step, int64_t resumed_step = 0) {
  WorkerMessage m;
  m.mutable_metrics()->set_job_id(job);
  m.mutable_metrics()->set_step(step);
  m.mutable_metrics()->set_resumed_step(resumed_step);
  m.mutable_metrics()->mutable_stage()->set_stage(stage);
  scheduler.OnWorkerMessage(worker, m);
}

TEST_F(SchedulerTest, JobsCheckpointByDefaultIntoAFolderOfTheirOwn) {
  std::string id = ProfiledJob();
  scheduler_.RunOnce();
  CoordinatorMessage a0 = Next("w-1");
  ASSERT_TRUE(a0.has_assign());
  EXPECT_EQ(a0.assign().spec().checkpoint().directory(),
            absl::StrCat("/var/lib/apapo/checkpoints/", id, ".",
                         jobs_.Get(id)->create_time().seconds()));
  EXPECT_EQ(a0.assign().spec().checkpoint().every_steps(),
            SchedulerOptions().checkpoint_every_steps);
  EXPECT_FALSE(a0.assign().spec().checkpoint().resume());  // a first run
}

TEST_F(SchedulerTest, LostWorkerReplansOnTheSurvivorFromItsProfileAndResumes) {
  std::string id = StartRunningJob();
  SendMetrics(scheduler_, "w-2", id, 1, 340);
  clock_.Advance(absl::Seconds(1));
  registry_.Disconnect(*sessions_["w-2"], "stream closed");
  auto job = jobs_.Get(id);
  EXPECT_EQ(job->state(), apapo::v1::JOB_STATE_RECOVERING);
  EXPECT_EQ(job->restarts(), 1);
  ASSERT_EQ(job->restart_history_size(), 1);
  EXPECT_EQ(job->restart_history(0).cause(), "worker w-2 lost: stream closed");
  EXPECT_EQ(job->restart_history(0).step_at_fault(), 340);
  EXPECT_EQ(job->restart_history(0).lost_workers(0), "w-2");
  CoordinatorMessage stop = Next("w-1");
  ASSERT_TRUE(stop.has_stop());
  EXPECT_THAT(stop.stop().reason(), HasSubstr("restarting: worker w-2 lost"));
  // Nothing is planned until the surviving stage has ended.
  scheduler_.RunOnce();
  EXPECT_FALSE(HasCommand("w-1"));
  SendMetrics(scheduler_, "w-1", id, 0, 345);  // the old stage's last report: ignored
  SendOutcome(scheduler_, "w-1", id, absl::StatusCode::kCancelled, "stage 0 stopped");
  EXPECT_EQ(jobs_.Get(id)->state(), apapo::v1::JOB_STATE_RECOVERING);
  scheduler_.RunOnce();  // plans on w-1 alone, from its profile
  EXPECT_EQ(jobs_.Get(id)->state(), apapo::v1::JOB_STATE_PLANNING);
  ASSERT_EQ(planner_.seen_cluster.workers_size(), 1);
  EXPECT_EQ(planner_.seen_cluster.workers(0).worker_id(), "w-1");
  CoordinatorMessage a0 = Next("w-1");
  ASSERT_TRUE(a0.has_assign());
  EXPECT_TRUE(a0.assign().spec().checkpoint().resume());
  EXPECT_EQ(a0.assign().rendezvous().world_size(), 1);
  EXPECT_EQ(a0.assign().rendezvous().prefix(), id + "/r1");
  Ack("w-1", a0.command_id(), 6000);
  EXPECT_TRUE(Next("w-1").has_start());
  job = jobs_.Get(id);
  EXPECT_EQ(job->state(), apapo::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job->restart_history(0).stages_before(), 2);
  EXPECT_EQ(job->restart_history(0).stages_after(), 1);
  EXPECT_EQ(job->restart_history(0).workers_after(), 1);
  EXPECT_EQ(job->restart_history(0).seconds_lost(), 0);  // not trained yet
  clock_.Advance(absl::Seconds(4));
  SendMetrics(scheduler_, "w-1", id, 0, 250, 200);
  job = jobs_.Get(id);
  EXPECT_EQ(job->restart_history(0).resumed_step(), 200);
  // Progress shows the steps since the checkpoint being trained again.
  EXPECT_EQ(job->progress().step(), 250);
  // The stage's busy seconds count the 50 steps since its restart.
  ASSERT_EQ(job->progress().stages_size(), 1);
  EXPECT_EQ(job->progress().stages(0).steps(), 50);
  EXPECT_DOUBLE_EQ(job->restart_history(0).seconds_lost(), 4);
  EXPECT_THAT(jobs_.WaitForChange(id, -1, 0, absl::InfinitePast())->events.back().message(),
              HasSubstr("training again from step 200 (the fault came at step 340), "
                        "2 -> 1 stage(s)"));
  SendOutcome(scheduler_, "w-1", id, absl::StatusCode::kOk);
  EXPECT_EQ(jobs_.Get(id)->state(), apapo::v1::JOB_STATE_SUCCEEDED);
}

TEST_F(SchedulerTest, AnIdleWorkerJoinsARestartAndIsProfiledFirst) {
  std::string id = StartRunningJob();
  AddWorker("w-3");
  registry_.Disconnect(*sessions_["w-2"], "heartbeat timeout");
  EXPECT_TRUE(Next("w-1").has_stop());
  SendOutcome(scheduler_, "w-1", id, absl::StatusCode::kUnavailable, "peer gone");
  // w-3 took w-2's place: both profile (their link is unmeasured).
  auto job = jobs_.Get(id);
  EXPECT_EQ(job->state(), apapo::v1::JOB_STATE_PROFILING);
  EXPECT_THAT(job->worker_ids(), ::testing::ElementsAre("w-1", "w-3"));
  CoordinatorMessage p0 = Next("w-1");
  ASSERT_TRUE(p0.has_profile());
  EXPECT_EQ(p0.profile().rendezvous().prefix(), id + "/r1/profile");
  Ack("w-1", p0.command_id(), 6001);
  EXPECT_TRUE(Next("w-3").has_profile());
  Profile("w-1", id, 1.0);
  Profile("w-3", id, 1.0);
  scheduler_.RunOnce();
  CoordinatorMessage a0 = Next("w-1");
  ASSERT_TRUE(a0.has_assign());
  EXPECT_TRUE(a0.assign().spec().checkpoint().resume());
  EXPECT_EQ(a0.assign().rendezvous().world_size(), 2);
}

TEST_F(SchedulerTest, APeerFaultInAStageRestartsButAJobErrorFails) {
  std::string id = StartRunningJob();
  SendOutcome(scheduler_, "w-1", id, absl::StatusCode::kDeadlineExceeded,
              "recv from rank 1 timed out after 60s");
  auto job = jobs_.Get(id);
  EXPECT_EQ(job->state(), apapo::v1::JOB_STATE_RECOVERING);
  EXPECT_EQ(job->restart_history(0).cause(),
            "stage 0 on w-1: recv from rank 1 timed out after 60s");
  EXPECT_TRUE(Next("w-2").has_stop());
  EXPECT_FALSE(HasCommand("w-1"));  // its stage has ended already: no stop
  // The peer's stream breaks too: the same fault, one restart.
  registry_.Disconnect(*sessions_["w-2"], "stream closed");
  job = jobs_.Get(id);
  EXPECT_EQ(job->restarts(), 1);
  EXPECT_THAT(job->restart_history(0).lost_workers(), ::testing::ElementsAre("w-2"));
  scheduler_.RunOnce();
  CoordinatorMessage a0 = Next("w-1");
  ASSERT_TRUE(a0.has_assign());
  Ack("w-1", a0.command_id(), 6000);
  EXPECT_TRUE(Next("w-1").has_start());
  // A deterministic error of the job is not retried.
  SendOutcome(scheduler_, "w-1", id, absl::StatusCode::kInvalidArgument,
              "node fc1: shape mismatch");
  job = jobs_.Get(id);
  EXPECT_EQ(job->state(), apapo::v1::JOB_STATE_FAILED);
  EXPECT_EQ(job->error(), "stage 0 on w-1: node fc1: shape mismatch");
}

TEST_F(SchedulerTest, RestartsEndAtMaxRestarts) {
  max_restarts_ = 1;
  std::string id = StartRunningJob();
  AddWorker("w-3");
  registry_.Disconnect(*sessions_["w-2"], "stream closed");
  EXPECT_TRUE(Next("w-1").has_stop());
  SendOutcome(scheduler_, "w-1", id, absl::StatusCode::kCancelled);
  // w-3 (idle) joins; profile and plan.
  CoordinatorMessage p0 = Next("w-1");
  Ack("w-1", p0.command_id(), 6001);
  Next("w-3");
  Profile("w-1", id, 1.0);
  Profile("w-3", id, 1.0);
  scheduler_.RunOnce();
  CoordinatorMessage a0 = Next("w-1");
  Ack("w-1", a0.command_id(), 6000);
  CoordinatorMessage a1 = Next("w-3");
  Ack("w-3", a1.command_id());
  ASSERT_EQ(jobs_.Get(id)->state(), apapo::v1::JOB_STATE_RUNNING);
  registry_.Disconnect(*sessions_["w-3"], "stream closed");
  auto job = jobs_.Get(id);
  EXPECT_EQ(job->state(), apapo::v1::JOB_STATE_FAILED);
  EXPECT_EQ(job->error(),
            "worker w-3 lost: stream closed; not restarted: "
            "spec.fault_tolerance.max_restarts (1) used up");
  EXPECT_EQ(job->restarts(), 1);
}

TEST_F(SchedulerTest, TooFewWorkersWaitsForCapacityThenFailsSayingWhy) {
  min_workers_ = 2;
  std::string id = StartRunningJob();
  registry_.Disconnect(*sessions_["w-2"], "stream closed");
  EXPECT_TRUE(Next("w-1").has_stop());
  SendOutcome(scheduler_, "w-1", id, absl::StatusCode::kCancelled);
  EXPECT_EQ(jobs_.Get(id)->state(), apapo::v1::JOB_STATE_RECOVERING);
  EXPECT_THAT(jobs_.WaitForChange(id, -1, 0, absl::InfinitePast())->events.back().message(),
              HasSubstr("waiting for capacity: 1 worker(s) left, "
                        "spec.fault_tolerance.min_workers is 2; waiting up to 5m"));
  clock_.Advance(absl::Minutes(4));
  scheduler_.RunOnce();
  EXPECT_EQ(jobs_.Get(id)->state(), apapo::v1::JOB_STATE_RECOVERING);
  clock_.Advance(absl::Minutes(2));
  scheduler_.RunOnce();
  auto job = jobs_.Get(id);
  EXPECT_EQ(job->state(), apapo::v1::JOB_STATE_FAILED);
  EXPECT_EQ(job->error(),
            "worker w-2 lost: stream closed; only 1 worker(s) left: w-1 and no idle "
            "matching worker came within spec.fault_tolerance.replacement_wait (5m); "
            "min_workers is 2");
  EXPECT_EQ(registry_.CountByState()[apapo::v1::WORKER_STATE_IDLE], 1);
}

// An idle worker that was there all through the wait, too few with it, is
// named: "no idle worker came" would send the user looking for a fault.
TEST_F(SchedulerTest, AWaitThatFailsNamesTheIdleWorkersThatWereTooFew) {
  min_workers_ = 2;
  std::string id = StartRunningJob();
  AddWorker("w-3");
  registry_.Disconnect(*sessions_["w-2"], "stream closed");
  registry_.Disconnect(*sessions_["w-1"], "stream closed");
  scheduler_.RunOnce();
  EXPECT_EQ(jobs_.Get(id)->state(), apapo::v1::JOB_STATE_RECOVERING);
  clock_.Advance(absl::Minutes(6));
  scheduler_.RunOnce();
  auto job = jobs_.Get(id);
  EXPECT_EQ(job->state(), apapo::v1::JOB_STATE_FAILED);
  EXPECT_EQ(job->error(),
            "worker w-2 lost: stream closed; only 0 worker(s) left and only 1 idle "
            "matching worker(s) (w-3) came within spec.fault_tolerance.replacement_wait "
            "(5m); min_workers is 2");
  EXPECT_EQ(registry_.CountByState()[apapo::v1::WORKER_STATE_IDLE], 1);
}

TEST_F(SchedulerTest, AWaitingJobTakesAWorkerThatRegisters) {
  min_workers_ = 2;
  std::string id = StartRunningJob();
  registry_.Disconnect(*sessions_["w-2"], "stream closed");
  Next("w-1");
  SendOutcome(scheduler_, "w-1", id, absl::StatusCode::kCancelled);
  scheduler_.RunOnce();
  EXPECT_EQ(jobs_.Get(id)->state(), apapo::v1::JOB_STATE_RECOVERING);
  AddWorker("w-4");
  scheduler_.RunOnce();
  auto job = jobs_.Get(id);
  EXPECT_EQ(job->state(), apapo::v1::JOB_STATE_PROFILING);
  EXPECT_THAT(job->worker_ids(), ::testing::ElementsAre("w-1", "w-4"));
}

TEST_F(SchedulerTest, AStageThatDoesNotStopIsLeftOut) {
  std::string id = StartRunningJob();
  AddWorker("w-3");
  SendOutcome(scheduler_, "w-1", id, absl::StatusCode::kUnavailable, "peer reset");
  EXPECT_TRUE(Next("w-2").has_stop());
  // w-2 never reports its stage's end.
  clock_.Advance(SchedulerOptions().stop_timeout + absl::Seconds(1));
  scheduler_.RunOnce();
  auto job = jobs_.Get(id);
  EXPECT_THAT(job->worker_ids(), ::testing::ElementsAre("w-1", "w-3"));
  EXPECT_EQ(job->state(), apapo::v1::JOB_STATE_PROFILING);
  bool said = false;
  const auto change = jobs_.WaitForChange(id, -1, 0, absl::InfinitePast());
  ASSERT_TRUE(change.ok());
  for (const auto& e : change->events) {
    said |= absl::StrContains(e.message(), "left out w-2: its stage did not end within 30s");
  }
  EXPECT_TRUE(said);
}

// ---- a restarted coordinator adopts the stages that trained on ----

class AdoptionTest : public SchedulerTest {
 protected:
  // The coordinator restarts on the same store: new manager, registry and
  // scheduler, which adopts the running jobs.
  void Restart() {
    jobs2_ = std::make_unique<JobManager>(&store_, &clock_);
    ASSERT_TRUE(jobs2_->Recover().ok());
    registry2_ = std::make_unique<WorkerRegistry>(&clock_, absl::Seconds(1));
    scheduler2_ = std::make_unique<Scheduler>(jobs2_.get(), registry2_.get(), &planner_,
                                              &clock_, Options());
    scheduler2_->AdoptRunningJobs();
  }
  // `worker` registers again, still training `stage` of `job` as `rank`.
  std::shared_ptr<WorkerSession> Reconnect(const std::string& worker, const std::string& job,
                                           int stage, int rank, const std::string& prefix) {
    apapo::v1::WorkerInfo info;
    info.set_worker_id(worker);
    if (!job.empty()) {
      auto* r = info.add_running();
      r->set_job_id(job);
      r->set_stage(stage);
      r->set_rank(rank);
      r->set_rendezvous_prefix(prefix);
      r->set_step(77);
    }
    auto session = registry2_->Register(info);
    EXPECT_TRUE(session.ok());
    scheduler2_->OnWorkerRegistered(info);
    return *session;
  }
  std::unique_ptr<JobManager> jobs2_;
  std::unique_ptr<WorkerRegistry> registry2_;
  std::unique_ptr<Scheduler> scheduler2_;
};

TEST_F(AdoptionTest, StagesThatReportBackRunOnAndFinishTheJob) {
  std::string id = StartRunningJob();
  Restart();
  EXPECT_EQ(jobs2_->Get(id)->state(), apapo::v1::JOB_STATE_RUNNING);
  auto s1 = Reconnect("w-1", id, 0, 0, id);
  // Busy with its job, not offered to another.
  EXPECT_EQ(registry2_->CountByState()[apapo::v1::WORKER_STATE_BUSY], 1);
  auto s2 = Reconnect("w-2", id, 1, 1, id);
  EXPECT_FALSE(s1->TakeCommand().has_value());  // no stop, no re-assignment
  EXPECT_FALSE(s2->TakeCommand().has_value());
  EXPECT_THAT(jobs2_->WaitForChange(id, -1, 0, absl::InfinitePast())->events.back().message(),
              HasSubstr("adopted: all 2 stage(s) trained on"));
  SendMetrics(*scheduler2_, "w-2", id, 1, 500);
  EXPECT_EQ(jobs2_->Get(id)->progress().step(), 500);
  SendOutcome(*scheduler2_, "w-1", id, absl::StatusCode::kOk);
  SendOutcome(*scheduler2_, "w-2", id, absl::StatusCode::kOk);
  auto job = jobs2_->Get(id);
  EXPECT_EQ(job->state(), apapo::v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(job->restarts(), 0);
}

TEST_F(AdoptionTest, AStageOfAnotherAttemptIsStoppedAndAMissingOneRestartsTheJob) {
  std::string id = StartRunningJob();
  Restart();
  auto s1 = Reconnect("w-1", id, 0, 0, id);
  // w-3 says it trains a stage of an attempt this coordinator knows nothing of.
  auto s3 = Reconnect("w-3", id, 1, 1, id + "/r7");
  auto stop = s3->TakeCommand();
  ASSERT_TRUE(stop.has_value() && stop->has_stop());
  EXPECT_THAT(stop->stop().reason(), HasSubstr("is not part of a running job here"));
  EXPECT_EQ(registry2_->List().size(), 2u);
  // w-2 never comes back.
  clock_.Advance(SchedulerOptions().adopt_timeout + absl::Seconds(1));
  scheduler2_->RunOnce();
  auto job = jobs2_->Get(id);
  EXPECT_EQ(job->state(), apapo::v1::JOB_STATE_RECOVERING);
  EXPECT_EQ(job->restart_history(0).cause(),
            "coordinator restarted and w-2 did not report back within 1m");
  auto stop1 = s1->TakeCommand();
  ASSERT_TRUE(stop1.has_value() && stop1->has_stop());
}

TEST_F(SchedulerTest, AJobGrowsIntoAnIdleWorkerAtItsNextCheckpoint) {
  max_workers_ = 2;
  AddWorker("w-1");
  std::string id = Submit(1);
  scheduler_.RunOnce();
  ASSERT_TRUE(Next("w-1").has_profile());
  Profile("w-1", id, 1.0);
  scheduler_.RunOnce();
  CoordinatorMessage a0 = Next("w-1");
  ASSERT_TRUE(a0.has_assign());
  Ack("w-1", a0.command_id(), 6000);
  ASSERT_TRUE(Next("w-1").has_start());
  ASSERT_EQ(jobs_.Get(id)->state(), apapo::v1::JOB_STATE_RUNNING);
  // 1,000 of 10,000 steps done at 10 steps/s: 15 minutes left.
  WorkerMessage m;
  m.mutable_metrics()->set_job_id(id);
  m.mutable_metrics()->set_step(1000);
  m.mutable_metrics()->set_total_steps(10000);
  m.mutable_metrics()->set_samples_per_second(1000);
  m.mutable_metrics()->mutable_stage()->set_stage(0);
  scheduler_.OnWorkerMessage("w-1", m);
  scheduler_.RunOnce();  // no idle worker: nothing to do
  AddWorker("w-2");
  clock_.Advance(SchedulerOptions().growth_check_every);
  scheduler_.RunOnce();  // plans with w-2: 2 stages, 200 vs 100 samples/s
  ASSERT_EQ(planner_.seen_cluster.workers_size(), 2);
  EXPECT_EQ(planner_.seen_cluster.workers(1).worker_id(), "w-2");
  EXPECT_EQ(registry_.CountByState()[apapo::v1::WORKER_STATE_BUSY], 2);  // reserved
  EXPECT_THAT(jobs_.WaitForChange(id, -1, 0, absl::InfinitePast())->events.back().message(),
              HasSubstr("w-2 idle: the planner predicts 2.00x the samples/s with it "
                        "(1.20x needed); taking it in after the checkpoint of step 1100"));
  EXPECT_EQ(jobs_.Get(id)->state(), apapo::v1::JOB_STATE_RUNNING);
  m.mutable_metrics()->set_step(1099);
  scheduler_.OnWorkerMessage("w-1", m);
  EXPECT_EQ(jobs_.Get(id)->state(), apapo::v1::JOB_STATE_RUNNING);
  // Step 1100 trained, its checkpoint still being written: a stop now would
  // kill the write, so the job waits for the stage to report it written.
  m.mutable_metrics()->set_step(1105);
  m.mutable_metrics()->set_checkpoint_step(1000);
  scheduler_.OnWorkerMessage("w-1", m);
  EXPECT_EQ(jobs_.Get(id)->state(), apapo::v1::JOB_STATE_RUNNING);
  m.mutable_metrics()->set_step(1107);
  m.mutable_metrics()->set_checkpoint_step(1100);
  scheduler_.OnWorkerMessage("w-1", m);
  auto job = jobs_.Get(id);
  EXPECT_EQ(job->state(), apapo::v1::JOB_STATE_RECOVERING);
  EXPECT_EQ(job->restart_history(0).cause(), "w-2 joined: predicted 2.00x the samples/s");
  EXPECT_TRUE(Next("w-1").has_stop());
  SendOutcome(scheduler_, "w-1", id, absl::StatusCode::kCancelled);
  // w-2 has not profiled the model: both profile, then the job resumes on 2.
  job = jobs_.Get(id);
  EXPECT_EQ(job->state(), apapo::v1::JOB_STATE_PROFILING);
  EXPECT_THAT(job->worker_ids(), ::testing::ElementsAre("w-1", "w-2"));
}

TEST_F(SchedulerTest, AnIdleWorkerIsNotTakenForASmallGainOrWithLittleTimeLeft) {
  max_workers_ = 3;
  std::string id = StartRunningJob();  // 2 stages: the fake's most
  WorkerMessage m;
  m.mutable_metrics()->set_job_id(id);
  m.mutable_metrics()->set_step(100);
  m.mutable_metrics()->set_total_steps(10000);
  m.mutable_metrics()->set_samples_per_second(1000);
  m.mutable_metrics()->mutable_stage()->set_stage(1);
  scheduler_.OnWorkerMessage("w-2", m);
  AddWorker("w-3");
  scheduler_.RunOnce();
  EXPECT_EQ(registry_.CountByState()[apapo::v1::WORKER_STATE_IDLE], 1);
  EXPECT_THAT(jobs_.WaitForChange(id, -1, 0, absl::InfinitePast())->events.back().message(),
              HasSubstr("w-3 idle: the planner predicts 1.00x the samples/s with it, "
                        "below the 1.20x a restart needs; not taken"));
  // 30 s left: not worth a restart, not even planned.
  m.mutable_metrics()->set_step(9700);
  scheduler_.OnWorkerMessage("w-2", m);
  planner_.seen_cluster.Clear();
  clock_.Advance(SchedulerOptions().growth_check_every);
  scheduler_.RunOnce();
  EXPECT_EQ(planner_.seen_cluster.workers_size(), 0);
  EXPECT_EQ(jobs_.Get(id)->state(), apapo::v1::JOB_STATE_RUNNING);
}

// A stage's counters as a worker reports them.
WorkerMessage Counters(const std::string& job, int stage, int64_t step, double busy,
                       double idle, int64_t checkpoint_step = 0) {
  WorkerMessage m;
  m.mutable_metrics()->set_job_id(job);
  m.mutable_metrics()->set_step(step);
  m.mutable_metrics()->set_total_steps(10000);
  m.mutable_metrics()->set_checkpoint_step(checkpoint_step);
  m.mutable_metrics()->mutable_stage()->set_stage(stage);
  m.mutable_metrics()->mutable_stage()->set_busy_seconds(busy);
  m.mutable_metrics()->mutable_stage()->set_idle_seconds(idle);
  return m;
}

// The tests' planner for checks, on the profiles of StartRunningJob with
// two_nodes_ (fc1 and fc2 of 1 s a mini-batch of 100 on w-1, 2 s on w-2):
// fc1 on the first worker and fc2 on the second (1 + 2 s: 50 samples/s)
// while the second runs at 0.3 of the first's speed or more; else both on
// the first alone (2 s: 50 samples/s), as it must when the first is all
// there is.
apapo::v1::Plan PipelineOrAlone(const apapo::v1::ModelProfile& profile,
                                const apapo::v1::ClusterSpec& cluster) {
  apapo::v1::Plan plan;
  plan.set_model(profile.model());
  plan.set_schedule(apapo::v1::SCHEDULE_KIND_ASYNC);
  plan.mutable_prediction()->set_samples_per_second(50);
  const double speed = cluster.workers_size() > 1 ? cluster.workers(1).relative_speed() : 0;
  if (speed >= 0.3) {
    for (int s = 0; s < 2; ++s) {
      auto* st = plan.add_stages();
      st->set_index(s);
      st->set_replicas(1);
      st->add_node_ids(s == 0 ? "fc1" : "fc2");
      st->add_placement()->set_worker_id(cluster.workers(s).worker_id());
      st->set_compute_seconds(s == 0 ? 1.0 : 1.0 / speed);
    }
    return plan;
  }
  auto* st = plan.add_stages();
  st->set_replicas(1);
  st->add_node_ids("fc1");
  st->add_node_ids("fc2");
  st->add_placement()->set_worker_id(cluster.workers(0).worker_id());
  st->set_compute_seconds(2.0);
  return plan;
}

// Busy and idle seconds of w-1 (stage 0) and of w-2 (stage 1).
using StageSeconds = std::array<std::pair<double, double>, 2>;

// The check's window of a job on w-1, w-2: both stages' counters at steps
// 10 and 30.
void SendWindow(Scheduler& scheduler, const std::string& id, const StageSeconds& first,
                const StageSeconds& last) {
  for (const auto& [step, at] : {std::pair{10, first}, std::pair{30, last}}) {
    for (int s = 0; s < 2; ++s) {
      scheduler.OnWorkerMessage(s == 0 ? "w-1" : "w-2",
                                Counters(id, s, step, at[s].first, at[s].second));
    }
  }
}

std::string LastEvent(JobManager& jobs, const std::string& id) {
  return jobs.WaitForChange(id, -1, 0, absl::InfinitePast())->events.back().message();
}

// w-2 computes 4x as long as the plan said: the window of steps 10-30
// measures 12.5 samples/s against 50. On the profiles calibrated by it
// (w-2 x4) the running pipeline simulates at 12.5 and the planner's
// choice, both nodes on w-1, at 50: the job restarts on it once every
// stage has written the checkpoint of step 100, planned from the
// calibrated profiles without profiling again.
TEST_F(SchedulerTest, ARunFarBelowItsPredictionRestartsOnThePlanItsMeasurementChooses) {
  two_nodes_ = true;
  replan_on_measurement_ = true;
  planner_.custom = PipelineOrAlone;
  std::string id = StartRunningJob();
  ASSERT_EQ(jobs_.GetPlan(id)->plan().stages_size(), 2);
  // Warm-up: the window opens at step 10 of each stage.
  scheduler_.OnWorkerMessage("w-1", Counters(id, 0, 5, 5.0, 5.0));
  scheduler_.OnWorkerMessage("w-1", Counters(id, 0, 10, 10.0, 10.0));
  scheduler_.OnWorkerMessage("w-2", Counters(id, 1, 10, 40.0, 1.0));
  scheduler_.OnWorkerMessage("w-1", Counters(id, 0, 29, 29.0, 143.0));
  planner_.seen_cluster.Clear();
  scheduler_.RunOnce();
  EXPECT_EQ(planner_.seen_cluster.workers_size(), 0);  // not re-planned yet
  // w-1: 1 s busy a step as planned, 7 waiting; w-2: 8 s busy (2 planned).
  scheduler_.OnWorkerMessage("w-1", Counters(id, 0, 30, 30.0, 150.0));
  scheduler_.OnWorkerMessage("w-2", Counters(id, 1, 30, 200.0, 1.0));
  scheduler_.RunOnce();
  ASSERT_EQ(planner_.seen_cluster.workers_size(), 2);
  EXPECT_DOUBLE_EQ(planner_.seen_cluster.workers(1).relative_speed(), 0.125);
  EXPECT_EQ(LastEvent(jobs_, id),
            "plan checked against the run: measured 12.5 samples/s over 20 steps, "
            "predicted 50.0 (+300%); compute x1.00 on w-1, x4.00 on w-2; on these "
            "figures the running plan simulates at 12.5 samples/s, the planner's "
            "choice, 1 stage(s) of 1 replica(s), async, at 50.0: 4.00x; restarting on "
            "it after the checkpoint of step 100");
  // Step 100 trained but its checkpoint not written everywhere: running on.
  scheduler_.OnWorkerMessage("w-1", Counters(id, 0, 101, 101.0, 700.0, 100));
  scheduler_.OnWorkerMessage("w-2", Counters(id, 1, 100, 600.0, 4.0, 0));
  EXPECT_EQ(jobs_.Get(id)->state(), apapo::v1::JOB_STATE_RUNNING);
  scheduler_.OnWorkerMessage("w-2", Counters(id, 1, 101, 608.0, 4.0, 100));
  auto job = jobs_.Get(id);
  ASSERT_EQ(job->state(), apapo::v1::JOB_STATE_RECOVERING);
  EXPECT_EQ(job->restart_history(0).cause(),
            "re-planned on the run's measurement: predicted 4.00x the samples/s measured");
  EXPECT_TRUE(Next("w-1").has_stop());
  EXPECT_TRUE(Next("w-2").has_stop());
  SendOutcome(scheduler_, "w-1", id, absl::StatusCode::kCancelled);
  SendOutcome(scheduler_, "w-2", id, absl::StatusCode::kCancelled);
  planner_.seen_cluster.Clear();
  scheduler_.RunOnce();
  ASSERT_EQ(planner_.seen_cluster.workers_size(), 2);
  EXPECT_DOUBLE_EQ(planner_.seen_cluster.workers(1).relative_speed(), 0.125);
  auto plan = jobs_.GetPlan(id);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->plan().stages_size(), 1);
  EXPECT_THAT(plan->plan().notes(),
              ::testing::Contains(HasSubstr(
                  "planned on what the run measured: measured 12.5 samples/s")));
  CoordinatorMessage a0 = Next("w-1");
  ASSERT_TRUE(a0.has_assign());
  EXPECT_TRUE(a0.assign().spec().checkpoint().resume());
  Ack("w-1", a0.command_id(), 6001);
  EXPECT_TRUE(Next("w-1").has_start());
  EXPECT_EQ(jobs_.Get(id)->worker_ids_size(), 1);  // w-2 released
  // The new attempt is checked too. Far off again, with a plan of another
  // shape predicted far above, the job is not restarted again: once per job.
  planner_.custom = [](const apapo::v1::ModelProfile& p, const apapo::v1::ClusterSpec& c) {
    apapo::v1::Plan plan = PipelineOrAlone(p, c);
    plan.set_micro_batches(4);
    plan.mutable_prediction()->set_samples_per_second(500);
    plan.mutable_stages(0)->clear_node_ids();
    plan.mutable_stages(0)->add_node_ids("fc1,fc2");  // not simulated
    return plan;
  };
  scheduler_.OnWorkerMessage("w-1", Counters(id, 0, 110, 10.0, 0));
  scheduler_.OnWorkerMessage("w-1", Counters(id, 0, 130, 90.0, 0));
  scheduler_.RunOnce();
  EXPECT_THAT(LastEvent(jobs_, id),
              HasSubstr("measured 25.0 samples/s over 20 steps, predicted 50.0 (+100%); "
                        "compute x2.00 on w-1; on these figures the planner chooses 1 "
                        "stage(s) of 1 replica(s), async, predicted 500.0 samples/s: 20.00x "
                        "the measured; kept: the job restarted on a check before"));
  EXPECT_EQ(jobs_.Get(id)->state(), apapo::v1::JOB_STATE_RUNNING);
  // w-2, left out on the measurement, is not grown back into (a growth
  // would take it as a fresh worker like w-1).
  const auto events = jobs_.WaitForChange(id, -1, 0, absl::InfinitePast())->events;
  EXPECT_TRUE(std::any_of(events.begin(), events.end(), [](const auto& e) {
    return e.message() ==
           "plan leaves w-2 unused; released (measured too slow for it: not grown into "
           "again by this job)";
  }));
  WorkerMessage m = Counters(id, 0, 1000, 700.0, 0);
  m.mutable_metrics()->set_total_steps(100000);
  m.mutable_metrics()->set_samples_per_second(100);
  scheduler_.OnWorkerMessage("w-1", m);
  planner_.seen_cluster.Clear();
  clock_.Advance(SchedulerOptions().growth_check_every);
  scheduler_.RunOnce();
  EXPECT_EQ(planner_.seen_cluster.workers_size(), 0);
  EXPECT_EQ(registry_.CountByState()[apapo::v1::WORKER_STATE_IDLE], 1);
  EXPECT_EQ(jobs_.Get(id)->state(), apapo::v1::JOB_STATE_RUNNING);
}

// Within the tolerance the planner searches nothing; the running plan is
// simulated on the run's compute (w-2, the slower, unchanged: 50.0), so the
// event separates the cost model's +5% (the waits) from the machine's.
TEST_F(SchedulerTest, ARunAsPredictedIsCheckedAndNotReplanned) {
  two_nodes_ = true;
  planner_.custom = PipelineOrAlone;
  std::string id = StartRunningJob();
  // 1.05 and 2.0 s busy a step, 2.1 with waits: 47.6 samples/s.
  SendWindow(scheduler_, id, {{{10, 10}, {20, 1}}}, {{{31, 31}, {60, 3}}});
  planner_.seen_cluster.Clear();
  scheduler_.RunOnce();
  EXPECT_EQ(planner_.seen_cluster.workers_size(), 0);
  EXPECT_EQ(LastEvent(jobs_, id),
            "plan checked against the run: measured 47.6 samples/s over 20 steps, "
            "predicted 50.0 (+5%); compute x1.05 on w-1, x1.00 on w-2; within 10%; "
            "on these figures the running plan simulates at 50.0 samples/s");
}

// Both workers report their stage done right after the check's window,
// before the planning thread runs: the job's "plan checked" events.
std::vector<std::string> ChecksOfAJobThatEndsFirst(Scheduler& scheduler, JobManager& jobs,
                                                   const std::string& id,
                                                   const StageSeconds& last) {
  SendWindow(scheduler, id, {{{10, 10}, {20, 1}}}, last);
  for (const char* w : {"w-1", "w-2"}) {
    WorkerMessage done;
    done.mutable_outcome()->set_job_id(id);
    scheduler.OnWorkerMessage(w, done);
  }
  scheduler.RunOnce();
  EXPECT_EQ(jobs.Get(id)->state(), apapo::v1::JOB_STATE_SUCCEEDED);
  std::vector<std::string> checks;
  auto change = jobs.WaitForChange(id, -1, 0, absl::InfinitePast());
  if (!change.ok()) return {change.status().ToString()};
  for (const auto& e : change->events) {
    if (absl::StartsWith(e.message(), "plan checked")) checks.push_back(e.message());
  }
  return checks;
}

// A job that ends before the planning thread simulates its check still
// reports the check, once, without the simulation.
TEST_F(SchedulerTest, ACheckWithinTheToleranceIsReportedWhenTheJobEndsFirst) {
  two_nodes_ = true;
  planner_.custom = PipelineOrAlone;
  std::string id = StartRunningJob();
  EXPECT_THAT(ChecksOfAJobThatEndsFirst(scheduler_, jobs_, id, {{{31, 31}, {60, 3}}}),
              ::testing::ElementsAre(
                          "plan checked against the run: measured 47.6 samples/s over 20 "
                          "steps, predicted 50.0 (+5%); compute x1.05 on w-1, x1.00 on w-2; "
                          "within 10%"));
}

// Past the tolerance the same: the check is reported, saying why it has no
// re-plan's answer.
TEST_F(SchedulerTest, ACheckPastTheToleranceIsReportedWhenTheJobEndsFirst) {
  two_nodes_ = true;
  planner_.custom = PipelineOrAlone;
  std::string id = StartRunningJob();
  EXPECT_THAT(ChecksOfAJobThatEndsFirst(scheduler_, jobs_, id, {{{36, 36}, {72, 1}}}),
              ::testing::ElementsAre(
                          "plan checked against the run: measured 38.5 samples/s over 20 "
                          "steps, predicted 50.0 (+30%); compute x1.30 on w-1, x1.30 on w-2; "
                          "the job ended before it was planned again on these figures"));
}

TEST_F(SchedulerTest, ACheckWhosePlanIsTheSameKeepsTheRun) {
  two_nodes_ = true;
  replan_on_measurement_ = true;
  planner_.custom = PipelineOrAlone;
  std::string id = StartRunningJob();
  // Both stages 1.3x slower: 38.5 samples/s; w-2 still at half w-1's speed.
  SendWindow(scheduler_, id, {{{10, 10}, {20, 1}}}, {{{36, 36}, {72, 1}}});
  scheduler_.RunOnce();
  EXPECT_NEAR(planner_.seen_cluster.workers(1).relative_speed(), 0.5, 1e-9);
  EXPECT_EQ(LastEvent(jobs_, id),
            "plan checked against the run: measured 38.5 samples/s over 20 steps, "
            "predicted 50.0 (+30%); compute x1.30 on w-1, x1.30 on w-2; on these "
            "figures the running plan simulates at 38.5 samples/s; the planner chooses "
            "it again; kept");
  EXPECT_EQ(jobs_.Get(id)->state(), apapo::v1::JOB_STATE_RUNNING);
}

// Without spec.schedule.replan_on_measurement the better plan is only
// reported.
TEST_F(SchedulerTest, ABetterPlanOnTheMeasurementIsOnlyReportedUnlessTheSpecAsks) {
  two_nodes_ = true;
  planner_.custom = PipelineOrAlone;
  std::string id = StartRunningJob();
  SendWindow(scheduler_, id, {{{10, 10}, {40, 1}}}, {{{30, 150}, {200, 1}}});
  scheduler_.RunOnce();
  EXPECT_THAT(LastEvent(jobs_, id),
              HasSubstr("the planner's choice, 1 stage(s) of 1 replica(s), async, at "
                        "50.0: 4.00x; kept: spec.schedule.replan_on_measurement is off"));
  scheduler_.OnWorkerMessage("w-1", Counters(id, 0, 201, 201.0, 1400.0, 200));
  scheduler_.OnWorkerMessage("w-2", Counters(id, 1, 201, 1400.0, 4.0, 200));
  EXPECT_EQ(jobs_.Get(id)->state(), apapo::v1::JOB_STATE_RUNNING);
  EXPECT_FALSE(HasCommand("w-1"));
}

}  // namespace
}  // namespace apapo::coordinator

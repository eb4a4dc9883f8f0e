#include "coordinator/metrics.h"

#include <memory>
#include <string>

#include "coordinator/fake_clock.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"

namespace apapo::coordinator {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class MetricsTest : public ::testing::Test {
 protected:
  std::string Scrape() {
    auto families = registry_.Collect();
    auto state = metrics_.state_collectable()->Collect();
    families.insert(families.end(), state.begin(), state.end());
    return prometheus::TextSerializer().Serialize(families);
  }

  MemoryJobStore store_;
  FakeClock clock_;
  JobManager jobs_{&store_, &clock_};
  WorkerRegistry workers_{&clock_, absl::Seconds(1)};
  prometheus::Registry registry_;
  CoordinatorMetrics metrics_{&registry_, &jobs_, &workers_, &clock_};
};

TEST_F(MetricsTest, StateGaugesAtScrapeTime) {
  apapo::v1::JobSpec spec;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(
      R"pb(name: "m" model { builtin { name: "mlp" } }
           data { fashion_mnist {} batch_size: 8 }
           optimizer { sgd {} learning_rate: 0.1 }
           resources { workers: 1 } limits { epochs: 1 })pb",
      &spec));
  ASSERT_TRUE(jobs_.Submit(spec).ok());
  apapo::v1::WorkerInfo info;
  info.set_worker_id("w-1");
  ASSERT_TRUE(workers_.Register(info).ok());
  clock_.Advance(absl::Milliseconds(1500));
  std::string text = Scrape();
  EXPECT_THAT(text, HasSubstr("apapo_jobs{state=\"queued\"} 1"));
  EXPECT_THAT(text, HasSubstr("apapo_jobs{state=\"running\"} 0"));
  EXPECT_THAT(text, HasSubstr("apapo_workers{state=\"idle\"} 1"));
  EXPECT_THAT(text, HasSubstr("apapo_worker_heartbeat_age_seconds{worker=\"w-1\"} 1.5"));
}

TEST_F(MetricsTest, ReportsBecomeCountersByIncreaseGaugesAndHistograms) {
  apapo::v1::MetricsReport r;
  r.set_worker_id("w-2");
  r.set_samples(1000);
  r.set_samples_per_second(250);
  r.set_has_loss(true);
  r.set_loss(0.5);
  r.mutable_stage()->set_stage(1);
  r.mutable_stage()->set_bytes_sent(4096);
  r.mutable_stage()->set_busy_seconds(3);
  r.mutable_stage()->add_step_seconds(0.02);
  r.mutable_stage()->add_step_seconds(0.2);
  metrics_.OnMetrics("job-000001", r);
  r.set_samples(1500);
  r.mutable_stage()->set_bytes_sent(8192);
  r.mutable_stage()->set_busy_seconds(4);
  r.mutable_stage()->set_checkpoint_seconds(0.25);
  r.mutable_stage()->set_checkpoint_write_cpu_seconds(1.5);
  r.mutable_stage()->clear_step_seconds();
  metrics_.OnMetrics("job-000001", r);
  std::string text = Scrape();
  const std::string l = "job_id=\"job-000001\",stage=\"1\",worker=\"w-2\"";
  EXPECT_THAT(text, HasSubstr("apapo_stage_samples_total{" + l + "} 1500"));
  EXPECT_THAT(text, HasSubstr("apapo_stage_sent_bytes_total{" + l + "} 8192"));
  EXPECT_THAT(text, HasSubstr("apapo_stage_time_seconds_total{activity=\"busy\"," + l + "} 4"));
  EXPECT_THAT(text,
              HasSubstr("apapo_stage_time_seconds_total{activity=\"checkpoint\"," + l + "} 0.25"));
  EXPECT_THAT(text, HasSubstr("apapo_stage_checkpoint_write_cpu_seconds_total{" + l + "} 1.5"));
  EXPECT_THAT(text, HasSubstr("apapo_stage_samples_per_second{" + l + "} 250"));
  EXPECT_THAT(text, HasSubstr("apapo_stage_step_seconds_count{" + l + "} 2"));
  EXPECT_THAT(text, HasSubstr("apapo_stage_step_seconds_bucket{" + l + ",le=\"0.025\"} 1"));
  EXPECT_THAT(text, HasSubstr("apapo_job_loss{job_id=\"job-000001\"} 0.5"));
  EXPECT_THAT(text, Not(HasSubstr("apapo_job_test_accuracy_ratio{")));
}

TEST_F(MetricsTest, EventCounters) {
  std::string before = Scrape();
  EXPECT_THAT(before, HasSubstr("apapo_jobs_submitted_total 0"));
  EXPECT_THAT(before, HasSubstr("apapo_worker_registrations_total 0"));
  EXPECT_THAT(before, HasSubstr("apapo_workers_lost_total 0"));
  for (const char* state : {"succeeded", "failed", "cancelled"}) {
    EXPECT_THAT(before, HasSubstr(absl::StrCat("apapo_jobs_finished_total{state=\"", state,
                                               "\"} 0")));
  }
  metrics_.OnJobSubmitted();
  metrics_.OnJobFinished(apapo::v1::JOB_STATE_FAILED);
  metrics_.OnJobFinished(apapo::v1::JOB_STATE_FAILED);
  metrics_.OnJobFinished(apapo::v1::JOB_STATE_CANCELLED);
  metrics_.OnWorkerRegistered("a");
  metrics_.OnWorkerRegistered("a");
  metrics_.OnWorkerLost("a");
  std::string text = Scrape();
  EXPECT_THAT(text, HasSubstr("apapo_jobs_submitted_total 1"));
  EXPECT_THAT(text, HasSubstr("apapo_worker_registrations_total 2"));
  EXPECT_THAT(text, HasSubstr("apapo_workers_lost_total 1"));
  EXPECT_THAT(text, HasSubstr("apapo_jobs_finished_total{state=\"failed\"} 2"));
  EXPECT_THAT(text, HasSubstr("apapo_jobs_finished_total{state=\"cancelled\"} 1"));
  EXPECT_THAT(text, HasSubstr("apapo_jobs_finished_total{state=\"succeeded\"} 0"));
}

TEST_F(MetricsTest, AJobsSeriesGoAwayRetentionAfterItEnds) {
  apapo::v1::MetricsReport r;
  r.set_worker_id("w-1");
  r.set_samples(10);
  r.set_has_loss(true);
  r.set_loss(1.5);
  r.mutable_stage()->set_stage(0);
  metrics_.OnMetrics("job-000001", r);
  metrics_.OnMetrics("job-000002", r);
  metrics_.OnJobEnded("job-000001");
  clock_.Advance(absl::Minutes(4));
  metrics_.OnJobEnded("job-000002");
  EXPECT_THAT(Scrape(), HasSubstr("apapo_job_loss{job_id=\"job-000001\"}"));
  clock_.Advance(absl::Minutes(2));  // job 1 ended 6 min ago, job 2 2 min ago
  metrics_.OnMetrics("job-000003", r);  // any event expires what is due
  std::string text = Scrape();
  EXPECT_THAT(text, Not(HasSubstr("job_id=\"job-000001\"")));
  EXPECT_THAT(text, HasSubstr("apapo_stage_samples_total{job_id=\"job-000002\""));
  EXPECT_THAT(text, HasSubstr("apapo_job_loss{job_id=\"job-000003\"} 1.5"));
}

}  // namespace
}  // namespace apapo::coordinator

#include "worker/daemon/stage_channel.h"

#include <unistd.h>

#include <string>

#include "gtest/gtest.h"

namespace apapo::worker {
namespace {

TEST(StageChannelTest, FramesSurviveAPipeInPieces) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  FrameWriter writer(fds[1]);
  ASSERT_TRUE(writer.Write(FrameType::kMetrics, "abc").ok());
  ASSERT_TRUE(writer.Write(FrameType::kFinal, std::string(1000, 'x')).ok());
  ASSERT_TRUE(writer
                  .Write(FrameType::kStatus,
                         EncodeStatus(absl::InvalidArgumentError("stage 1: bad")))
                  .ok());
  close(fds[1]);
  std::string bytes;
  char buf[7];  // odd-sized reads split headers and payloads
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof(buf))) > 0) bytes.append(buf, n);
  close(fds[0]);

  FrameReader reader;
  std::vector<std::pair<FrameType, std::string>> frames;
  absl::Status error;
  for (size_t i = 0; i < bytes.size(); i += 3) {
    reader.Append(bytes.data() + i, std::min<size_t>(3, bytes.size() - i));
    FrameType type;
    std::string payload;
    while (reader.Next(&type, &payload, &error)) frames.push_back({type, payload});
  }
  ASSERT_TRUE(error.ok()) << error;
  ASSERT_EQ(frames.size(), 3u);
  EXPECT_EQ(frames[0].first, FrameType::kMetrics);
  EXPECT_EQ(frames[0].second, "abc");
  EXPECT_EQ(frames[1].second.size(), 1000u);
  absl::Status s = DecodeStatus(frames[2].second);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "stage 1: bad");
  EXPECT_EQ(reader.pending(), 0u);
  EXPECT_TRUE(DecodeStatus(EncodeStatus(absl::OkStatus())).ok());
}

TEST(StageChannelTest, CorruptHeaderIsAnError) {
  FrameReader reader;
  const char junk[] = {9, 0, 0, 0, 0};
  reader.Append(junk, sizeof(junk));
  FrameType type;
  std::string payload;
  absl::Status error;
  EXPECT_FALSE(reader.Next(&type, &payload, &error));
  EXPECT_EQ(error.code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace apapo::worker

#include "cli/spec_file.h"

#include <string>

#include "coordinator/spec_validator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace apapo::cli {
namespace {

using ::testing::HasSubstr;

TEST(SpecFileTest, ShippedExamplesParseAndValidate) {
  for (const char* name :
       {"examples/mlp_fashion_mnist.textproto",
        "examples/mlp_fashion_mnist_elastic.textproto",
        "examples/cnn_fashion_mnist.textproto",
        "examples/transformer_lm_text.json"}) {
    auto spec = LoadJobSpec(name);
    ASSERT_TRUE(spec.ok()) << name << ": " << spec.status();
    EXPECT_TRUE(apapo::coordinator::ValidateJobSpec(*spec).ok())
        << name << ": " << apapo::coordinator::ValidateJobSpec(*spec);
  }
  auto elastic = LoadJobSpec("examples/mlp_fashion_mnist_elastic.textproto");
  EXPECT_EQ(elastic->fault_tolerance().min_workers(), 1);
  EXPECT_EQ(elastic->fault_tolerance().max_workers(), 3);
  auto json = LoadJobSpec("examples/transformer_lm_text.json");
  EXPECT_EQ(json->model().builtin().hyper_parameters().at("d_model").i(), 128);
}

TEST(SpecFileTest, TextSyntaxErrorNamesFileLineAndColumn) {
  auto spec = ParseJobSpec("job.textproto", "name: \"x\"\ndata { batch_size: }\n");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("job.textproto:2:"));
}

TEST(SpecFileTest, UnknownFieldIsAnError) {
  auto spec = ParseJobSpec("j.textproto", "nmae: \"x\"\n");
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("nmae"));
}

TEST(SpecFileTest, BadJsonIsInvalidArgument) {
  auto spec = ParseJobSpec("j.json", "{\"name\": 3, \"bogus\": {}}");
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()),
              HasSubstr("j.json: not a valid JobSpec in JSON"));
}

TEST(SpecFileTest, MissingFileIsNotFound) {
  auto spec = LoadJobSpec("/nonexistent/job.textproto");
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(spec.status().message()),
              HasSubstr("/nonexistent/job.textproto"));
}

}  // namespace
}  // namespace apapo::cli

// The builder's kernel table against the graph library's layer-kind table:
// a kind that AnalyzedGraph accepts but StageModel cannot run would only
// fail at a stage's first forward pass, so the two are compared here.

#include "worker/model_builder.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/layer_kinds.h"

namespace apapo {
namespace worker {
namespace {

TEST(ModelBuilderTest, EveryGraphLayerKindHasAKernel) {
  // Unordered and exact: a kernel for a kind the graph rejects is dead code,
  // and a duplicate entry would shadow the second.
  EXPECT_THAT(KernelLayerKinds(),
              ::testing::UnorderedElementsAreArray(GraphLayerKinds()));
}

}  // namespace
}  // namespace worker
}  // namespace apapo

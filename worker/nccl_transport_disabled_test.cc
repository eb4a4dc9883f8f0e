// Stands in for nccl_transport_test in builds without --config=cuda.
#include "gtest/gtest.h"

TEST(NcclTransportTest, NeedsConfigCuda) {
  GTEST_SKIP() << "built without --config=cuda; the NCCL transport is absent";
}

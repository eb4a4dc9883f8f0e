// Test profiles for the planning tests: a chain of 2048-wide layers.
#ifndef APAPO_PLANNING_CHAIN_PROFILE_TESTING_H_
#define APAPO_PLANNING_CHAIN_PROFILE_TESTING_H_

#include <cstdint>
#include <string>

#include "proto/apapo/v1/profile.pb.h"

namespace apapo::planning::test_profiles {

// fc0 -> fc1 -> ... (`layers`, 4 unless given), each 2048 x 2048 (16 MiB
// of parameters) with 1 MiB of activations at batch 128, forward 0.01 s;
// `first_backward` is fc0's backward time (the others take 0.02 s),
// `split_width` marks the layers splittable (0: not).
inline apapo::v1::ModelProfile Chain(const std::string& model, double first_backward,
                                     int64_t split_width, int layers = 4) {
  apapo::v1::ModelProfile p;
  p.set_model(model);
  p.set_batch_size(128);
  std::string prev;
  for (int i = 0; i < layers; ++i) {
    auto* n = p.add_nodes();
    n->set_id("fc" + std::to_string(i));
    if (!prev.empty()) n->add_inputs(prev);
    n->set_forward_seconds(0.01);
    n->set_backward_seconds(i == 0 ? first_backward : 0.02);
    n->set_activation_bytes(128 * 2048 * 4);
    n->set_parameter_bytes(2048LL * 2048 * 4);
    n->set_split_width(split_width);
    prev = n->id();
  }
  return p;
}

}  // namespace apapo::planning::test_profiles

#endif  // APAPO_PLANNING_CHAIN_PROFILE_TESTING_H_

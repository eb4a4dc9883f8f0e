#include "bench/fleet/canned.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"

namespace apapo::bench {
namespace {

// Nominal speeds of the worker the costs are "measured" on.
constexpr double kFlopsPerSecond = 50e9;       // GEMM throughput
constexpr double kBytesPerSecond = 10e9;       // elementwise memory traffic
constexpr double kLoopbackBandwidth = 2e9;     // bytes/s
constexpr double kLoopbackLatency = 50e-6;     // seconds
constexpr int64_t kLinkMessageBytes = 1 << 20;

int64_t HyperInt(const apapo::v1::BuiltinModel& model, const std::string& key,
                 int64_t fallback) {
  auto it = model.hyper_parameters().find(key);
  return it != model.hyper_parameters().end() && it->second.i() > 0
             ? it->second.i()
             : fallback;
}

}  // namespace

apapo::v1::ModelProfile CannedProfile(const apapo::v1::JobSpec& spec) {
  const bool mlp = spec.model().has_builtin() &&
                   spec.model().builtin().name() == "mlp";
  const apapo::v1::BuiltinModel no_params;
  const apapo::v1::BuiltinModel& model =
      mlp ? spec.model().builtin() : no_params;
  const int64_t hidden = HyperInt(model, "hidden", 2048);
  const int64_t layers = HyperInt(model, "layers", 4);
  int64_t features = 1;
  int64_t classes = 10;
  if (spec.data().has_synthetic()) {
    for (int64_t d : spec.data().synthetic().sample_shape()) features *= d;
    if (spec.data().synthetic().num_classes() > 1) {
      classes = spec.data().synthetic().num_classes();
    }
  } else {
    features = 28 * 28;  // Fashion-MNIST
  }
  const int64_t batch = std::max(1, spec.data().batch_size());

  apapo::v1::ModelProfile profile;
  profile.set_model("mlp");
  profile.set_batch_size(batch);
  profile.set_source("canned by the fleet simulator (not measured)");
  auto add = [&](const std::string& id, const std::string& input,
                 int64_t width) {
    apapo::v1::NodeProfile* node = profile.add_nodes();
    node->set_id(id);
    if (!input.empty()) node->add_inputs(input);
    // float32 activations of the whole mini-batch.
    node->set_activation_bytes(4 * batch * width);
    return node;
  };
  add("input", "", features)->set_description("input");
  std::string prev = "input";
  int64_t in = features;
  for (int64_t i = 1; i <= layers + 1; ++i) {
    const int64_t out = i <= layers ? hidden : classes;
    const std::string fc = absl::StrCat("fc", i);
    apapo::v1::NodeProfile* node = add(fc, prev, out);
    // A GEMM of batch x in x out: 2*b*i*o flops forward, twice that back
    // (input and weight gradients).
    const double forward = 2.0 * batch * in * out / kFlopsPerSecond;
    node->set_forward_seconds(forward);
    node->set_backward_seconds(2 * forward);
    node->set_parameter_bytes(4 * (in * out + out));
    node->set_split_width(out);
    node->set_description(absl::StrCat("Linear(", in, ", ", out, ")"));
    prev = fc;
    if (i <= layers) {
      const std::string relu = absl::StrCat("relu", i);
      node = add(relu, prev, out);
      // Reads and writes b*o floats forward; twice that backward.
      const double elementwise = 8.0 * batch * out / kBytesPerSecond;
      node->set_forward_seconds(elementwise);
      node->set_backward_seconds(2 * elementwise);
      node->set_description("ReLU");
      prev = relu;
    }
    in = out;
  }
  apapo::v1::NodeProfile* loss = add("loss", prev, 1);
  loss->set_forward_seconds(8.0 * batch * classes / kBytesPerSecond);
  loss->set_backward_seconds(loss->forward_seconds());
  loss->set_description("CrossEntropyLoss");
  return profile;
}

std::vector<apapo::v1::LinkMeasurement> CannedLinks(
    const std::vector<std::string>& peers, int rank) {
  std::vector<apapo::v1::LinkMeasurement> links;
  const int n = static_cast<int>(peers.size());
  if (n <= 1 || rank < 0 || rank >= n) return links;
  apapo::v1::LinkMeasurement& link = links.emplace_back();
  link.set_from_worker(peers[rank]);
  link.set_to_worker(peers[(rank + 1) % n]);
  link.set_bandwidth_bytes_per_second(kLoopbackBandwidth);
  link.set_latency_seconds(kLoopbackLatency);
  link.set_message_bytes(kLinkMessageBytes);
  return links;
}

apapo::v1::JobSpec DataParallelJobSpec(const std::string& name, int workers) {
  apapo::v1::JobSpec spec;
  spec.set_name(name);
  apapo::v1::BuiltinModel* model = spec.mutable_model()->mutable_builtin();
  model->set_name("mlp");
  (*model->mutable_hyper_parameters())["hidden"].set_i(256);
  (*model->mutable_hyper_parameters())["layers"].set_i(2);
  apapo::v1::SyntheticData* data = spec.mutable_data()->mutable_synthetic();
  data->add_sample_shape(784);
  data->set_num_classes(10);
  data->set_samples_per_epoch(2560);
  // Four samples per replica: divisible by the data-parallel default of
  // one micro-batch per replica, whatever the worker count.
  spec.mutable_data()->set_batch_size(4 * workers);
  spec.mutable_optimizer()->mutable_sgd()->set_momentum(0.9);
  spec.mutable_optimizer()->set_learning_rate(0.05);
  spec.mutable_schedule()->set_kind(apapo::v1::SCHEDULE_KIND_DATA_PARALLEL);
  spec.mutable_schedule()->set_stages(1);
  spec.mutable_schedule()->set_replicas(workers);
  spec.mutable_resources()->set_workers(workers);
  spec.mutable_resources()->set_threads_per_worker(1);
  spec.mutable_limits()->set_max_steps(10);
  spec.set_seed(1);
  return spec;
}

}  // namespace apapo::bench

#include "worker/stage_executor.h"

#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "schedule/span_kind.h"
#include "worker/batch_loader.h"
#include "worker/evaluator.h"
#include "worker/model_builder.h"
#include "worker/optimizer.h"
#include "worker/stage_context.h"
#include "worker/weight_store.h"

namespace apapo {
namespace worker {
namespace {

// The trace window opens where a run's throughput starts counting, so the
// measured timeline is the steady state the simulator's is.
static_assert(TraceOptions{}.warmup_steps == kRateWarmupSteps);

using schedule::Op;

std::vector<BundleEntry> FloatEntries(const std::vector<BundleEntry>& entries) {
  std::vector<BundleEntry> out;
  for (const auto& e : entries) {
    if (e.dtype == DType::kFloat32) out.push_back(e);
  }
  return out;
}

// The entries as they travel: without skip_zeros unless the job skips zeros.
std::vector<BundleEntry> WireEntries(std::vector<BundleEntry> entries,
                                     bool skip_zeros) {
  for (auto& e : entries) e.skip_zeros = e.skip_zeros && skip_zeros;
  return entries;
}

// The masks of a bundle's float entries, from those of all its entries.
std::vector<at::Tensor> FloatMasks(const std::vector<BundleEntry>& entries,
                                   const std::vector<at::Tensor>& masks) {
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < entries.size(); ++i) {
    if (entries[i].dtype == DType::kFloat32) {
      out.push_back(i < masks.size() ? masks[i] : at::Tensor());
    }
  }
  return out;
}

// Seconds since `start`, advancing `start` to now.
double Lap(absl::Time& start) {
  const absl::Time now = absl::Now();
  const double s = absl::ToDoubleSeconds(now - start);
  start = now;
  return s;
}

// The smallest part the all-reduce is cut into: a Gloo all-reduce costs
// about a millisecond a call whatever its size on this CPU, so a node's
// bias or a LayerNorm rides with the next node's weights.
constexpr int64_t kAllReducePartBytes = 256 << 10;

// The all-reduce's parts (Impl::allreduce_parts), in the order a split
// backward finishes their gradients. Where no send separates its passes
// (`products_in_pass1`, the first stage), the nodes whose weight gradient is
// one product (from the last to the first) come first: pass 1 computes them
// as their output's gradient arrives. Then the parameters pass 1 finishes
// (every node but `model`'s WeightGradientNodes), then the other nodes' from
// the last to the first (pass 2's order). Parts close at
// kAllReducePartBytes.
std::vector<std::vector<int>> AllReduceParts(const StageModel& model,
                                             const std::vector<at::Tensor>& params,
                                             bool products_in_pass1) {
  std::vector<std::vector<int>> hooked, pass2;
  std::vector<bool> in_node(params.size(), false);
  const std::vector<StageModel::WeightGradientNode> nodes = model.WeightGradientNodes();
  for (auto it = nodes.rbegin(); it != nodes.rend(); ++it) {
    std::vector<int>& unit =
        (products_in_pass1 && it->in_product ? hooked : pass2).emplace_back();
    for (int q = 0; q < it->num_params; ++q) {
      in_node[it->first_param + q] = true;
      unit.push_back(it->first_param + q);
    }
  }
  std::vector<std::vector<int>> units = std::move(hooked);
  units.emplace_back();
  for (size_t i = 0; i < params.size(); ++i) {
    if (!in_node[i]) units.back().push_back(static_cast<int>(i));
  }
  for (auto& unit : pass2) units.push_back(std::move(unit));
  std::vector<std::vector<int>> parts;
  std::vector<int> part;
  int64_t bytes = 0;
  for (const auto& unit : units) {
    for (int i : unit) {
      part.push_back(i);
      bytes += params[i].numel() * static_cast<int64_t>(params[i].element_size());
    }
    if (bytes >= kAllReducePartBytes) {
      parts.push_back(std::move(part));
      part.clear();
      bytes = 0;
    }
  }
  if (!part.empty()) parts.push_back(std::move(part));
  return parts;
}

}  // namespace

struct StageExecutor::Impl {
  // ---- constant after Create ----
  ExecutorConfig config;
  StageContext context;
  const Dataset* train = nullptr;
  const Dataset* test = nullptr;
  std::unique_ptr<StageModel> model;
  std::unique_ptr<Optimizer> optimizer;
  std::unique_ptr<WeightStore> weights;
  std::unique_ptr<Evaluator> evaluator;
  int64_t micro_batch_size = 0;
  int64_t steps_per_epoch = 0;
  int64_t total_steps = 0;
  // What crosses each cut, as it travels (WireEntries): the activations
  // received and sent, and the gradients sent back and received.
  std::vector<BundleEntry> in_entries, out_entries;
  std::vector<BundleEntry> in_grad_entries, out_grad_entries;

  // ---- training state ----
  int64_t phase = 0;  // programs run so far (message tags)
  int64_t global_step = 0;
  std::vector<at::Tensor> grad_acc;
  // The all-reduce in parts (AllReducesInParts()): the stage's parameters in
  // the order a split backward finishes their gradients (those of pass 1,
  // then each pass-2 node's, last node first), cut into parts of at least
  // kAllReducePartBytes.
  // Laid out from the model alone, so every replica starts the same parts in
  // the same order, one with no micro-batch in an iteration too.
  std::vector<std::vector<int>> allreduce_parts;
  std::vector<bool> grad_final;  // this iteration's gradient is complete
  size_t parts_started = 0;      // this iteration's
  // What a forward leaves for its send and its backward.
  struct Stash {
    int64_t version = 0;
    std::vector<at::Tensor> inputs;   // leaves (float ones require grad)
    std::vector<at::Tensor> outputs;  // non-last: the tensors sent on
    // Per entry skipping zeros, the positions that crossed (kBool): those
    // of the inputs (their gradients go back there) and of the outputs
    // (their gradients come back there).
    std::vector<at::Tensor> input_masks, output_masks;
    at::Tensor loss;                  // last: scaled loss
    // config.split_backward: the outputs of the nodes whose weight
    // gradients the second pass computes (StageForward::param_outputs).
    std::vector<StageForward::ParamNodeOutput> param_outputs;
  };
  std::map<int64_t, Stash> stash;
  // Posted receives: micro-batch -> the rank its bundle comes from.
  std::map<int64_t, int> activation_sources, gradient_sources;
  // Input gradients of finished backwards, until their send, with the
  // masks of their float entries (Stash::input_masks).
  struct InputGrads {
    std::vector<at::Tensor> grads;
    std::vector<at::Tensor> masks;
  };
  std::map<int64_t, InputGrads> input_grads;
  bool stop_requested = false;
  int64_t last_saved_step = -1;
  // Replica 0 of a checkpointing stage: writes its snapshots.
  std::unique_ptr<CheckpointWriter> checkpoint_writer;

  // ---- counters and progress ----
  StageReport report;
  absl::Time phase_start;  // of the training phase running now
  std::vector<BackwardRecord> records;
  ProgressTracker progress;
  double last_accuracy = -1;
  // The measured timeline's window (made once training starts).
  std::unique_ptr<SpanRecorder> spans;

  const StageLayout& layout() const { return *context.layout; }
  Transport* transport() const { return context.transport; }
  absl::Status Fail(absl::string_view what, const absl::Status& cause) const {
    return context.Fail(what, cause);
  }

  // `report` with the transport's counters (thread-safe to read mid-run).
  StageReport Snapshot() const {
    StageReport r = report;
    r.checkpoint_step = std::max(
        r.resumed_step, checkpoint_writer != nullptr ? checkpoint_writer->written_step() : 0);
    if (checkpoint_writer != nullptr) {
      r.checkpoint_write_cpu_seconds = checkpoint_writer->write_cpu_seconds();
    }
    if (transport() != nullptr) {
      const TransportStats t = transport()->Stats();
      r.bytes_sent = t.bytes_sent;
      r.bytes_received = t.bytes_received;
      r.comm_total_seconds = t.send_seconds + t.allreduce_seconds;
    }
    return r;
  }

  // Micro-batch `local` (0-based within the iteration) of iteration
  // `iteration` of the epoch whose sample order is `order`.
  std::vector<at::Tensor> LoadMicroBatch(int64_t iteration, int64_t local,
                                         const std::vector<int64_t>& order) {
    const int64_t first =
        iteration * config.data.batch_size + local * micro_batch_size;
    return LoadRows(*train, absl::MakeConstSpan(order).subspan(first, micro_batch_size),
                    micro_batch_size);
  }

  // ---- transfers ----

  absl::Status PostReceive(const Op& op) {
    const bool activations = op.type == Op::kRecvActivations;
    const int src = context.RankOf(
        activations ? context.stage - 1 : context.stage + 1, op.peer);
    const std::vector<BundleEntry>& entries =
        activations ? in_entries : out_grad_entries;
    const int64_t tag = MessageTag(phase, op.micro_batch);
    absl::Status st =
        AnySkipsZeros(entries)
            ? transport()->ExpectRecvUpTo(
                  src, tag,
                  SkipZerosCapacity(entries, micro_batch_size, config.wire_precision,
                                    activations ? BundleKind::kActivations
                                                : BundleKind::kGradients))
            : transport()->ExpectRecv(
                  src, tag,
                  BundleBytes(entries, micro_batch_size, config.wire_precision));
    if (!st.ok()) return Fail("posting receives", st);
    (activations ? activation_sources : gradient_sources)[op.micro_batch] = src;
    return absl::OkStatus();
  }

  // The bundle posted for micro-batch j, once it is in (time waited: idle).
  absl::StatusOr<at::Tensor> TakeReceived(std::map<int64_t, int>& sources,
                                          int64_t j, absl::Time& t,
                                          absl::string_view what) {
    auto it = sources.find(j);
    if (it == sources.end()) {
      return absl::InternalError(absl::StrCat(
          context.label, ": ", what, " of micro-batch ", j,
          " were never posted for receipt"));
    }
    const int src = it->second;
    sources.erase(it);
    auto bytes = transport()->Recv(src, MessageTag(phase, j));
    report.idle_seconds += Lap(t);
    spans->Split(apapo::v1::SPAN_KIND_RECV);
    if (!bytes.ok()) {
      return Fail(absl::StrCat("receiving ", what, " of micro-batch ", j),
                  bytes.status());
    }
    return bytes;
  }

  // A bundle as it travels: without a ReLU's zeros where `entries` skip
  // them (masks: see PackSkippingZeros), else whole.
  at::Tensor Pack(const std::vector<at::Tensor>& tensors,
                  const std::vector<BundleEntry>& entries, BundleKind kind,
                  std::vector<at::Tensor>& masks) const {
    return AnySkipsZeros(entries)
               ? PackSkippingZeros(tensors, entries, config.wire_precision, kind, masks)
               : PackBundle(tensors, config.wire_precision);
  }
  absl::StatusOr<std::vector<at::Tensor>> Unpack(const at::Tensor& bytes,
                                                 const std::vector<BundleEntry>& entries,
                                                 BundleKind kind,
                                                 std::vector<at::Tensor>& masks) const {
    return AnySkipsZeros(entries)
               ? UnpackSkippingZeros(bytes, entries, micro_batch_size,
                                     config.wire_precision, kind, masks)
               : UnpackBundle(bytes, entries, micro_batch_size, config.wire_precision);
  }

  absl::Status Send(const Op& op) {
    absl::Time t = absl::Now();
    const int64_t j = op.micro_batch;
    const bool activations = op.type == Op::kSendActivations;
    at::Tensor bytes;
    if (activations) {
      auto it = stash.find(j);
      if (it == stash.end()) {
        return absl::InternalError(absl::StrCat(
            context.label, ": send of micro-batch ", j, " before its forward"));
      }
      bytes = Pack(it->second.outputs, out_entries, BundleKind::kActivations,
                   it->second.output_masks);
    } else {
      auto it = input_grads.find(j);
      if (it == input_grads.end()) {
        return absl::InternalError(absl::StrCat(
            context.label, ": send of micro-batch ", j, "'s gradients before its backward"));
      }
      bytes = Pack(it->second.grads, in_grad_entries, BundleKind::kGradients,
                   it->second.masks);
      input_grads.erase(it);
    }
    const int dst = context.RankOf(
        activations ? context.stage + 1 : context.stage - 1, op.peer);
    absl::Status st = transport()->Send(dst, MessageTag(phase, j), bytes);
    report.busy_seconds += Lap(t);
    if (!st.ok()) {
      return Fail(activations ? "sending activations" : "sending gradients", st);
    }
    return absl::OkStatus();
  }

  // ---- compute ----

  absl::Status Forward(const Op& op, int64_t version_base,
                       int64_t first_iteration,
                       const std::vector<int64_t>& order) {
    absl::Time t = absl::Now();
    const int64_t j = op.micro_batch;
    const int64_t m = config.schedule.micro_batches_per_iteration;
    std::vector<at::Tensor> inputs, input_masks;
    if (layout().is_first) {
      inputs = LoadMicroBatch(first_iteration + j / m, j % m, order);
    } else {
      auto bytes = TakeReceived(activation_sources, j, t, "activations");
      if (!bytes.ok()) return bytes.status();
      auto unpacked = Unpack(*bytes, in_entries, BundleKind::kActivations, input_masks);
      if (!unpacked.ok()) return Fail("unpacking activations", unpacked.status());
      for (size_t i = 0; i < unpacked->size(); ++i) {
        at::Tensor leaf = (*unpacked)[i].detach();
        if (layout().inputs[i].dtype == DType::kFloat32) {
          leaf.requires_grad_(true);
        }
        inputs.push_back(leaf);
      }
    }
    const int64_t v = version_base + op.weight_version;
    if (!weights->holds(v)) {
      return absl::InternalError(absl::StrCat(
          context.label, ": forward of micro-batch ", j,
          " needs weight version ", v, ", which is not held (newest ",
          weights->newest(), ")"));
    }
    weights->Acquire(v);
    auto fwd = model->Forward(inputs, weights->ComputeWeights(v, global_step),
                              /*training=*/true,
                              /*keep_param_outputs=*/config.split_backward);
    if (!fwd.ok()) return Fail("forward", fwd.status());
    Stash s;
    s.version = v;
    s.inputs = std::move(inputs);
    s.input_masks = std::move(input_masks);
    s.param_outputs = std::move(fwd->param_outputs);
    if (layout().is_last) {
      progress.AddLoss(fwd->loss.item<double>());
      // d(mini-batch mean)/d(micro-batch mean) = 1/m for equal micro-batches.
      s.loss = fwd->loss / static_cast<double>(m);
    } else {
      s.outputs = std::move(fwd->outputs);
    }
    stash[j] = std::move(s);
    ++report.forward_micro_batches;
    report.samples += micro_batch_size;
    report.busy_seconds += Lap(t);
    return absl::OkStatus();
  }

  // The gradients of micro-batch j's float inputs (`input_target` indexes
  // `grads` per input, -1: none; zeros where autograd gave none), for the
  // send that follows the backward.
  void KeepInputGrads(int64_t j, const Stash& s, const std::vector<int>& input_target,
                      const std::vector<at::Tensor>& grads) {
    std::vector<at::Tensor> out;
    size_t k = 0;
    for (size_t i = 0; i < layout().inputs.size(); ++i) {
      if (layout().inputs[i].dtype != DType::kFloat32) continue;
      const int target = input_target[k++];
      at::Tensor g = target >= 0 ? grads[target] : at::Tensor();
      if (!g.defined()) g = torch::zeros_like(s.inputs[i]);
      out.push_back(g);
    }
    input_grads[j] = {std::move(out), FloatMasks(in_entries, s.input_masks)};
  }

  // Whether this stage's backward runs in two passes around the send of
  // its input gradients (ExecutorConfig::split_backward).
  bool SplitsBackward() const {
    return config.split_backward && !layout().is_first;
  }

  // A Linear's weight gradient g^T x, added by the product itself into
  // the mini-batch's grad_acc (addmm_: no pass over it per micro-batch, as
  // autograd's mm then add_ makes; the same sums, bit for bit), and its
  // bias gradient, g's column sums as autograd computes them, into
  // `grads`. With record_backwards the product goes to `grads` as well.
  absl::Status AddWeightProduct(const StageForward::ParamNodeOutput& po, const at::Tensor& g,
                                int64_t j, std::vector<at::Tensor>& grads) {
    torch::NoGradGuard no_grad;
    const int w = po.first_param;
    try {
      const at::Tensor gt = g.t();
      if (grad_acc[w].defined()) {
        grad_acc[w].addmm_(gt, po.product_input);
      } else {
        grad_acc[w] = at::mm(gt, po.product_input);
      }
      if (config.test.record_backwards) grads[w] = at::mm(gt, po.product_input);
      if (po.num_params > 1) grads[w + 1] = g.sum(0);
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat(context.label, ": backward of micro-batch ", j,
                                              " (weight gradients) failed: ", e.what()));
    }
    return absl::OkStatus();
  }

  // Whether the stage's gradient all-reduce runs in parts that overlap its
  // last backward of an iteration: a replicated stage with a split backward
  // (pass 2, the weight gradients, hides the parts started before it ends).
  bool AllReducesInParts() const { return !allreduce_parts.empty(); }

  // Whether micro-batch j is this replica's last of its iteration (the
  // schedule's rule: the next local micro-batch, j + R_s, is in a later one).
  bool LastOfIteration(int64_t j) const {
    const int64_t m = config.schedule.micro_batches_per_iteration;
    const int64_t r = config.schedule.Replicas(config.stage);
    return j / m != (j + r) / m;
  }

  // Starts, in order, every part whose gradients are all final (none may be
  // skipped: the replicas' starts must match); a gradient nobody produced
  // counts as zeros. `in_backward`: called by one, `in_pass1`: by its
  // pass 1 (counted in the report).
  absl::Status StartFinishedParts(bool in_backward, bool in_pass1 = false) {
    const std::vector<at::Tensor>& current = weights->newest_weights();
    while (parts_started < allreduce_parts.size()) {
      const std::vector<int>& part = allreduce_parts[parts_started];
      for (int i : part) {
        if (!grad_final[i]) return absl::OkStatus();
      }
      std::vector<at::Tensor> sums;
      for (int i : part) {
        if (!grad_acc[i].defined()) grad_acc[i] = torch::zeros_like(current[i]);
        sums.push_back(grad_acc[i]);
      }
      absl::Status st = transport()->StartAllReduceSum(context.stage, sums);
      if (!st.ok()) return Fail("all-reducing gradients", st);
      ++parts_started;
      ++report.allreduce_parts;
      if (in_backward) ++report.allreduce_parts_in_backward;
      if (in_pass1) ++report.allreduce_parts_in_pass1;
    }
    return absl::OkStatus();
  }

  // Backward of op.micro_batch. With config.split_backward, in two passes:
  // the input gradients and those of the nodes' outputs, then (with `send`,
  // SplitsBackward(): the kSendGradients that follows it in the program)
  // the send, then each node's weight gradients from its output's gradient
  // alone; a Linear's weight gradient is added into grad_acc by its
  // product. A node's parameters are its own (StageModel gives each kernel
  // its range), so its output reaches them only through the node itself
  // and the second pass computes exactly what one pass would.
  absl::Status Backward(const Op& op, int64_t version_base, const Op* send = nullptr) {
    absl::Time t = absl::Now();
    const int64_t j = op.micro_batch;
    auto sit = stash.find(j);
    if (sit == stash.end()) {
      return absl::InternalError(absl::StrCat(
          context.label, ": backward of micro-batch ", j, " without its forward"));
    }
    Stash s = std::move(sit->second);
    stash.erase(sit);
    const int64_t v = version_base + op.weight_version;
    if (v != s.version) {
      return absl::InternalError(absl::StrCat(
          context.label, ": weight stashing violated: micro-batch ", j,
          " ran forward with version ", s.version, " but backward names ", v));
    }
    std::vector<at::Tensor> roots, root_grads, grad_outputs;
    if (layout().is_last) {
      roots.push_back(s.loss);
    } else {
      auto bytes = TakeReceived(gradient_sources, j, t, "gradients");
      if (!bytes.ok()) return bytes.status();
      std::vector<at::Tensor> masks = FloatMasks(out_entries, s.output_masks);
      auto grads = Unpack(*bytes, out_grad_entries, BundleKind::kGradients, masks);
      if (!grads.ok()) return Fail("unpacking gradients", grads.status());
      size_t g = 0;
      for (size_t i = 0; i < layout().outputs.size(); ++i) {
        if (layout().outputs[i].dtype != DType::kFloat32) continue;
        const at::Tensor& grad = (*grads)[g++];
        if (s.outputs[i].requires_grad()) {
          roots.push_back(s.outputs[i]);
          root_grads.push_back(grad);
        }
        if (config.test.record_backwards) grad_outputs.push_back(grad.clone());
      }
    }
    const std::vector<at::Tensor>& params =
        weights->ComputeWeights(v, global_step);
    std::vector<at::Tensor> targets(params.begin(), params.end());
    std::vector<int> input_target;  // index into targets per float input
    for (size_t i = 0; i < s.inputs.size(); ++i) {
      if (s.inputs[i].requires_grad()) {
        input_target.push_back(static_cast<int>(targets.size()));
        targets.push_back(s.inputs[i]);
      } else if (!layout().is_first &&
                 layout().inputs[i].dtype == DType::kFloat32) {
        input_target.push_back(-1);
      }
    }
    std::vector<at::Tensor> grads;
    // Weights whose gradient pass 2 adds into grad_acc inside its product.
    std::vector<bool> in_place(params.size(), false);
    // Autograd's gradients are fresh tensors, so the accumulator takes them
    // as they are, unless one shares storage with another (an op may hand
    // the same tensor to two inputs): that one is copied before add_/mul_.
    // Received gradient buffers count as taken: a parameter's gradient may
    // be the received tensor itself (e.g. a bias added last).
    std::set<const void*> grad_storage;
    for (const auto& g : root_grads) grad_storage.insert(g.storage().data());
    std::vector<bool> accumulated(params.size(), false);
    const auto accumulate = [&](size_t i) {
      if (accumulated[i] || i >= grads.size() || !grads[i].defined() || in_place[i]) return;
      accumulated[i] = true;
      if (!grad_acc[i].defined()) {
        const void* storage = grads[i].storage().data();
        grad_acc[i] = grad_storage.insert(storage).second
                          ? grads[i].detach()
                          : grads[i].detach().clone();
      } else {
        grad_acc[i].add_(grads[i]);
      }
    };
    // The iteration's last backward on a replicated stage finishes the
    // gradients: each part of the all-reduce starts as soon as its
    // parameters' are in (pass 1's, then each node's of pass 2), while the
    // rest of the backward computes.
    const bool start_parts = AllReducesInParts() && LastOfIteration(j);
    const auto finish = [&](int first, int count, bool in_pass1 = false) -> absl::Status {
      for (int i = first; i < first + count; ++i) {
        accumulate(i);
        grad_final[i] = true;
      }
      return StartFinishedParts(/*in_backward=*/true, in_pass1);
    };
    if (config.split_backward) {
      // Pass 1: the inputs' gradients, those of the outputs of the nodes
      // whose weight gradients follow the send, and the weight gradients
      // of the other nodes (autograd computes no weight gradient no target
      // needs).
      const size_t first_output = targets.size();
      std::vector<at::Tensor> pass1(targets.begin() + params.size(), targets.end());
      for (const auto& po : s.param_outputs) pass1.push_back(po.output);
      std::vector<bool> after_send(params.size(), false);
      for (const auto& po : s.param_outputs) {
        for (int q = 0; q < po.num_params; ++q) after_send[po.first_param + q] = true;
      }
      std::vector<size_t> before_send;  // params computed in pass 1
      for (size_t i = 0; i < params.size(); ++i) {
        if (!after_send[i]) {
          before_send.push_back(i);
          pass1.push_back(params[i]);
        }
      }
      // Where no send separates the passes (the first stage) and the
      // all-reduce starts in parts, a product node's weight gradient is
      // computed as soon as pass 1 reaches its output (a hook on it) and its
      // part starts there: the rest of pass 1 and pass 2 hide it, as DDP's
      // hooks hide its buckets behind the whole backward. A node pass 1 does
      // not run through (a first Linear on the data) gets no call: pass 2
      // computes it.
      // A product node's weight gradient, added into grad_acc in place.
      const auto product = [&](const StageForward::ParamNodeOutput& po,
                               const at::Tensor& g) -> absl::Status {
        if (absl::Status st = AddWeightProduct(po, g, j, grads); !st.ok()) return st;
        in_place[po.first_param] = true;
        return absl::OkStatus();
      };
      std::vector<bool> in_pass1(s.param_outputs.size(), false);
      std::vector<std::pair<size_t, unsigned>> hooks;
      absl::Status hook_status;
      if (start_parts && layout().is_first) {
        grads.resize(params.size());
        for (size_t n = 0; n < s.param_outputs.size(); ++n) {
          const auto& po = s.param_outputs[n];
          if (!po.product_input.defined()) continue;
          hooks.emplace_back(n, po.output.register_hook([&, n](const at::Tensor& g) {
            if (!hook_status.ok() || in_pass1[n] || !g.defined()) return;
            const auto& node = s.param_outputs[n];
            in_pass1[n] = true;
            hook_status = product(node, g);
            if (hook_status.ok()) {
              hook_status = finish(node.first_param, node.num_params, /*in_pass1=*/true);
            }
          }));
        }
      }
      const auto remove_hooks = [&] {
        for (const auto& [n, h] : hooks) s.param_outputs[n].output.remove_hook(h);
        hooks.clear();
      };
      std::vector<at::Tensor> g1;
      if (!roots.empty() && !pass1.empty()) {
        try {
          g1 = torch::autograd::grad(roots, pass1, root_grads, /*retain_graph=*/true,
                                     /*create_graph=*/false, /*allow_unused=*/true);
        } catch (const std::exception& e) {
          remove_hooks();
          return absl::InternalError(absl::StrCat(context.label, ": backward of micro-batch ",
                                                  j, " (input gradients) failed: ", e.what()));
        }
      }
      remove_hooks();
      if (!hook_status.ok()) return hook_status;
      g1.resize(pass1.size());
      grads.resize(first_output);
      for (size_t i = params.size(); i < first_output; ++i) {
        grads[i] = g1[i - params.size()];
      }
      const size_t first_param_grad = first_output - params.size() + s.param_outputs.size();
      for (size_t q = 0; q < before_send.size(); ++q) {
        grads[before_send[q]] = g1[first_param_grad + q];
      }
      if (send != nullptr) {
        KeepInputGrads(j, s, input_target, grads);
        report.busy_seconds += Lap(t);
        // The send, as its own span, while this stage computes on.
        spans->End();
        spans->Begin(apapo::v1::SPAN_KIND_SEND, send->micro_batch, global_step);
        absl::Status sent = Send(*send);
        spans->End();
        if (!sent.ok()) return sent;
        spans->Begin(apapo::v1::SPAN_KIND_BACKWARD, j, global_step);
        t = absl::Now();
      }
      if (start_parts) {
        for (size_t q : before_send) {
          if (absl::Status st = finish(static_cast<int>(q), 1); !st.ok()) return st;
        }
      }
      // Pass 2: each node's weight gradients from its output's gradient,
      // the last node's first: where the all-reduce starts in parts, the
      // output side's (a classifier's wide Linears) then travel while the
      // input side's (convolutions: little weight, much compute) compute.
      for (size_t n = s.param_outputs.size(); n-- > 0;) {
        const at::Tensor& g = g1[first_output - params.size() + n];
        const auto& po = s.param_outputs[n];
        if (in_pass1[n]) continue;  // computed and started in pass 1
        if (g.defined() && po.product_input.defined()) {
          if (absl::Status st = product(po, g); !st.ok()) return st;
        } else if (g.defined()) {
          std::vector<at::Tensor> own(params.begin() + po.first_param,
                                      params.begin() + po.first_param + po.num_params);
          try {
            std::vector<at::Tensor> gw =
                torch::autograd::grad({po.output}, own, {g}, /*retain_graph=*/true,
                                      /*create_graph=*/false, /*allow_unused=*/true);
            for (int q = 0; q < po.num_params; ++q) grads[po.first_param + q] = gw[q];
          } catch (const std::exception& e) {
            return absl::InternalError(absl::StrCat(context.label, ": backward of micro-batch ",
                                                    j, " (weight gradients) failed: ", e.what()));
          }
        }
        if (start_parts) {
          if (absl::Status st = finish(po.first_param, po.num_params); !st.ok()) return st;
        }
      }
    } else if (!roots.empty() && !targets.empty()) {
      try {
        grads = torch::autograd::grad(roots, targets, root_grads,
                                      /*retain_graph=*/false,
                                      /*create_graph=*/false,
                                      /*allow_unused=*/true);
      } catch (const std::exception& e) {
        return absl::InternalError(absl::StrCat(
            context.label, ": backward of micro-batch ", j, " failed: ", e.what()));
      }
    }
    grads.resize(targets.size());
    for (size_t i = 0; i < params.size(); ++i) accumulate(i);
    if (config.test.record_backwards) {
      BackwardRecord r;
      r.micro_batch = j;
      r.forward_version = s.version;
      r.backward_version = v;
      r.newest_version = weights->newest();
      r.params = params;
      for (const auto& in : s.inputs) r.inputs.push_back(in.detach());
      r.grad_outputs = std::move(grad_outputs);
      for (size_t i = 0; i < params.size(); ++i) {
        r.param_grads.push_back(grads[i].defined() ? grads[i].detach().clone()
                                                   : torch::zeros_like(params[i]));
      }
      records.push_back(std::move(r));
    }
    if (!layout().is_first && send == nullptr) KeepInputGrads(j, s, input_target, grads);
    report.max_staleness = std::max(report.max_staleness, weights->newest() - v);
    ++report.backward_micro_batches;
    s = Stash();  // free activations before releasing the version
    weights->Release(v);
    report.busy_seconds += Lap(t);
    return absl::OkStatus();
  }

  // Gradients nobody produced (a replica without micro-batches in an
  // iteration, an unused parameter) count as zeros.
  void FillMissingGradients() {
    const std::vector<at::Tensor>& current = weights->newest_weights();
    for (size_t i = 0; i < grad_acc.size(); ++i) {
      if (!grad_acc[i].defined()) grad_acc[i] = torch::zeros_like(current[i]);
    }
  }

  absl::Status AllReduce() {
    absl::Time t = absl::Now();
    FillMissingGradients();
    if (!AllReducesInParts()) {
      absl::Status st = transport()->AllReduceSum(context.stage, grad_acc);
      report.comm_exposed_seconds += Lap(t);
      if (!st.ok()) return Fail("all-reducing gradients", st);
      return absl::OkStatus();
    }
    // The parts no backward started (a replica without a micro-batch in
    // this iteration starts them all here), then every part's sum.
    std::fill(grad_final.begin(), grad_final.end(), true);
    absl::Status st = StartFinishedParts(/*in_backward=*/false);
    absl::StatusOr<std::vector<std::vector<at::Tensor>>> sums =
        st.ok() ? transport()->FinishAllReduceSums(context.stage)
                : absl::StatusOr<std::vector<std::vector<at::Tensor>>>(st);
    report.comm_exposed_seconds += Lap(t);
    std::fill(grad_final.begin(), grad_final.end(), false);
    parts_started = 0;
    if (!sums.ok()) return Fail("all-reducing gradients", sums.status());
    if (sums->size() != allreduce_parts.size()) {
      return absl::InternalError(absl::StrCat(context.label, ": ", sums->size(),
                                              " all-reduce parts summed of ",
                                              allreduce_parts.size()));
    }
    for (size_t k = 0; k < allreduce_parts.size(); ++k) {
      for (size_t q = 0; q < allreduce_parts[k].size(); ++q) {
        grad_acc[allreduce_parts[k][q]] = (*sums)[k][q];
      }
    }
    return absl::OkStatus();
  }

  absl::Status Update(const Op& op, int64_t version_base) {
    absl::Time t = absl::Now();
    const int64_t produced = version_base + op.weight_version;
    if (produced != weights->newest() + 1) {
      return absl::InternalError(absl::StrCat(context.label,
                                              ": update produces version ",
                                              produced, " after ",
                                              weights->newest()));
    }
    FillMissingGradients();
    try {
      weights->Update(grad_acc, global_step);
    } catch (const std::exception& e) {
      return absl::InternalError(
          absl::StrCat(context.label, ": optimizer step failed: ", e.what()));
    }
    for (auto& g : grad_acc) g = at::Tensor();
    ++global_step;
    ++report.steps;
    if (report.steps == kRateWarmupSteps) {
      report.warm_train_seconds =
          report.train_seconds +
          absl::ToDoubleSeconds(absl::Now() - phase_start);
    }
    report.max_weight_versions =
        std::max(report.max_weight_versions, weights->size());
    report.busy_seconds += Lap(t);
    return absl::OkStatus();
  }

  absl::Status Flush() {
    absl::Time t = absl::Now();
    absl::Status st = transport()->Flush();
    report.comm_exposed_seconds += Lap(t);
    if (!st.ok()) return Fail("draining sends", st);
    return absl::OkStatus();
  }

  // Runs `iterations` iterations of `epoch` starting at `first_iteration`:
  // one StageProgram, op by op.
  absl::Status TrainPhase(int64_t epoch, int64_t first_iteration,
                          int64_t iterations) {
    ++phase;
    schedule::ScheduleOptions opts = config.schedule;
    opts.num_iterations = iterations;
    auto program =
        schedule::StageProgram::Create(opts, config.stage, config.replica);
    if (!program.ok()) return Fail("schedule", program.status());
    const std::vector<int64_t> order =
        layout().is_first ? EpochOrder(train->size(), config.seed, epoch,
                                       config.data.shuffle)
                          : std::vector<int64_t>();
    const int64_t version_base = weights->newest();
    const absl::Time start = absl::Now();
    phase_start = start;
    Op op;
    while (program->Next(&op)) {
      absl::Status st;
      const apapo::v1::SpanKind kind = schedule::SpanKindOf(op.type);
      if (kind != apapo::v1::SPAN_KIND_UNSPECIFIED) {
        spans->Begin(kind, op.micro_batch, global_step);
      }
      switch (op.type) {
        case Op::kRecvActivations:
        case Op::kRecvGradients:
          st = PostReceive(op);
          break;
        case Op::kForward:
          st = Forward(op, version_base, first_iteration, order);
          break;
        case Op::kSendActivations:
        case Op::kSendGradients:
          st = Send(op);
          break;
        case Op::kBackward:
          if (SplitsBackward()) {
            // The program sends the input gradients right after the
            // backward; the split backward sends them between its passes.
            Op send;
            if (!program->Next(&send) || send.type != Op::kSendGradients ||
                send.micro_batch != op.micro_batch) {
              st = absl::InternalError(absl::StrCat(
                  context.label, ": the backward of micro-batch ", op.micro_batch,
                  " is not followed by the send of its gradients"));
              break;
            }
            st = Backward(op, version_base, &send);
          } else {
            st = Backward(op, version_base);
          }
          break;
        case Op::kAllReduce:
          st = AllReduce();
          break;
        case Op::kUpdate:
          st = Update(op, version_base);
          if (st.ok()) MaybeReportProgress(epoch);
          break;
        case Op::kFlush:
          st = Flush();
          break;
        case Op::kReduceResult:
          st = absl::InternalError(
              absl::StrCat(context.label, ": training program has op RR"));
          break;
      }
      spans->End();
      if (!st.ok()) return st;
      if (op.type == Op::kUpdate && spans->Complete(global_step)) ShipTrace();
    }
    report.train_seconds += absl::ToDoubleSeconds(absl::Now() - start);
    return absl::OkStatus();
  }


  // Hands the window's spans to the observer (once).
  void ShipTrace() {
    apapo::v1::StageTrace trace = spans->Take();
    if (config.observer == nullptr || trace.spans_size() == 0) return;
    trace.set_stage(config.stage);
    trace.set_replica(config.replica);
    trace.set_rank(report.rank);
    config.observer->OnTrace(trace);
  }

  bool ReportsProgress() const {
    return layout().is_last && config.replica == 0;
  }

  void MaybeReportProgress(int64_t epoch) {
    progress.AddSamples(config.data.batch_size);
    if (config.observer == nullptr || config.progress_every <= 0 ||
        global_step % config.progress_every != 0) {
      return;
    }
    StageReport now = Snapshot();
    now.train_seconds += absl::ToDoubleSeconds(absl::Now() - phase_start);
    config.observer->OnCounters(now);
    if (ReportsProgress()) {
      config.observer->OnProgress(progress.Progress(
          global_step, total_steps, epoch + 1, last_accuracy, absl::Now()));
    }
  }

  // ---- checkpoints ----

  // Dropout's generator at step `step`: re-seeded from (seed, rank, step) at
  // every checkpoint and on resuming one, so a resumed run draws what an
  // uninterrupted one draws (step 0: Create's seed).
  void SeedDropout(int64_t step) const {
    torch::manual_seed(static_cast<uint64_t>(config.seed) * 1000 +
                       static_cast<uint64_t>(context.rank) +
                       static_cast<uint64_t>(step) * 1000003ULL);
  }

  // What the stage holds now, by reference (Clone() before training on).
  StageCheckpoint Holding() const {
    StageCheckpoint c;
    c.step = global_step;
    c.version = weights->newest();
    c.parameter_names = model->param_names();
    c.parameters = weights->newest_weights();
    c.optimizer = optimizer->State();
    c.buffers = model->Buffers();
    return c;
  }

  // Hands a snapshot of step `global_step` to the writer (replica 0 of each
  // stage writes; the others hold the same weights) and trains on.
  absl::Status SaveCheckpoint() {
    if (config.checkpoint.store == nullptr) return absl::OkStatus();
    last_saved_step = global_step;
    SeedDropout(global_step);
    if (checkpoint_writer == nullptr) return absl::OkStatus();
    absl::Time t = absl::Now();
    StageCheckpoint snapshot = Holding().Clone();
    absl::Status st = checkpoint_writer->Submit(std::move(snapshot));
    report.checkpoint_seconds += Lap(t);
    if (!st.ok()) return Fail("writing a checkpoint", st);
    return absl::OkStatus();
  }

  // Loads the newest complete step, whichever plan wrote it, then discards
  // newer (incomplete) steps of an abandoned run.
  absl::Status MaybeResume() {
    CheckpointStore* store = config.checkpoint.store;
    if (store == nullptr) return absl::OkStatus();
    if (config.checkpoint.resume) {
      auto step = store->NewestCompleteStep();
      if (!step.ok()) return Fail("listing checkpoints", step.status());
      if (step->has_value()) {
        StageCheckpoint c = Holding();
        if (absl::Status st = store->Load(**step, &c); !st.ok()) {
          return Fail("resuming", st);
        }
        const size_t n = c.parameters.size();
        if (absl::Status st = optimizer->LoadState(std::move(c.optimizer), n);
            !st.ok()) {
          return Fail("loading optimizer state", st);
        }
        {
          torch::NoGradGuard no_grad;
          std::vector<std::pair<std::string, at::Tensor>> buffers =
              model->Buffers();
          for (size_t i = 0; i < buffers.size(); ++i) {
            buffers[i].second.copy_(c.buffers[i].second);
          }
        }
        global_step = c.step;
        report.resumed_step = c.step;
        weights->Reset(c.version, std::move(c.parameters));
        SeedDropout(global_step);
      }
    }
    if (checkpoint_writer != nullptr) {
      if (absl::Status st = store->RemoveStepsAfter(global_step); !st.ok()) {
        return Fail("removing checkpoints of an abandoned run", st);
      }
    }
    return absl::OkStatus();
  }

  // ---- the run ----

  absl::Status Evaluate(int64_t epoch) {
    ++phase;
    auto acc = evaluator->Evaluate(weights->newest_weights(), phase);
    if (!acc.ok()) return acc.status();
    last_accuracy = *acc;
    report.test_accuracy = *acc;
    // Every rank learnt the same accuracy, so all stop together.
    stop_requested = config.limits.target_accuracy > 0 &&
                     *acc >= config.limits.target_accuracy;
    if (ReportsProgress() && config.observer != nullptr) {
      TrainingProgress p;
      p.step = global_step;
      p.total_steps = total_steps;
      p.epoch = epoch + 1;
      p.loss = report.final_loss;
      p.test_accuracy = *acc;
      p.samples_per_second = SteadySamplesPerSecond(
          report, static_cast<double>(report.steps * config.data.batch_size));
      config.observer->OnProgress(p);
    }
    return absl::OkStatus();
  }

  // Trains, then waits for the last checkpoint write: its error is the
  // run's.
  absl::Status Run() {
    absl::Status st = Train();
    // A run shorter than its window sends what it recorded.
    if (st.ok() && spans != nullptr && !spans->empty()) ShipTrace();
    if (checkpoint_writer != nullptr) {
      absl::Time t = absl::Now();
      absl::Status written = checkpoint_writer->Wait();
      report.checkpoint_seconds += Lap(t);
      if (st.ok() && !written.ok()) {
        return Fail("writing a checkpoint", written);
      }
    }
    return st;
  }

  absl::Status Train() {
    if (absl::Status st = MaybeResume(); !st.ok()) return st;
    spans = std::make_unique<SpanRecorder>(config.trace, global_step);
    progress.Start(absl::Now());
    const int64_t every =
        config.checkpoint.store == nullptr ? 0 : config.checkpoint.every_steps;
    for (int64_t epoch = global_step / steps_per_epoch;
         epoch < config.limits.epochs; ++epoch) {
      progress.StartEpoch();
      int64_t it = global_step - epoch * steps_per_epoch;
      while (it < steps_per_epoch && global_step < total_steps) {
        int64_t n = std::min(steps_per_epoch - it, total_steps - global_step);
        if (every > 0) n = std::min(n, every - global_step % every);
        if (absl::Status st = TrainPhase(epoch, it, n); !st.ok()) return st;
        it += n;
        if (every > 0 && global_step % every == 0) {
          if (absl::Status st = SaveCheckpoint(); !st.ok()) return st;
        }
      }
      if (progress.has_epoch_loss()) report.final_loss = progress.epoch_mean_loss();
      const bool last_epoch =
          epoch + 1 == config.limits.epochs || global_step >= total_steps;
      const int64_t eval_every = config.evaluation.every_epochs;
      if (eval_every > 0 && ((epoch + 1) % eval_every == 0 || last_epoch)) {
        if (absl::Status st = Evaluate(epoch); !st.ok()) return st;
      }
      if (stop_requested || global_step >= total_steps) break;
    }
    if (config.checkpoint.store != nullptr && last_saved_step != global_step) {
      if (absl::Status st = SaveCheckpoint(); !st.ok()) return st;
    }
    return absl::OkStatus();
  }
};

absl::StatusOr<std::unique_ptr<StageExecutor>> StageExecutor::Create(
    ExecutorConfig config, Transport* transport, const Dataset* train,
    const Dataset* test) {
  auto impl = std::make_unique<Impl>();
  const auto& s = config.schedule;
  if (config.graph == nullptr ||
      static_cast<int>(config.layouts.size()) != s.num_stages) {
    return absl::InvalidArgumentError(
        "executor needs the graph and one layout per stage");
  }
  if (config.stage < 0 || config.stage >= s.num_stages || config.replica < 0 ||
      config.replica >= s.Replicas(config.stage)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "stage ", config.stage, " replica ", config.replica, " out of range"));
  }
  if (absl::Status st = schedule::ValidateScheduleOptions(s); !st.ok()) {
    return st;
  }
  const int64_t m = s.micro_batches_per_iteration;
  const int64_t batch = config.data.batch_size;
  if (batch < 1 || batch % m != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.data.batch_size (", batch,
        ") must be a positive multiple of spec.schedule.micro_batches (", m,
        ")"));
  }
  const bool needs_transport = s.num_stages > 1 || s.Replicas(0) > 1;
  if (needs_transport && transport == nullptr) {
    return absl::InvalidArgumentError("a pipeline needs a transport");
  }
  StageContext& c = impl->context;
  c.schedule = s;
  c.stage = config.stage;
  c.replica = config.replica;
  c.rank = schedule::RankOf(s, config.stage, config.replica);
  c.transport = transport;
  c.label = absl::StrCat("stage ", config.stage, " replica ", config.replica,
                         " (rank ", c.rank, ")");
  if (train == nullptr || test == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(c.label, ": the training and test data are required"));
  }
  impl->micro_batch_size = batch / m;
  impl->steps_per_epoch = train->size() / batch;
  if (impl->steps_per_epoch < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the training set (", train->size(),
        " samples) is smaller than one batch (", batch, ")"));
  }
  impl->total_steps =
      impl->steps_per_epoch * std::max<int64_t>(1, config.limits.epochs);
  if (config.limits.max_steps > 0) {
    impl->total_steps = std::min(impl->total_steps, config.limits.max_steps);
  }
  auto opt = Optimizer::Create(config.optimizer, impl->total_steps);
  if (!opt.ok()) return opt.status();
  impl->optimizer = *std::move(opt);
  impl->config = std::move(config);
  // `config` (and `s`, a reference into it) are moved from: below, only cfg.
  const ExecutorConfig& cfg = impl->config;
  c.layout = &cfg.layouts[cfg.stage];
  auto model = StageModel::Create(*cfg.graph, *c.layout);
  if (!model.ok()) return model.status();
  impl->model = *std::move(model);
  c.model = impl->model.get();
  impl->train = train;
  impl->test = test;
  impl->in_entries = WireEntries(c.layout->inputs, cfg.skip_zeros);
  impl->out_entries = WireEntries(c.layout->outputs, cfg.skip_zeros);
  impl->in_grad_entries = FloatEntries(impl->in_entries);
  impl->out_grad_entries = FloatEntries(impl->out_entries);

  std::vector<at::Tensor> initial;
  if (!cfg.test.initial_parameters.empty()) {
    if (cfg.test.initial_parameters.size() !=
        impl->model->param_names().size()) {
      return absl::InvalidArgumentError("initial_parameters has the wrong size");
    }
    initial = cfg.test.initial_parameters;
  } else {
    initial = impl->model->InitParameters(cfg.seed);
  }
  WeightStore::Options wo;
  wo.keep_previous = cfg.schedule.kind == schedule::ScheduleKind::k2BW;
  // Recorded backwards keep their versions' tensors.
  wo.recycle = !cfg.test.record_backwards;
  if (cfg.weight_prediction && cfg.schedule.kind == schedule::ScheduleKind::kAsync) {
    // The stage's gradient delay in updates: its in-flight depth minus one,
    // in micro-batches, over the micro-batches of an update.
    wo.prediction_steps =
        static_cast<double>(schedule::InFlightDepth(cfg.schedule, cfg.stage) - 1) / m;
  }
  impl->grad_acc.resize(initial.size());
  if (cfg.split_backward && cfg.allreduce_in_parts &&
      cfg.schedule.Replicas(cfg.stage) > 1) {
    impl->allreduce_parts =
        AllReduceParts(*impl->model, initial, /*products_in_pass1=*/c.layout->is_first);
    impl->grad_final.assign(initial.size(), false);
  }
  impl->weights = std::make_unique<WeightStore>(impl->optimizer.get(), wo,
                                                std::move(initial));
  const int64_t eval_batch = cfg.evaluation.batch_size > 0
                                 ? cfg.evaluation.batch_size
                                 : cfg.data.batch_size;
  // Forwards run a training micro-batch's rows at a time (evaluator.h).
  impl->evaluator = std::make_unique<Evaluator>(&impl->context, test, eval_batch,
                                                impl->micro_batch_size);
  impl->report.stage = cfg.stage;
  impl->report.replica = cfg.replica;
  impl->report.rank = c.rank;
  impl->report.num_params = c.layout->num_params;
  impl->report.max_weight_versions = 1;
  if (cfg.checkpoint.store != nullptr && cfg.replica == 0) {
    impl->checkpoint_writer =
        std::make_unique<CheckpointWriter>(cfg.checkpoint.store, cfg.stage);
  }
  // Seed dropout per stage replica (dropout masks are local to a stage).
  impl->SeedDropout(0);
  return std::unique_ptr<StageExecutor>(new StageExecutor(std::move(impl)));
}

StageExecutor::StageExecutor(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}
StageExecutor::~StageExecutor() = default;

absl::Status StageExecutor::Run() {
  try {
    return impl_->Run();
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat(impl_->context.label, ": LibTorch error: ", e.what()));
  }
}

const std::vector<at::Tensor>& StageExecutor::parameters() const {
  return impl_->weights->newest_weights();
}
const std::vector<std::string>& StageExecutor::parameter_names() const {
  return impl_->model->param_names();
}
const std::vector<BackwardRecord>& StageExecutor::backward_records() const {
  return impl_->records;
}

StageReport StageExecutor::Report() const { return impl_->Snapshot(); }

}  // namespace worker
}  // namespace apapo

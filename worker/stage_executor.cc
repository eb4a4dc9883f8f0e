#include "worker/stage_executor.h"

#include <dirent.h>
#include <sys/stat.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace apapo {
namespace worker {
namespace {

using schedule::Op;

// Tags: 64 phases x 2^24 micro-batches fit Gloo's 32-bit tag.
int64_t Tag(int64_t phase, int64_t micro_batch) {
  return (phase % 64) * (int64_t{1} << 24) + (micro_batch % (int64_t{1} << 24));
}

std::vector<BundleEntry> FloatEntries(const std::vector<BundleEntry>& entries) {
  std::vector<BundleEntry> out;
  for (const auto& e : entries) {
    if (e.dtype == DType::kFloat32) out.push_back(e);
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

}  // namespace

struct StageExecutor::Impl {
  ExecutorConfig config;
  Transport* transport = nullptr;
  const Dataset* train = nullptr;
  const Dataset* test = nullptr;
  std::unique_ptr<StageModel> model;
  std::unique_ptr<Optimizer> optimizer;
  const StageLayout* layout = nullptr;
  std::string label;  // "stage 1 replica 0 (rank 1)"
  int rank = 0;
  int64_t micro_batch_size = 0;
  int64_t steps_per_epoch = 0;
  int64_t total_steps = 0;
  int64_t phase = 0;  // phases run so far (for tags)

  // Weight versions: global version -> tensors; refs = in-flight users.
  std::map<int64_t, std::vector<at::Tensor>> versions;
  std::map<int64_t, int> version_refs;
  // Tensors of the last dropped version, overwritten by the next update.
  std::vector<at::Tensor> spare;
  // Weight prediction: updates ahead (0: off) and the predicted weights of
  // each held version, made by the optimizer step that made the version
  // (SGD momentum, fused) or else on the version's first forward.
  double prediction_steps = 0;
  std::map<int64_t, std::vector<at::Tensor>> predicted;
  // Predicted tensors of the last dropped version (never a version's own
  // tensors), overwritten by the next prediction.
  std::vector<at::Tensor> predicted_spare;

  // The weights forward and backward of version `v` run on.
  const std::vector<at::Tensor>& WeightsFor(int64_t v) {
    if (prediction_steps <= 0) return versions.at(v);
    auto it = predicted.find(v);
    if (it == predicted.end()) {
      it = predicted
               .emplace(v, optimizer->Predict(versions.at(v), prediction_steps,
                                              global_step,
                                              std::move(predicted_spare)))
               .first;
    }
    return it->second;
  }
  int64_t newest = 0;
  int64_t global_step = 0;
  std::vector<at::Tensor> grad_acc;

  // What a forward leaves for its backward.
  struct Stash {
    int64_t version = 0;
    std::vector<at::Tensor> inputs;   // leaves (float ones require grad)
    std::vector<at::Tensor> outputs;  // non-last: the sent tensors
    at::Tensor loss;                  // last: scaled loss
  };
  std::map<int64_t, Stash> stash;

  StageReport report;
  absl::Time phase_start;  // of the training phase running now
  std::vector<BackwardRecord> records;

  // `report` with the transport's counters (thread-safe to read mid-run).
  StageReport Snapshot() const {
    StageReport r = report;
    if (transport != nullptr) {
      const TransportStats t = transport->Stats();
      r.bytes_sent = t.bytes_sent;
      r.bytes_received = t.bytes_received;
      r.comm_total_seconds = t.send_seconds + t.allreduce_seconds;
    }
    return r;
  }
  std::deque<double> recent_losses;
  double epoch_loss_sum = 0;
  int64_t epoch_loss_count = 0;
  double last_accuracy = -1;
  absl::Time progress_start;
  int64_t progress_samples = 0;

  std::vector<BundleEntry> in_grad_entries, out_grad_entries;

  int PrevRank(int64_t j) const {
    const auto& s = config.schedule;
    return RankOf(s, config.stage - 1,
                  static_cast<int>(j % s.Replicas(config.stage - 1)));
  }
  int NextRank(int64_t j) const {
    const auto& s = config.schedule;
    return RankOf(s, config.stage + 1,
                  static_cast<int>(j % s.Replicas(config.stage + 1)));
  }
  absl::Status Fail(absl::string_view what, const absl::Status& cause) const {
    if (absl::StrContains(cause.message(), label)) return cause;
    return absl::Status(cause.code(),
                        absl::StrCat(label, ": ", what, ": ", cause.message()));
  }

  // Reads micro-batch `local` (0-based within the iteration) of iteration
  // `iteration` of `epoch` as {samples, labels}.
  std::vector<at::Tensor> LoadMicroBatch(int64_t epoch, int64_t iteration,
                                         int64_t local,
                                         const std::vector<int64_t>& order) {
    const DataShape& ds = train->shape();
    std::vector<int64_t> xs{micro_batch_size};
    xs.insert(xs.end(), ds.sample_shape.begin(), ds.sample_shape.end());
    std::vector<int64_t> ys{micro_batch_size};
    const Shape ls = train->label_shape();
    ys.insert(ys.end(), ls.begin(), ls.end());
    at::Tensor x = torch::empty(
        xs, ds.sample_dtype == DType::kInt64 ? torch::kLong : torch::kFloat);
    at::Tensor y = torch::empty(ys, torch::kLong);
    const int64_t x_stride = x.numel() / micro_batch_size;
    const int64_t y_stride = y.numel() / micro_batch_size;
    const int64_t elem = ds.sample_dtype == DType::kInt64 ? 8 : 4;
    for (int64_t i = 0; i < micro_batch_size; ++i) {
      const int64_t row =
          order[iteration * config.batch_size + local * micro_batch_size + i];
      train->Get(row,
                 static_cast<char*>(x.data_ptr()) + i * x_stride * elem,
                 y.data_ptr<int64_t>() + i * y_stride);
    }
    (void)epoch;
    return {x, y};
  }

  void ReleaseVersion(int64_t v) {
    if (--version_refs[v] == 0) version_refs.erase(v);
    DropUnusedVersions();
  }
  // Keeps version v's predicted tensors for the next prediction, except
  // those that are the version's own (Predict passes a parameter without a
  // step direction through).
  void RecyclePrediction(int64_t v, const std::vector<at::Tensor>& own) {
    auto it = predicted.find(v);
    if (it == predicted.end()) return;
    std::vector<at::Tensor> keep(it->second.size());
    for (size_t i = 0; i < keep.size(); ++i) {
      if (i >= own.size() || !it->second[i].is_same(own[i])) {
        keep[i] = std::move(it->second[i]);
      }
    }
    predicted_spare = std::move(keep);
  }

  void DropUnusedVersions() {
    // 2BW runs iteration k with version k-1, so it keeps one older version.
    const int64_t keep_from =
        config.schedule.kind == schedule::ScheduleKind::k2BW ? newest - 1
                                                             : newest;
    for (auto it = versions.begin(); it != versions.end();) {
      if (it->first < keep_from && !version_refs.count(it->first)) {
        // Version 0 may be the caller's tensors (initial_parameters) and
        // recorded backwards keep their versions' tensors: neither is reused.
        if (it->first > 0 && !config.record_backwards) {
          RecyclePrediction(it->first, it->second);
          spare = std::move(it->second);
        }
        predicted.erase(it->first);
        it = versions.erase(it);
      } else {
        ++it;
      }
    }
  }

  absl::Status Forward(const Op& op, int64_t version_base, int64_t epoch,
                       int64_t first_iteration,
                       const std::vector<int64_t>& order) {
    absl::Time t = absl::Now();
    const int64_t j = op.micro_batch;
    const int64_t m = config.schedule.micro_batches_per_iteration;
    std::vector<at::Tensor> inputs;
    if (layout->is_first) {
      inputs = LoadMicroBatch(epoch, first_iteration + j / m, j % m, order);
    } else {
      auto bytes = transport->Recv(PrevRank(j), Tag(phase, j));
      report.idle_seconds += Lap(t);
      if (!bytes.ok()) {
        return Fail(absl::StrCat("receiving activations of micro-batch ", j),
                    bytes.status());
      }
      auto unpacked = UnpackBundle(*bytes, layout->inputs, micro_batch_size);
      if (!unpacked.ok()) return Fail("unpacking activations", unpacked.status());
      for (size_t i = 0; i < unpacked->size(); ++i) {
        at::Tensor leaf = (*unpacked)[i].detach();
        if (layout->inputs[i].dtype == DType::kFloat32) {
          leaf.requires_grad_(true);
        }
        inputs.push_back(leaf);
      }
    }
    const int64_t v = version_base + op.weight_version;
    auto vit = versions.find(v);
    if (vit == versions.end()) {
      return absl::InternalError(absl::StrCat(
          label, ": forward of micro-batch ", j, " needs weight version ", v,
          ", which is not held (newest ", newest, ")"));
    }
    ++version_refs[v];
    auto fwd = model->Forward(inputs, WeightsFor(v), /*training=*/true);
    if (!fwd.ok()) return Fail("forward", fwd.status());
    Stash s;
    s.version = v;
    s.inputs = std::move(inputs);
    if (layout->is_last) {
      const double loss = fwd->loss.item<double>();
      recent_losses.push_back(loss);
      if (recent_losses.size() > 50) recent_losses.pop_front();
      epoch_loss_sum += loss;
      ++epoch_loss_count;
      // d(mini-batch mean)/d(micro-batch mean) = 1/m for equal micro-batches.
      s.loss = fwd->loss / static_cast<double>(m);
    } else {
      at::Tensor bytes = PackBundle(fwd->outputs);
      s.outputs = std::move(fwd->outputs);
      absl::Status st = transport->Send(NextRank(j), Tag(phase, j), bytes);
      if (!st.ok()) return Fail("sending activations", st);
    }
    stash[j] = std::move(s);
    ++report.forward_micro_batches;
    report.samples += micro_batch_size;
    report.busy_seconds += Lap(t);
    return absl::OkStatus();
  }

  absl::Status Backward(const Op& op, int64_t version_base) {
    absl::Time t = absl::Now();
    const int64_t j = op.micro_batch;
    auto sit = stash.find(j);
    if (sit == stash.end()) {
      return absl::InternalError(absl::StrCat(
          label, ": backward of micro-batch ", j, " without its forward"));
    }
    Stash s = std::move(sit->second);
    stash.erase(sit);
    const int64_t v = version_base + op.weight_version;
    if (v != s.version) {
      return absl::InternalError(absl::StrCat(
          label, ": weight stashing violated: micro-batch ", j,
          " ran forward with version ", s.version, " but backward names ", v));
    }
    std::vector<at::Tensor> roots, root_grads, grad_outputs;
    if (layout->is_last) {
      roots.push_back(s.loss);
    } else {
      auto bytes = transport->Recv(NextRank(j), Tag(phase, j));
      report.idle_seconds += Lap(t);
      if (!bytes.ok()) {
        return Fail(absl::StrCat("receiving gradients of micro-batch ", j),
                    bytes.status());
      }
      auto grads = UnpackBundle(*bytes, out_grad_entries, micro_batch_size);
      if (!grads.ok()) return Fail("unpacking gradients", grads.status());
      size_t g = 0;
      for (size_t i = 0; i < layout->outputs.size(); ++i) {
        if (layout->outputs[i].dtype != DType::kFloat32) continue;
        const at::Tensor& grad = (*grads)[g++];
        if (s.outputs[i].requires_grad()) {
          roots.push_back(s.outputs[i]);
          root_grads.push_back(grad);
        }
        if (config.record_backwards) grad_outputs.push_back(grad.clone());
      }
    }
    const std::vector<at::Tensor>& params = WeightsFor(v);
    std::vector<at::Tensor> targets(params.begin(), params.end());
    std::vector<int> input_target;  // index into targets per float input
    for (size_t i = 0; i < s.inputs.size(); ++i) {
      if (s.inputs[i].requires_grad()) {
        input_target.push_back(static_cast<int>(targets.size()));
        targets.push_back(s.inputs[i]);
      } else if (!layout->is_first &&
                 layout->inputs[i].dtype == DType::kFloat32) {
        input_target.push_back(-1);
      }
    }
    std::vector<at::Tensor> grads;
    if (!roots.empty() && !targets.empty()) {
      try {
        grads = torch::autograd::grad(roots, targets, root_grads,
                                      /*retain_graph=*/false,
                                      /*create_graph=*/false,
                                      /*allow_unused=*/true);
      } catch (const std::exception& e) {
        return absl::InternalError(absl::StrCat(
            label, ": backward of micro-batch ", j, " failed: ", e.what()));
      }
    }
    grads.resize(targets.size());
    // Autograd's gradients are fresh tensors, so the accumulator takes them
    // as they are, unless one shares storage with another (an op may hand
    // the same tensor to two inputs): that one is copied before add_/mul_.
    // Received gradient buffers count as taken: a parameter's gradient may
    // be the received tensor itself (e.g. a bias added last).
    std::set<const void*> grad_storage;
    for (const auto& g : root_grads) grad_storage.insert(g.storage().data());
    for (size_t i = 0; i < params.size(); ++i) {
      if (!grads[i].defined()) continue;
      if (!grad_acc[i].defined()) {
        const void* storage = grads[i].storage().data();
        grad_acc[i] = grad_storage.insert(storage).second
                          ? grads[i].detach()
                          : grads[i].detach().clone();
      } else {
        grad_acc[i].add_(grads[i]);
      }
    }
    if (config.record_backwards) {
      BackwardRecord r;
      r.micro_batch = j;
      r.forward_version = s.version;
      r.backward_version = v;
      r.newest_version = newest;
      r.params = params;
      for (const auto& in : s.inputs) r.inputs.push_back(in.detach());
      r.grad_outputs = std::move(grad_outputs);
      for (size_t i = 0; i < params.size(); ++i) {
        r.param_grads.push_back(grads[i].defined() ? grads[i].detach().clone()
                                                   : torch::zeros_like(params[i]));
      }
      records.push_back(std::move(r));
    }
    if (!layout->is_first) {
      std::vector<at::Tensor> input_grads;
      size_t k = 0;
      for (size_t i = 0; i < layout->inputs.size(); ++i) {
        if (layout->inputs[i].dtype != DType::kFloat32) continue;
        const int target = input_target[k++];
        at::Tensor g = target >= 0 ? grads[target] : at::Tensor();
        if (!g.defined()) g = torch::zeros_like(s.inputs[i]);
        input_grads.push_back(g);
      }
      absl::Status st = transport->Send(PrevRank(j), Tag(phase, j),
                                        PackBundle(input_grads));
      if (!st.ok()) return Fail("sending gradients", st);
    }
    report.max_staleness = std::max(report.max_staleness, newest - v);
    ++report.backward_micro_batches;
    s = Stash();  // free activations before releasing the version
    ReleaseVersion(v);
    report.busy_seconds += Lap(t);
    return absl::OkStatus();
  }

  absl::Status Update(const Op& op, int64_t version_base) {
    absl::Time t = absl::Now();
    const int64_t produced = version_base + op.weight_version;
    if (produced != newest + 1) {
      return absl::InternalError(absl::StrCat(label, ": update produces version ",
                                              produced, " after ", newest));
    }
    const std::vector<at::Tensor>& current = versions.at(newest);
    for (size_t i = 0; i < grad_acc.size(); ++i) {
      if (!grad_acc[i].defined()) grad_acc[i] = torch::zeros_like(current[i]);
    }
    if (config.schedule.Replicas(config.stage) > 1) {
      absl::Status st = transport->AllReduceSum(config.stage, grad_acc);
      report.comm_exposed_seconds += Lap(t);
      if (!st.ok()) return Fail("all-reducing gradients", st);
    }
    std::vector<at::Tensor> next;
    Optimizer::FusedPrediction prediction;
    const bool predicting = prediction_steps > 0;
    if (predicting) {
      prediction.steps = prediction_steps;
      prediction.reuse = std::move(predicted_spare);
      predicted_spare.clear();
    }
    try {
      next = optimizer->Step(current, grad_acc, global_step, std::move(spare),
                             predicting ? &prediction : nullptr);
      spare.clear();
    } catch (const std::exception& e) {
      return absl::InternalError(
          absl::StrCat(label, ": optimizer step failed: ", e.what()));
    }
    newest = produced;
    versions[newest] = std::move(next);
    if (predicting) {
      if (!prediction.out.empty()) {
        predicted[newest] = std::move(prediction.out);  // made in the step
      } else {
        predicted_spare = std::move(prediction.reuse);  // WeightsFor makes it
      }
    }
    for (auto& g : grad_acc) g = at::Tensor();
    ++global_step;
    ++report.steps;
    report.max_weight_versions =
        std::max(report.max_weight_versions, static_cast<int>(versions.size()));
    DropUnusedVersions();
    report.busy_seconds += Lap(t);
    return absl::OkStatus();
  }

  // Runs `iterations` iterations of `epoch` starting at `first_iteration`.
  absl::Status TrainPhase(int64_t epoch, int64_t first_iteration,
                          int64_t iterations) {
    ++phase;
    schedule::ScheduleOptions opts = config.schedule;
    opts.num_iterations = iterations;
    auto program =
        schedule::StageProgram::Create(opts, config.stage, config.replica);
    if (!program.ok()) return Fail("schedule", program.status());
    const std::vector<int64_t> order =
        layout->is_first ? EpochOrder(train->size(), config.seed, epoch,
                                      config.shuffle)
                         : std::vector<int64_t>();
    // Declare every message of the phase so receives are posted ahead.
    if (transport != nullptr) {
      const int64_t in_bytes = BundleBytes(layout->inputs, micro_batch_size);
      const int64_t grad_bytes =
          BundleBytes(out_grad_entries, micro_batch_size);
      schedule::StageProgram scan = *program;
      Op op;
      while (scan.Next(&op)) {
        absl::Status st;
        if (op.type == Op::kForward && !layout->is_first) {
          st = transport->ExpectRecv(PrevRank(op.micro_batch),
                                     Tag(phase, op.micro_batch), in_bytes);
        } else if (op.type == Op::kBackward && !layout->is_last) {
          st = transport->ExpectRecv(NextRank(op.micro_batch),
                                     Tag(phase, op.micro_batch), grad_bytes);
        }
        if (!st.ok()) return Fail("posting receives", st);
      }
    }
    const int64_t version_base = newest;
    const absl::Time start = absl::Now();
    phase_start = start;
    Op op;
    while (program->Next(&op)) {
      absl::Status st;
      switch (op.type) {
        case Op::kForward:
          st = Forward(op, version_base, epoch, first_iteration, order);
          break;
        case Op::kBackward:
          st = Backward(op, version_base);
          break;
        case Op::kUpdate:
          st = Update(op, version_base);
          if (st.ok()) MaybeReportProgress(epoch);
          break;
      }
      if (!st.ok()) return st;
    }
    if (transport != nullptr) {
      absl::Time t = absl::Now();
      absl::Status st = transport->Flush();
      report.comm_exposed_seconds += Lap(t);
      if (!st.ok()) return Fail("draining sends", st);
    }
    report.train_seconds += absl::ToDoubleSeconds(absl::Now() - start);
    return absl::OkStatus();
  }

  void MaybeReportProgress(int64_t epoch) {
    progress_samples += config.batch_size;
    if (config.on_stage_report && config.progress_every > 0 &&
        global_step % config.progress_every == 0) {
      StageReport now = Snapshot();
      now.train_seconds += absl::ToDoubleSeconds(absl::Now() - phase_start);
      config.on_stage_report(now);
    }
    if (!layout->is_last || config.replica != 0 || !config.on_progress) return;
    if (config.progress_every <= 0 || global_step % config.progress_every != 0) {
      return;
    }
    TrainingProgress p;
    p.step = global_step;
    p.total_steps = total_steps;
    p.epoch = epoch + 1;
    double sum = 0;
    for (double l : recent_losses) sum += l;
    p.loss = recent_losses.empty() ? 0 : sum / recent_losses.size();
    const double secs = absl::ToDoubleSeconds(absl::Now() - progress_start);
    p.samples_per_second = secs > 0 ? progress_samples / secs : 0;
    p.test_accuracy = last_accuracy;
    config.on_progress(p);
  }

  // Forward-only pass over the test set through replica 0 of every stage.
  // Returns the accuracy on the last stage; every rank learns it (and
  // whether to stop) from a control message.
  absl::StatusOr<double> Evaluate() {
    ++phase;
    torch::NoGradGuard no_grad;
    const bool in_eval = config.replica == 0;
    const int64_t eb =
        config.eval_batch_size > 0 ? config.eval_batch_size : config.batch_size;
    const int64_t n = test != nullptr ? test->size() : 0;
    // Every rank needs the number of eval batches: stage 0 knows the test
    // set; others were given the same data spec, so sizes agree.
    const int64_t batches = (n + eb - 1) / eb;
    double accuracy = -1;
    const int last_rank = RankOf(config.schedule,
                                 config.schedule.num_stages - 1, 0);
    if (in_eval) {
      if (!layout->is_first) {
        for (int64_t b = 0; b < batches; ++b) {
          absl::Status st = transport->ExpectRecv(
              RankOf(config.schedule, config.stage - 1, 0), Tag(phase, b),
              BundleBytes(layout->inputs, eb));
          if (!st.ok()) return Fail("posting eval receives", st);
        }
      }
      int64_t correct = 0, counted = 0;
      const std::vector<at::Tensor>& params = versions.at(newest);
      for (int64_t b = 0; b < batches; ++b) {
        std::vector<at::Tensor> inputs;
        const int64_t valid = std::min(eb, n - b * eb);
        if (layout->is_first) {
          const DataShape& ds = test->shape();
          std::vector<int64_t> xs{eb};
          xs.insert(xs.end(), ds.sample_shape.begin(), ds.sample_shape.end());
          std::vector<int64_t> ys{eb};
          const Shape ls = test->label_shape();
          ys.insert(ys.end(), ls.begin(), ls.end());
          at::Tensor x = torch::zeros(xs, ds.sample_dtype == DType::kInt64
                                              ? torch::kLong
                                              : torch::kFloat);
          at::Tensor y = torch::zeros(ys, torch::kLong);
          const int64_t xst = x.numel() / eb, yst = y.numel() / eb;
          const int64_t elem = ds.sample_dtype == DType::kInt64 ? 8 : 4;
          for (int64_t i = 0; i < valid; ++i) {
            test->Get(b * eb + i,
                      static_cast<char*>(x.data_ptr()) + i * xst * elem,
                      y.data_ptr<int64_t>() + i * yst);
          }
          inputs = {x, y};
        } else {
          auto bytes = transport->Recv(
              RankOf(config.schedule, config.stage - 1, 0), Tag(phase, b));
          if (!bytes.ok()) return Fail("receiving eval activations", bytes.status());
          auto unpacked = UnpackBundle(*bytes, layout->inputs, eb);
          if (!unpacked.ok()) return unpacked.status();
          inputs = *unpacked;
        }
        auto fwd = model->Forward(inputs, params, /*training=*/false);
        if (!fwd.ok()) return Fail("eval forward", fwd.status());
        if (layout->is_last) {
          auto [c, k] = CountCorrect(fwd->logits, fwd->labels, valid);
          correct += c;
          counted += k;
        } else {
          absl::Status st = transport->Send(
              RankOf(config.schedule, config.stage + 1, 0), Tag(phase, b),
              PackBundle(fwd->outputs));
          if (!st.ok()) return Fail("sending eval activations", st);
        }
      }
      if (layout->is_last) accuracy = counted > 0 ? double(correct) / counted : 0;
    }
    // Control message: [accuracy, stop] from the last stage's replica 0.
    const int world = transport != nullptr ? transport->world_size() : 1;
    if (rank == last_rank) {
      const bool stop =
          config.target_accuracy > 0 && accuracy >= config.target_accuracy;
      at::Tensor msg = torch::tensor({accuracy, stop ? 1.0 : 0.0}, torch::kDouble);
      for (int r = 0; r < world; ++r) {
        if (r == rank) continue;
        absl::Status st = transport->Send(r, Tag(phase, 1 << 23),
                                          PackBundle({msg}));
        if (!st.ok()) return Fail("sending evaluation result", st);
      }
    } else {
      absl::Status st = transport->ExpectRecv(last_rank, Tag(phase, 1 << 23), 16);
      if (!st.ok()) return Fail("posting control receive", st);
      auto bytes = transport->Recv(last_rank, Tag(phase, 1 << 23));
      if (!bytes.ok()) return Fail("receiving evaluation result", bytes.status());
      at::Tensor msg = bytes->view(torch::kDouble);
      accuracy = msg[0].item<double>();
      stop_requested = msg[1].item<double>() > 0.5;
    }
    if (rank == last_rank) {
      stop_requested =
          config.target_accuracy > 0 && accuracy >= config.target_accuracy;
    }
    if (transport != nullptr) {
      absl::Status st = transport->Flush();
      if (!st.ok()) return Fail("draining eval sends", st);
    }
    return accuracy;
  }
  bool stop_requested = false;
  int64_t last_saved_step = -1;

  // ---- checkpoints ----
  std::string CheckpointPath(int64_t step, int stage, int replica) const {
    return absl::StrCat(config.checkpoint.directory(), "/step", step, ".stage",
                        stage, ".replica", replica, ".pt");
  }

  absl::Status SaveCheckpoint() {
    if (config.checkpoint.directory().empty()) return absl::OkStatus();
    mkdir(config.checkpoint.directory().c_str(), 0755);
    const std::string path =
        CheckpointPath(global_step, config.stage, config.replica);
    const std::string tmp = path + ".tmp";
    try {
      std::vector<at::Tensor> all;
      all.push_back(torch::tensor({global_step, newest}, torch::kLong));
      const auto& params = versions.at(newest);
      all.push_back(torch::tensor({static_cast<int64_t>(params.size())},
                                  torch::kLong));
      for (const auto& p : params) all.push_back(p.detach());
      const auto state = optimizer->State();
      all.push_back(torch::tensor({static_cast<int64_t>(state.size())},
                                  torch::kLong));
      for (const auto& t : state) all.push_back(t);
      for (const auto& b : model->Buffers()) all.push_back(b);
      torch::save(all, tmp);
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat(label, ": writing checkpoint '",
                                              tmp, "' failed: ", e.what()));
    }
    last_saved_step = global_step;
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
      return absl::InternalError(absl::StrCat(
          label, ": renaming checkpoint to '", path, "' failed"));
    }
    // Keep the two newest checkpoints of this replica.
    for (int64_t old : ListCheckpointSteps(config.stage, config.replica)) {
      if (old < global_step - std::max<int64_t>(1, config.checkpoint.every_steps())) {
        std::remove(CheckpointPath(old, config.stage, config.replica).c_str());
      }
    }
    return absl::OkStatus();
  }

  std::vector<int64_t> ListCheckpointSteps(int stage, int replica) const {
    std::vector<int64_t> steps;
    DIR* dir = opendir(config.checkpoint.directory().c_str());
    if (dir == nullptr) return steps;
    const std::string suffix =
        absl::StrCat(".stage", stage, ".replica", replica, ".pt");
    while (dirent* e = readdir(dir)) {
      std::string name = e->d_name;
      if (!absl::StartsWith(name, "step") || !absl::EndsWith(name, suffix)) {
        continue;
      }
      int64_t step;
      if (absl::SimpleAtoi(
              name.substr(4, name.size() - 4 - suffix.size()), &step)) {
        steps.push_back(step);
      }
    }
    closedir(dir);
    return steps;
  }

  // Loads the newest step for which every stage replica has a checkpoint.
  absl::Status MaybeResume() {
    if (config.checkpoint.directory().empty() || !config.checkpoint.resume()) {
      return absl::OkStatus();
    }
    std::set<int64_t> common;
    bool first = true;
    for (int s = 0; s < config.schedule.num_stages; ++s) {
      for (int r = 0; r < config.schedule.Replicas(s); ++r) {
        auto steps = ListCheckpointSteps(s, r);
        std::set<int64_t> mine(steps.begin(), steps.end());
        if (first) {
          common = mine;
          first = false;
        } else {
          std::set<int64_t> both;
          for (int64_t x : mine) {
            if (common.count(x)) both.insert(x);
          }
          common = both;
        }
      }
    }
    if (common.empty()) return absl::OkStatus();
    const int64_t step = *common.rbegin();
    const std::string path = CheckpointPath(step, config.stage, config.replica);
    try {
      std::vector<at::Tensor> all;
      torch::load(all, path);
      size_t k = 0;
      const int64_t saved_step = all[k][0].item<int64_t>();
      const int64_t saved_version = all[k++][1].item<int64_t>();
      const int64_t np = all[k++].item<int64_t>();
      if (np != static_cast<int64_t>(model->param_names().size())) {
        return absl::DataLossError(absl::StrCat(
            label, ": checkpoint '", path, "' holds ", np,
            " parameters, the stage has ", model->param_names().size()));
      }
      std::vector<at::Tensor> params;
      for (int64_t i = 0; i < np; ++i) {
        params.push_back(all[k++].clone().set_requires_grad(true));
      }
      const int64_t ns = all[k++].item<int64_t>();
      std::vector<at::Tensor> state(all.begin() + k, all.begin() + k + ns);
      k += ns;
      if (absl::Status st = optimizer->LoadState(state, params); !st.ok()) {
        return Fail("loading optimizer state", st);
      }
      auto buffers = model->Buffers();
      for (auto& b : buffers) {
        torch::NoGradGuard g;
        b.copy_(all[k++]);
      }
      versions.clear();
      version_refs.clear();
      newest = saved_version;
      global_step = saved_step;
      versions[newest] = std::move(params);
    } catch (const std::exception& e) {
      return absl::DataLossError(absl::StrCat(
          label, ": reading checkpoint '", path, "' failed: ", e.what()));
    }
    return absl::OkStatus();
  }

  absl::Status Run() {
    if (absl::Status st = MaybeResume(); !st.ok()) return st;
    progress_start = absl::Now();
    const int64_t every = config.checkpoint.directory().empty()
                              ? 0
                              : config.checkpoint.every_steps();
    for (int64_t epoch = global_step / steps_per_epoch; epoch < config.epochs;
         ++epoch) {
      epoch_loss_sum = 0;
      epoch_loss_count = 0;
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
      if (epoch_loss_count > 0) {
        report.final_loss = epoch_loss_sum / epoch_loss_count;
      }
      const bool last_epoch =
          epoch + 1 == config.epochs || global_step >= total_steps;
      const bool eval = config.eval_every_epochs > 0 &&
                        ((epoch + 1) % config.eval_every_epochs == 0 ||
                         last_epoch);
      if (eval) {
        auto acc = Evaluate();
        if (!acc.ok()) return acc.status();
        last_accuracy = *acc;
        report.test_accuracy = *acc;
        if (layout->is_last && config.replica == 0 && config.on_progress) {
          TrainingProgress p;
          p.step = global_step;
          p.total_steps = total_steps;
          p.epoch = epoch + 1;
          p.loss = report.final_loss;
          p.test_accuracy = *acc;
          const double secs = report.train_seconds;
          p.samples_per_second =
              secs > 0 ? report.steps * config.batch_size / secs : 0;
          config.on_progress(p);
        }
      }
      if (stop_requested || global_step >= total_steps) break;
    }
    if (!config.checkpoint.directory().empty() && last_saved_step != global_step) {
      if (absl::Status st = SaveCheckpoint(); !st.ok()) return st;
    }
    return absl::OkStatus();
  }
};

int StageExecutor::RankOf(const schedule::ScheduleOptions& schedule, int stage,
                          int replica) {
  int rank = 0;
  for (int s = 0; s < stage; ++s) rank += schedule.Replicas(s);
  return rank + replica;
}

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
  if (config.batch_size < 1 || config.batch_size % m != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.data.batch_size (", config.batch_size,
        ") must be a positive multiple of spec.schedule.micro_batches (", m,
        ")"));
  }
  const bool needs_transport = s.num_stages > 1 || s.Replicas(0) > 1;
  if (needs_transport && transport == nullptr) {
    return absl::InvalidArgumentError("a pipeline needs a transport");
  }
  impl->rank = RankOf(s, config.stage, config.replica);
  impl->label = absl::StrCat("stage ", config.stage, " replica ",
                             config.replica, " (rank ", impl->rank, ")");
  impl->layout = &config.layouts[config.stage];
  if (train == nullptr || test == nullptr) {
    // Every stage derives the epoch length and the number of evaluation
    // batches from the data; only stage 0 reads samples.
    return absl::InvalidArgumentError(
        absl::StrCat(impl->label, ": the training and test data are required"));
  }
  impl->micro_batch_size = config.batch_size / m;
  const Dataset* sizing = train;
  impl->steps_per_epoch = sizing->size() / config.batch_size;
  if (impl->steps_per_epoch < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the training set (", sizing->size(),
        " samples) is smaller than one batch (", config.batch_size, ")"));
  }
  impl->total_steps = impl->steps_per_epoch * std::max<int64_t>(1, config.epochs);
  if (config.max_steps > 0) {
    impl->total_steps = std::min(impl->total_steps, config.max_steps);
  }
  auto opt = Optimizer::Create(config.optimizer, impl->total_steps);
  if (!opt.ok()) return opt.status();
  impl->optimizer = *std::move(opt);
  if (config.weight_prediction &&
      config.schedule.kind == schedule::ScheduleKind::kAsync) {
    // The stage's gradient delay in updates: its in-flight depth minus one,
    // in micro-batches, over the micro-batches of an update.
    impl->prediction_steps =
        static_cast<double>(schedule::InFlightDepth(config.schedule, config.stage) - 1) /
        config.schedule.micro_batches_per_iteration;
  }
  impl->config = std::move(config);
  impl->layout = &impl->config.layouts[impl->config.stage];
  auto model = StageModel::Create(*impl->config.graph, *impl->layout);
  if (!model.ok()) return model.status();
  impl->model = *std::move(model);
  impl->transport = transport;
  impl->train = train;
  impl->test = test;
  impl->out_grad_entries = FloatEntries(impl->layout->outputs);
  impl->in_grad_entries = FloatEntries(impl->layout->inputs);
  if (!impl->config.initial_parameters.empty()) {
    if (impl->config.initial_parameters.size() !=
        impl->model->param_names().size()) {
      return absl::InvalidArgumentError("initial_parameters has the wrong size");
    }
    impl->versions[0] = impl->config.initial_parameters;
  } else {
    impl->versions[0] = impl->model->InitParameters(impl->config.seed);
  }
  impl->grad_acc.resize(impl->versions[0].size());
  impl->report.stage = impl->config.stage;
  impl->report.replica = impl->config.replica;
  impl->report.rank = impl->rank;
  impl->report.num_params = impl->layout->num_params;
  impl->report.max_weight_versions = 1;
  // Seed dropout per stage replica (dropout masks are local to a stage).
  torch::manual_seed(static_cast<uint64_t>(impl->config.seed) * 1000 +
                     impl->rank);
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
        absl::StrCat(impl_->label, ": LibTorch error: ", e.what()));
  }
}

const std::vector<at::Tensor>& StageExecutor::parameters() const {
  return impl_->versions.at(impl_->newest);
}
const std::vector<std::string>& StageExecutor::parameter_names() const {
  return impl_->model->param_names();
}
const std::vector<BackwardRecord>& StageExecutor::backward_records() const {
  return impl_->records;
}

StageReport StageExecutor::Report() const { return impl_->Snapshot(); }

void FillStageMetrics(const StageReport& r, int stage, int rank,
                      apapo::v1::StageMetrics* sm) {
  sm->set_stage(stage);
  sm->set_rank(rank);
  sm->set_busy_seconds(r.busy_seconds);
  sm->set_idle_seconds(r.idle_seconds);
  sm->set_comm_exposed_seconds(r.comm_exposed_seconds);
  sm->set_comm_total_seconds(r.comm_total_seconds);
  sm->set_bytes_sent(r.bytes_sent);
  sm->set_bytes_received(r.bytes_received);
  sm->set_forward_micro_batches(r.forward_micro_batches);
  sm->set_backward_micro_batches(r.backward_micro_batches);
  sm->set_max_staleness(static_cast<int32_t>(r.max_staleness));
  sm->set_max_weight_versions(r.max_weight_versions);
}

}  // namespace worker
}  // namespace apapo

#include "worker/evaluator.h"

#include <torch/torch.h>

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "worker/batch_loader.h"

namespace apapo::worker {

using schedule::Op;

// Evaluation measures the model as it is: its activations cross the cuts
// exactly, whatever precision training transfers in.
constexpr WirePrecision kEvalWire = WirePrecision::kFloat32;

Evaluator::Evaluator(const StageContext* context, const Dataset* test,
                     int64_t batch_size, int64_t chunk_rows)
    : context_(context),
      test_(test),
      batch_size_(batch_size),
      chunk_rows_(chunk_rows) {}

std::vector<at::Tensor> Evaluator::LoadBatch(int64_t b) const {
  std::vector<int64_t> rows;
  for (int64_t i = b * batch_size_;
       i < std::min(test_->size(), (b + 1) * batch_size_); ++i) {
    rows.push_back(i);
  }
  return LoadRows(*test_, rows, batch_size_);
}

absl::StatusOr<StageForward> ForwardInChunks(
    StageModel& model, const std::vector<at::Tensor>& inputs,
    const std::vector<at::Tensor>& weights, int64_t chunk_rows) {
  const int64_t batch = inputs.empty() ? 0 : inputs[0].size(0);
  if (chunk_rows <= 0 || chunk_rows >= batch) {
    return model.Forward(inputs, weights, /*training=*/false);
  }
  std::vector<std::vector<at::Tensor>> outputs;  // per output: its pieces
  std::vector<at::Tensor> logits, labels;
  for (int64_t start = 0; start < batch; start += chunk_rows) {
    const int64_t rows = std::min(chunk_rows, batch - start);
    std::vector<at::Tensor> piece;
    piece.reserve(inputs.size());
    for (const at::Tensor& t : inputs) piece.push_back(t.narrow(0, start, rows));
    absl::StatusOr<StageForward> fwd =
        model.Forward(piece, weights, /*training=*/false);
    if (!fwd.ok()) return fwd.status();
    outputs.resize(fwd->outputs.size());
    for (size_t i = 0; i < fwd->outputs.size(); ++i) {
      outputs[i].push_back(std::move(fwd->outputs[i]));
    }
    if (fwd->logits.defined()) logits.push_back(std::move(fwd->logits));
    if (fwd->labels.defined()) labels.push_back(std::move(fwd->labels));
  }
  StageForward whole;
  for (const std::vector<at::Tensor>& pieces : outputs) {
    whole.outputs.push_back(torch::cat(pieces, 0));
  }
  if (!logits.empty()) whole.logits = torch::cat(logits, 0);
  if (!labels.empty()) whole.labels = torch::cat(labels, 0);
  return whole;
}

absl::StatusOr<double> Evaluator::Evaluate(
    const std::vector<at::Tensor>& weights, int64_t phase) {
  const StageContext& c = *context_;
  torch::NoGradGuard no_grad;
  const int64_t eb = batch_size_;
  const int64_t n = test_->size();
  const int64_t batches = (n + eb - 1) / eb;
  auto program = schedule::StageProgram::CreateEvaluation(
      c.schedule, c.stage, c.replica, batches);
  if (!program.ok()) return c.Fail("evaluation schedule", program.status());
  int64_t correct = 0, counted = 0;
  std::map<int64_t, int> sources;          // batch -> rank it comes from
  std::map<int64_t, at::Tensor> outputs;   // batch -> bundle to send
  double accuracy = 0;
  Op op;
  while (program->Next(&op)) {
    const int64_t b = op.micro_batch;
    const int64_t tag = MessageTag(phase, b);
    switch (op.type) {
      case Op::kRecvActivations: {
        const int src = c.RankOf(c.stage - 1, op.peer);
        absl::Status st = c.transport->ExpectRecv(
            src, tag, BundleBytes(c.layout->inputs, eb, kEvalWire));
        if (!st.ok()) return c.Fail("posting eval receives", st);
        sources[b] = src;
        break;
      }
      case Op::kForward: {
        std::vector<at::Tensor> inputs;
        if (c.first()) {
          inputs = LoadBatch(b);
        } else {
          auto bytes = c.transport->Recv(sources.at(b), tag);
          sources.erase(b);
          if (!bytes.ok()) {
            return c.Fail("receiving eval activations", bytes.status());
          }
          auto unpacked = UnpackBundle(*bytes, c.layout->inputs, eb, kEvalWire);
          if (!unpacked.ok()) {
            return c.Fail("unpacking eval activations", unpacked.status());
          }
          inputs = *std::move(unpacked);
        }
        auto fwd = ForwardInChunks(*c.model, inputs, weights, chunk_rows_);
        if (!fwd.ok()) return c.Fail("eval forward", fwd.status());
        if (c.last()) {
          const int64_t valid = std::min(eb, n - b * eb);
          auto [k, m] = CountCorrect(fwd->logits, fwd->labels, valid);
          correct += k;
          counted += m;
        } else {
          outputs[b] = PackBundle(fwd->outputs, kEvalWire);
        }
        break;
      }
      case Op::kSendActivations: {
        absl::Status st = c.transport->Send(c.RankOf(c.stage + 1, op.peer), tag,
                                            outputs.at(b));
        outputs.erase(b);
        if (!st.ok()) return c.Fail("sending eval activations", st);
        break;
      }
      case Op::kFlush: {
        absl::Status st = c.transport->Flush();
        if (!st.ok()) return c.Fail("draining eval sends", st);
        break;
      }
      case Op::kReduceResult: {
        std::vector<at::Tensor> counts{torch::tensor(
            {static_cast<double>(correct), static_cast<double>(counted)},
            torch::kDouble)};
        if (c.transport != nullptr) {
          absl::Status st = c.transport->AllReduceSum(c.world_group(), counts);
          if (!st.ok()) return c.Fail("sharing the evaluation result", st);
        }
        const double total = counts[0][1].item<double>();
        accuracy = total > 0 ? counts[0][0].item<double>() / total : 0;
        break;
      }
      default:
        return absl::InternalError(absl::StrCat(
            c.label, ": evaluation program has op ", op.ToString()));
    }
  }
  return accuracy;
}

}  // namespace apapo::worker

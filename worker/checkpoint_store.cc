#include "worker/checkpoint_store.h"

#include <torch/torch.h>

#include <algorithm>
#include <exception>
#include <set>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace apapo::worker {

FileCheckpointStore::FileCheckpointStore(std::string directory,
                                         int64_t keep_within_steps,
                                         FileSystem* fs)
    : directory_(std::move(directory)),
      keep_within_steps_(std::max<int64_t>(1, keep_within_steps)),
      fs_(fs) {}

std::string FileCheckpointStore::PathOf(int64_t step, int stage,
                                        int replica) const {
  return absl::StrCat(directory_, "/step", step, ".stage", stage, ".replica",
                      replica, ".pt");
}

absl::Status FileCheckpointStore::Save(int stage, int replica,
                                       const StageCheckpoint& c) {
  if (absl::Status st = fs_->CreateDir(directory_); !st.ok()) return st;
  const std::string path = PathOf(c.step, stage, replica);
  // Layout: [step, version], [#params], params..., [#state], state...,
  // buffers... (the number of buffers is the model's).
  std::ostringstream bytes;
  try {
    std::vector<at::Tensor> all;
    all.push_back(torch::tensor({c.step, c.version}, torch::kLong));
    all.push_back(torch::tensor({static_cast<int64_t>(c.parameters.size())},
                                torch::kLong));
    for (const auto& p : c.parameters) all.push_back(p.detach());
    all.push_back(torch::tensor(
        {static_cast<int64_t>(c.optimizer_state.size())}, torch::kLong));
    for (const auto& t : c.optimizer_state) all.push_back(t);
    for (const auto& b : c.buffers) all.push_back(b);
    torch::save(all, bytes);
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("writing checkpoint '", path, "' failed: ", e.what()));
  }
  if (absl::Status st = fs_->WriteAtomically(path, bytes.str()); !st.ok()) {
    return absl::Status(st.code(), absl::StrCat("writing checkpoint '", path,
                                                "' failed: ", st.message()));
  }
  auto steps = Steps(stage, replica);
  if (!steps.ok()) return steps.status();
  for (int64_t old : *steps) {
    if (old < c.step - keep_within_steps_) {
      if (absl::Status st = fs_->Remove(PathOf(old, stage, replica)); !st.ok()) {
        return st;
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> FileCheckpointStore::Steps(int stage,
                                                                int replica) {
  auto names = fs_->List(directory_);
  if (!names.ok()) return names.status();
  const std::string suffix =
      absl::StrCat(".stage", stage, ".replica", replica, ".pt");
  std::vector<int64_t> steps;
  for (const std::string& name : *names) {
    if (!absl::StartsWith(name, "step") || !absl::EndsWith(name, suffix)) {
      continue;
    }
    int64_t step;
    if (absl::SimpleAtoi(name.substr(4, name.size() - 4 - suffix.size()),
                         &step)) {
      steps.push_back(step);
    }
  }
  return steps;
}

absl::StatusOr<StageCheckpoint> FileCheckpointStore::Load(
    int stage, int replica, int64_t step, size_t num_parameters) {
  const std::string path = PathOf(step, stage, replica);
  auto bytes = fs_->Read(path);
  if (!bytes.ok()) {
    return absl::DataLossError(absl::StrCat("reading checkpoint '", path,
                                            "' failed: ",
                                            bytes.status().message()));
  }
  StageCheckpoint c;
  try {
    std::istringstream in(*bytes);
    std::vector<at::Tensor> all;
    torch::load(all, in);
    size_t k = 0;
    auto next = [&]() -> const at::Tensor& {
      if (k >= all.size()) throw std::runtime_error("truncated");
      return all[k++];
    };
    const at::Tensor& header = next();
    c.step = header[0].item<int64_t>();
    c.version = header[1].item<int64_t>();
    const int64_t np = next().item<int64_t>();
    if (np != static_cast<int64_t>(num_parameters)) {
      return absl::DataLossError(
          absl::StrCat("checkpoint '", path, "' holds ", np,
                       " parameters, the stage has ", num_parameters));
    }
    for (int64_t i = 0; i < np; ++i) {
      c.parameters.push_back(next().clone().set_requires_grad(true));
    }
    const int64_t ns = next().item<int64_t>();
    for (int64_t i = 0; i < ns; ++i) c.optimizer_state.push_back(next());
    while (k < all.size()) c.buffers.push_back(all[k++]);
  } catch (const std::exception& e) {
    return absl::DataLossError(
        absl::StrCat("reading checkpoint '", path, "' failed: ", e.what()));
  }
  return c;
}

absl::StatusOr<std::optional<int64_t>> NewestCommonStep(
    CheckpointStore& store, const std::vector<std::pair<int, int>>& replicas) {
  std::set<int64_t> common;
  bool first = true;
  for (const auto& [stage, replica] : replicas) {
    auto steps = store.Steps(stage, replica);
    if (!steps.ok()) return steps.status();
    std::set<int64_t> mine(steps->begin(), steps->end());
    if (first) {
      common = std::move(mine);
      first = false;
      continue;
    }
    std::set<int64_t> both;
    for (int64_t x : mine) {
      if (common.count(x)) both.insert(x);
    }
    common = std::move(both);
  }
  if (common.empty()) return std::optional<int64_t>();
  return std::optional<int64_t>(*common.rbegin());
}

}  // namespace apapo::worker

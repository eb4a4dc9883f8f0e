#include "worker/checkpoint_store.h"

#include <torch/torch.h>
#include <time.h>
#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace apapo::worker {
namespace {

constexpr absl::string_view kParam = "param";
constexpr absl::string_view kBuffer = "buffer";

// The dtypes a checkpoint stores, by c10::toString's names.
constexpr c10::ScalarType kDTypes[] = {
    c10::ScalarType::Float, c10::ScalarType::Double, c10::ScalarType::Half,
    c10::ScalarType::BFloat16, c10::ScalarType::Long, c10::ScalarType::Int,
    c10::ScalarType::Byte, c10::ScalarType::Bool};

std::optional<c10::ScalarType> DTypeNamed(absl::string_view name) {
  for (c10::ScalarType t : kDTypes) {
    if (name == c10::toString(t)) return t;
  }
  return std::nullopt;
}

uint32_t Crc32(absl::string_view bytes) {
  uLong crc = crc32(0L, Z_NULL, 0);
  // zlib takes uInt lengths: feed large files in pieces.
  constexpr size_t kPiece = 1 << 30;
  for (size_t at = 0; at < bytes.size(); at += kPiece) {
    const size_t n = std::min(kPiece, bytes.size() - at);
    crc = crc32(crc, reinterpret_cast<const Bytef*>(bytes.data() + at),
                static_cast<uInt>(n));
  }
  return static_cast<uint32_t>(crc);
}


std::vector<int64_t> DimsOf(const at::Tensor& t) {
  return std::vector<int64_t>(t.sizes().begin(), t.sizes().end());
}




}  // namespace

StageCheckpoint StageCheckpoint::Clone() const {
  torch::NoGradGuard no_grad;
  StageCheckpoint c;
  c.step = step;
  c.version = version;
  c.parameter_names = parameter_names;
  for (const auto& p : parameters) c.parameters.push_back(p.detach().clone());
  c.optimizer.steps = optimizer.steps;
  c.optimizer.slot_names = optimizer.slot_names;
  for (const auto& slots : optimizer.per_param) {
    std::vector<at::Tensor> copy;
    for (const auto& t : slots) {
      copy.push_back(t.defined() ? t.detach().clone() : at::Tensor());
    }
    c.optimizer.per_param.push_back(std::move(copy));
  }
  for (const auto& [name, b] : buffers) {
    c.buffers.emplace_back(name, b.detach().clone());
  }
  return c;
}

FileCheckpointStore::FileCheckpointStore(std::string directory,
                                         int64_t keep_within_steps,
                                         const AnalyzedGraph* graph,
                                         FileSystem* fs)
    : directory_(std::move(directory)),
      keep_within_steps_(std::max<int64_t>(1, keep_within_steps)),
      graph_(graph),
      fs_(fs) {
  for (int i = 0; i < static_cast<int>(graph_->nodes().size()); ++i) {
    const NodeInfo& n = graph_->nodes()[i];
    const NodeOrigin o = OriginOf(*graph_, i);
    origins_.emplace(o.id, i);
    for (const ParamInfo& p : n.params) {
      required_[absl::StrCat(kParam, "/", o.id, ".", p.name)] =
          o.is_part ? o.total_rows : CheckpointRows(p.shape);
    }
  }
}

std::string FileCheckpointStore::StepDir(int64_t step) const {
  return absl::StrCat(directory_, "/step-", step);
}
std::string FileCheckpointStore::ManifestPath(int64_t step, int stage) const {
  return absl::StrCat(StepDir(step), "/stage-", stage, ".manifest");
}
std::string FileCheckpointStore::DataPath(int64_t step, int stage) const {
  return absl::StrCat(StepDir(step), "/stage-", stage, ".data");
}

absl::StatusOr<FileCheckpointStore::Entry> FileCheckpointStore::KeyOf(
    const std::string& prefix, const std::string& name,
    const at::Tensor& t) const {
  // "<node>.<rest>": node ids may hold dots, so take the first prefix of
  // `name` that is a node of the graph.
  for (size_t dot = name.find('.'); dot != std::string::npos;
       dot = name.find('.', dot + 1)) {
    const int index = graph_->IndexOf(name.substr(0, dot));
    if (index < 0) continue;
    const NodeOrigin o = OriginOf(*graph_, index);
    Entry e;
    e.key = absl::StrCat(prefix, "/", o.id, name.substr(dot));
    e.dims = DimsOf(t);
    if (o.is_part && prefix != kBuffer) {
      e.rows = o.rows;
      e.total_rows = o.total_rows;
      if (CheckpointRows(e.dims) != o.rows.size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "'", name, "' has ", CheckpointRows(e.dims), " rows, its part of '", o.id,
            "' has ", o.rows.size()));
      }
    } else {
      e.rows = {0, CheckpointRows(e.dims)};
      e.total_rows = CheckpointRows(e.dims);
    }
    return e;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("'", name, "' names no node of the model graph"));
}

absl::Status FileCheckpointStore::Save(int stage, const StageCheckpoint& c) {
  const std::string data_path = DataPath(c.step, stage);
  const std::string manifest_path = ManifestPath(c.step, stage);
  auto failed = [&](const std::string& path, const absl::Status& st) {
    return absl::Status(st.code(), absl::StrCat("writing checkpoint '", path,
                                                "' failed: ", st.message()));
  };
  if (c.parameters.size() != c.parameter_names.size() ||
      (!c.optimizer.per_param.empty() &&
       c.optimizer.per_param.size() != c.parameters.size())) {
    return failed(manifest_path, absl::InvalidArgumentError(
                                     "names, parameters and optimizer state "
                                     "differ in length"));
  }
  Manifest m;
  m.step = c.step;
  m.version = c.version;
  m.optimizer_steps = c.optimizer.steps;
  m.slots = c.optimizer.slot_names;
  std::string data;
  try {
    torch::NoGradGuard no_grad;
    auto add = [&](const std::string& prefix, const std::string& name,
                   const at::Tensor& t) -> absl::Status {
      auto e = KeyOf(prefix, name, t);
      if (!e.ok()) return e.status();
      const at::Tensor flat = t.detach().cpu().contiguous();
      e->dtype = c10::toString(flat.scalar_type());
      if (!DTypeNamed(e->dtype).has_value()) {
        return absl::InvalidArgumentError(
            absl::StrCat("'", name, "' has unsupported dtype ", e->dtype));
      }
      e->offset = static_cast<int64_t>(data.size());
      e->bytes = static_cast<int64_t>(flat.nbytes());
      data.append(static_cast<const char*>(flat.data_ptr()), flat.nbytes());
      m.entries.push_back(*std::move(e));
      return absl::OkStatus();
    };
    for (size_t i = 0; i < c.parameters.size(); ++i) {
      const std::string& name = c.parameter_names[i];
      if (absl::Status st = add(std::string(kParam), name, c.parameters[i]);
          !st.ok()) {
        return failed(manifest_path, st);
      }
      if (c.optimizer.per_param.empty()) continue;
      const auto& slots = c.optimizer.per_param[i];
      for (size_t k = 0; k < slots.size() && k < m.slots.size(); ++k) {
        if (!slots[k].defined()) continue;
        if (absl::Status st = add(m.slots[k], name, slots[k]); !st.ok()) {
          return failed(manifest_path, st);
        }
      }
    }
    for (const auto& [name, b] : c.buffers) {
      if (absl::Status st = add(std::string(kBuffer), name, b); !st.ok()) {
        return failed(manifest_path, st);
      }
    }
  } catch (const std::exception& e) {
    return failed(data_path, absl::InternalError(e.what()));
  }
  m.data_bytes = static_cast<int64_t>(data.size());
  m.data_crc = Crc32(data);
  if (absl::Status st = fs_->CreateDir(StepDir(c.step)); !st.ok()) {
    return failed(data_path, st);
  }
  if (absl::Status st = fs_->WriteAtomically(data_path, data); !st.ok()) {
    return failed(data_path, st);
  }
  data.clear();
  data.shrink_to_fit();
  const std::string data_name = absl::StrCat("stage-", stage, ".data");
  if (absl::Status st = fs_->WriteAtomically(manifest_path,
                                             CheckpointManifestText(m, stage, data_name));
      !st.ok()) {
    return failed(manifest_path, st);
  }
  // Prune once this step is complete (see the header).
  auto manifests = ReadManifests(c.step);
  if (!manifests.ok() || !Complete(*manifests)) return absl::OkStatus();
  auto steps = Steps();
  if (!steps.ok()) return steps.status();
  for (int64_t old : *steps) {
    if (old < c.step - keep_within_steps_) {
      if (absl::Status st = RemoveStep(old); !st.ok()) return st;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> FileCheckpointStore::Steps() const {
  auto names = fs_->List(directory_);
  if (!names.ok()) return names.status();
  std::vector<int64_t> steps;
  for (const std::string& name : *names) {
    int64_t step;
    if (absl::StartsWith(name, "step-") &&
        absl::SimpleAtoi(name.substr(5), &step)) {
      steps.push_back(step);
    }
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

absl::StatusOr<std::vector<FileCheckpointStore::Manifest>>
FileCheckpointStore::ReadManifests(int64_t step) const {
  const std::string dir = StepDir(step);
  auto names = fs_->List(dir);
  if (!names.ok()) return names.status();
  std::sort(names->begin(), names->end());
  std::vector<Manifest> out;
  for (const std::string& name : *names) {
    if (!absl::EndsWith(name, ".manifest")) continue;
    const std::string path = absl::StrCat(dir, "/", name);
    auto text = fs_->Read(path);
    if (!text.ok()) {
      if (absl::IsNotFound(text.status())) continue;  // pruned meanwhile
      return CheckpointDataLoss(path, text.status().message());
    }
    auto m = ParseCheckpointManifest(path, dir, *text);
    if (!m.ok()) return m.status();
    if (m->step != step) {
      return CheckpointDataLoss(path, absl::StrCat("holds step ", m->step));
    }
    for (const Entry& e : m->entries) {
      const size_t slash = e.key.find('/');
      const std::string kind = e.key.substr(0, slash);
      bool known;
      if (kind == kBuffer) {
        const std::string rest = e.key.substr(slash + 1);
        known = false;
        for (size_t dot = rest.find('.'); dot != std::string::npos && !known;
             dot = rest.find('.', dot + 1)) {
          known = origins_.count(rest.substr(0, dot)) > 0;
        }
      } else {
        auto it = slash == std::string::npos
                      ? required_.end()
                      : required_.find(absl::StrCat(kParam, e.key.substr(slash)));
        known = it != required_.end();
        if (known && e.total_rows != it->second) {
          return absl::InvalidArgumentError(absl::StrCat(
              "checkpoint file '", path, "': '", e.key, "' has ",
              e.total_rows, " rows, the model graph's has ", it->second));
        }
      }
      if (!known) {
        return absl::InvalidArgumentError(
            absl::StrCat("checkpoint file '", path, "' names '", e.key,
                         "', which the model graph does not have"));
      }
    }
    out.push_back(*std::move(m));
  }
  return out;
}

bool FileCheckpointStore::Complete(const std::vector<Manifest>& manifests) const {
  if (manifests.empty()) return false;
  std::map<std::string, std::vector<RowRange>> have;
  for (const Manifest& m : manifests) {
    for (const Entry& e : m.entries) have[e.key].push_back(e.rows);
  }
  for (const auto& [key, rows] : required_) {
    auto it = have.find(key);
    if (it == have.end()) return false;
    std::vector<RowRange>& r = it->second;
    std::sort(r.begin(), r.end(), [](const RowRange& a, const RowRange& b) {
      return a.begin < b.begin;
    });
    int64_t covered = 0;
    for (const RowRange& x : r) {
      if (x.begin > covered) return false;
      covered = std::max(covered, x.end);
    }
    if (covered < rows) return false;
  }
  return true;
}

absl::StatusOr<std::optional<int64_t>> FileCheckpointStore::NewestCompleteStep() {
  auto steps = Steps();
  if (!steps.ok()) return steps.status();
  for (auto it = steps->rbegin(); it != steps->rend(); ++it) {
    auto manifests = ReadManifests(*it);
    if (!manifests.ok()) return manifests.status();
    if (Complete(*manifests)) return std::optional<int64_t>(*it);
  }
  return std::optional<int64_t>();
}

absl::Status FileCheckpointStore::Load(int64_t step, StageCheckpoint* into) {
  auto manifests = ReadManifests(step);
  if (!manifests.ok()) return manifests.status();
  if (!Complete(*manifests)) {
    return absl::DataLossError(absl::StrCat("checkpoint step ", step, " in '",
                                            StepDir(step),
                                            "' is not complete"));
  }
  // key -> (manifest, entry) of every piece.
  std::map<std::string, std::vector<std::pair<int, int>>> pieces;
  for (int k = 0; k < static_cast<int>(manifests->size()); ++k) {
    const auto& entries = (*manifests)[k].entries;
    for (int e = 0; e < static_cast<int>(entries.size()); ++e) {
      pieces[entries[e].key].emplace_back(k, e);
    }
  }
  std::map<int, std::string> data;  // manifest -> its data file, once read
  auto data_of = [&](int k) -> absl::StatusOr<const std::string*> {
    auto it = data.find(k);
    if (it != data.end()) return &it->second;
    const Manifest& m = (*manifests)[k];
    auto bytes = fs_->Read(m.data_path);
    if (!bytes.ok()) return CheckpointDataLoss(m.data_path, bytes.status().message());
    if (static_cast<int64_t>(bytes->size()) != m.data_bytes) {
      return CheckpointDataLoss(m.data_path,
                      absl::StrCat("holds ", bytes->size(), " bytes, '",
                                   m.path, "' says ", m.data_bytes));
    }
    if (Crc32(*bytes) != m.data_crc) {
      return CheckpointDataLoss(m.data_path, "checksum mismatch (corrupt)");
    }
    return &data.emplace(k, *std::move(bytes)).first->second;
  };
  // The tensor of `key`'s rows `want`, gathered from the pieces, shaped and
  // typed like `like`; absent (undefined, OK) when no file holds `key` and
  // `optional`.
  auto gather = [&](const Entry& want, const at::Tensor& like,
                    bool optional) -> absl::StatusOr<at::Tensor> {
    auto it = pieces.find(want.key);
    if (it == pieces.end()) {
      if (optional) return at::Tensor();
      return absl::DataLossError(absl::StrCat("checkpoint step ", step, " in '",
                                              StepDir(step), "' holds no '",
                                              want.key, "'"));
    }
    std::vector<std::pair<int, int>> sorted = it->second;
    std::sort(sorted.begin(), sorted.end(), [&](auto a, auto b) {
      return (*manifests)[a.first].entries[a.second].rows.begin <
             (*manifests)[b.first].entries[b.second].rows.begin;
    });
    std::vector<at::Tensor> parts;
    int64_t at_row = want.rows.begin;
    for (const auto& [k, ei] : sorted) {
      if (at_row >= want.rows.end) break;
      const Entry& e = (*manifests)[k].entries[ei];
      const std::string& path = (*manifests)[k].path;
      if (e.rows.end <= at_row || e.rows.begin > at_row) continue;
      const c10::ScalarType dtype = *DTypeNamed(e.dtype);
      const std::vector<int64_t> like_dims = DimsOf(like);
      const bool dims_agree =
          e.dims.size() == like_dims.size() &&
          std::equal(e.dims.begin() + (e.dims.empty() ? 0 : 1), e.dims.end(),
                     like_dims.begin() + (like_dims.empty() ? 0 : 1));
      if (dtype != like.scalar_type() || !dims_agree ||
          e.total_rows != want.total_rows) {
        return absl::InvalidArgumentError(absl::StrCat(
            "checkpoint file '", path, "': '", e.key, "' is ", e.dtype, " ",
            CheckpointDims(e.dims), " of ", e.total_rows, " rows; the stage needs ",
            c10::toString(like.scalar_type()), " ", CheckpointDims(like_dims),
            " of ", want.total_rows));
      }
      auto bytes = data_of(k);
      if (!bytes.ok()) return bytes.status();
      at::Tensor piece = torch::empty(e.dims, torch::dtype(dtype));
      std::memcpy(piece.data_ptr(), (*bytes)->data() + e.offset, e.bytes);
      const int64_t take = std::min(want.rows.end, e.rows.end) - at_row;
      if (!e.dims.empty() &&
          (at_row != e.rows.begin || take != e.rows.size())) {
        piece = piece.narrow(0, at_row - e.rows.begin, take);
      }
      parts.push_back(piece);
      at_row += take;
    }
    if (at_row < want.rows.end) {
      return absl::DataLossError(absl::StrCat(
          "checkpoint step ", step, " in '", StepDir(step), "' lacks rows [",
          at_row, ", ", want.rows.end, ") of '", want.key, "'"));
    }
    return parts.size() == 1 ? parts[0].contiguous() : torch::cat(parts, 0);
  };

  StageCheckpoint& c = *into;
  const Manifest& first = manifests->front();
  c.step = step;
  c.version = first.version;
  for (const Manifest& m : *manifests) {
    if (m.slots != c.optimizer.slot_names) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint file '", m.path, "' holds optimizer slots {",
          absl::StrJoin(m.slots, ", "), "}, the stage's optimizer keeps {",
          absl::StrJoin(c.optimizer.slot_names, ", "), "}"));
    }
    if (m.version != first.version ||
        m.optimizer_steps != first.optimizer_steps) {
      return CheckpointDataLoss(m.path, absl::StrCat("version ", m.version,
                                           " / optimizer_steps ",
                                           m.optimizer_steps, " but '",
                                           first.path, "' says ",
                                           first.version, " / ",
                                           first.optimizer_steps));
    }
  }
  try {
    torch::NoGradGuard no_grad;
    const std::vector<std::string> slots = c.optimizer.slot_names;
    std::vector<std::vector<at::Tensor>> per_param(c.parameters.size());
    size_t with_state = 0;
    for (size_t i = 0; i < c.parameters.size(); ++i) {
      const std::string& name = c.parameter_names[i];
      auto want = KeyOf(std::string(kParam), name, c.parameters[i]);
      if (!want.ok()) return want.status();
      auto p = gather(*want, c.parameters[i], /*optional=*/false);
      if (!p.ok()) return p.status();
      c.parameters[i] = p->set_requires_grad(true);
      bool all = true;
      for (const std::string& slot : slots) {
        auto w = KeyOf(slot, name, c.parameters[i]);
        if (!w.ok()) return w.status();
        auto t = gather(*w, c.parameters[i], /*optional=*/true);
        if (!t.ok()) return t.status();
        all = all && t->defined();
        per_param[i].push_back(*t);
      }
      if (all && !slots.empty()) ++with_state;
    }
    if (with_state != 0 && with_state != c.parameters.size()) {
      return absl::DataLossError(absl::StrCat(
          "checkpoint step ", step, " in '", StepDir(step),
          "' holds optimizer state for ", with_state, " of the stage's ",
          c.parameters.size(), " parameters"));
    }
    c.optimizer.steps = first.optimizer_steps;
    if (with_state == 0) per_param.clear();
    c.optimizer.per_param = std::move(per_param);
    for (auto& [name, b] : c.buffers) {
      auto want = KeyOf(std::string(kBuffer), name, b);
      if (!want.ok()) return want.status();
      auto t = gather(*want, b, /*optional=*/false);
      if (!t.ok()) return t.status();
      b = *t;
    }
  } catch (const std::exception& e) {
    return absl::DataLossError(absl::StrCat("loading checkpoint step ", step,
                                            " from '", StepDir(step),
                                            "' failed: ", e.what()));
  }
  return absl::OkStatus();
}

absl::Status FileCheckpointStore::RemoveStep(int64_t step) const {
  const std::string dir = StepDir(step);
  auto names = fs_->List(dir);
  if (!names.ok()) return names.status();
  for (const std::string& name : *names) {
    if (absl::Status st = fs_->Remove(absl::StrCat(dir, "/", name)); !st.ok()) {
      return st;
    }
  }
  // Best effort: another stage may be pruning the same step.
  fs_->Remove(dir).IgnoreError();
  return absl::OkStatus();
}

absl::Status FileCheckpointStore::RemoveStepsAfter(int64_t step) {
  auto steps = Steps();
  if (!steps.ok()) return steps.status();
  for (int64_t s : *steps) {
    if (s > step) {
      if (absl::Status st = RemoveStep(s); !st.ok()) return st;
    }
  }
  return absl::OkStatus();
}

// ---- CheckpointWriter ----

namespace {
int64_t ThreadCpuNanos() {
  timespec ts;
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0;
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}
}  // namespace

CheckpointWriter::CheckpointWriter(CheckpointStore* store, int stage)
    : store_(store), stage_(stage), thread_([this] { Loop(); }) {}

CheckpointWriter::~CheckpointWriter() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

absl::Status CheckpointWriter::Submit(StageCheckpoint snapshot) {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(this, &CheckpointWriter::Idle));
  if (!error_.ok()) return error_;
  pending_ = std::move(snapshot);
  return absl::OkStatus();
}

absl::Status CheckpointWriter::Wait() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(this, &CheckpointWriter::Idle));
  return error_;
}

void CheckpointWriter::Loop() {
  absl::MutexLock lock(&mu_);
  while (true) {
    mu_.Await(absl::Condition(this, &CheckpointWriter::HasWork));
    if (!pending_.has_value()) return;  // stopped, nothing left to write
    StageCheckpoint c = *std::move(pending_);
    pending_.reset();
    writing_ = true;
    mu_.Unlock();
    absl::Status st;
    const int64_t cpu_before = ThreadCpuNanos();
    try {
      st = store_->Save(stage_, c);
    } catch (const std::exception& e) {
      st = absl::InternalError(absl::StrCat("writing checkpoint step ", c.step,
                                            " failed: ", e.what()));
    }
    const int64_t step = c.step;
    c = StageCheckpoint();  // free the snapshot before reporting idle
    write_cpu_ns_.fetch_add(ThreadCpuNanos() - cpu_before, std::memory_order_relaxed);
    if (st.ok()) written_step_.store(step, std::memory_order_release);
    mu_.Lock();
    writing_ = false;
    if (!st.ok() && error_.ok()) error_ = st;
  }
}

}  // namespace apapo::worker

#include "worker/checkpoint_manifest.h"

#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace apapo::worker {

std::optional<int64_t> CheckpointElementSize(absl::string_view dtype) {
  // c10::toString's names; checkpoint_store_test checks them against c10.
  static constexpr std::pair<absl::string_view, int64_t> kSizes[] = {
      {"Float", 4}, {"Double", 8}, {"Half", 2}, {"BFloat16", 2},
      {"Long", 8},  {"Int", 4},    {"Byte", 1}, {"Bool", 1}};
  for (const auto& [name, size] : kSizes) {
    if (dtype == name) return size;
  }
  return std::nullopt;
}

int64_t CheckpointRows(const std::vector<int64_t>& dims) {
  return dims.empty() ? 1 : dims[0];
}

std::string CheckpointDims(const std::vector<int64_t>& dims) {
  return dims.empty() ? "-" : absl::StrJoin(dims, "x");
}

absl::Status CheckpointDataLoss(const std::string& path, absl::string_view what) {
  return absl::DataLossError(absl::StrCat("checkpoint file '", path, "': ", what));
}

absl::StatusOr<CheckpointManifest> ParseCheckpointManifest(
    const std::string& path, const std::string& dir, absl::string_view text) {
  CheckpointManifest m;
  m.path = path;
  std::vector<absl::string_view> lines = absl::StrSplit(text, '\n');
  if (lines.empty() || lines[0] != kCheckpointMagic) {
    return CheckpointDataLoss(path, absl::StrCat("not a manifest (no '", kCheckpointMagic,
                                       "' line)"));
  }
  bool ended = false;
  std::set<std::string> seen;
  for (size_t i = 1; i < lines.size(); ++i) {
    if (lines[i].empty()) continue;
    if (ended) return CheckpointDataLoss(path, "text after 'end'");
    std::vector<absl::string_view> f =
        absl::StrSplit(lines[i], ' ', absl::SkipEmpty());
    if (f.empty()) continue;  // a line of spaces
    const std::string line_no = absl::StrCat("line ", i + 1, ": ");
    auto bad = [&](absl::string_view why) {
      return CheckpointDataLoss(path, absl::StrCat(line_no, why, ": '", lines[i], "'"));
    };
    auto int_at = [&](size_t k, int64_t* out) {
      return k < f.size() && absl::SimpleAtoi(f[k], out);
    };
    if (f[0] == "end") {
      ended = true;
    } else if (f[0] == "step") {
      if (!int_at(1, &m.step)) return bad("bad step");
    } else if (f[0] == "version") {
      if (!int_at(1, &m.version)) return bad("bad version");
    } else if (f[0] == "stage") {
      int64_t s;
      if (!int_at(1, &s)) return bad("bad stage");
    } else if (f[0] == "optimizer_steps") {
      if (!int_at(1, &m.optimizer_steps)) return bad("bad optimizer_steps");
    } else if (f[0] == "slots") {
      for (size_t k = 1; k < f.size(); ++k) m.slots.emplace_back(f[k]);
    } else if (f[0] == "data") {
      uint32_t crc;
      if (f.size() != 4 || absl::StrContains(f[1], '/') ||
          !absl::SimpleAtoi(f[2], &m.data_bytes) || m.data_bytes < 0 ||
          !absl::SimpleAtoi(f[3], &crc)) {
        return bad("bad data record");
      }
      m.data_path = absl::StrCat(dir, "/", f[1]);
      m.data_crc = crc;
    } else if (f[0] == "tensor") {
      CheckpointEntry e;
      if (f.size() != 9) return bad("a tensor record has 9 fields");
      e.key = std::string(f[1]);
      e.dtype = std::string(f[2]);
      if (!int_at(3, &e.rows.begin) || !int_at(4, &e.rows.end) ||
          !int_at(5, &e.total_rows) || !int_at(6, &e.offset) ||
          !int_at(7, &e.bytes)) {
        return bad("bad number");
      }
      if (f[8] != "-") {
        for (absl::string_view d : absl::StrSplit(f[8], 'x')) {
          int64_t v;
          if (!absl::SimpleAtoi(d, &v) || v < 0) return bad("bad dims");
          e.dims.push_back(v);
        }
      }
      const std::optional<int64_t> element = CheckpointElementSize(e.dtype);
      if (!element.has_value()) return bad("unknown dtype");
      // A hostile or corrupt manifest must not overflow the arithmetic.
      int64_t numel = 1;
      for (int64_t d : e.dims) {
        if (__builtin_mul_overflow(numel, d, &numel)) return bad("dims too large");
      }
      int64_t expected_bytes = 0;
      if (__builtin_mul_overflow(numel, *element,
                                 &expected_bytes)) {
        return bad("dims too large");
      }
      if (e.rows.begin < 0 || e.rows.end < e.rows.begin || e.rows.end > e.total_rows ||
          e.rows.size() != CheckpointRows(e.dims) || e.offset < 0 ||
          e.bytes != expected_bytes) {
        return bad("rows, dims and bytes disagree");
      }
      if (!seen.insert(absl::StrCat(e.key, "@", e.rows.begin)).second) {
        return bad("rows twice");
      }
      m.entries.push_back(std::move(e));
    } else {
      return bad("unknown record");
    }
  }
  if (!ended) return CheckpointDataLoss(path, "truncated (no 'end' line)");
  if (m.data_path.empty()) return CheckpointDataLoss(path, "no data record");
  for (const auto& e : m.entries) {
    if (e.offset > m.data_bytes || e.bytes > m.data_bytes - e.offset) {
      return CheckpointDataLoss(path, absl::StrCat("tensor '", e.key,
                                         "' lies past the data's end"));
    }
  }
  return m;
}

std::string CheckpointManifestText(const CheckpointManifest& m, int stage,
                         absl::string_view data_name) {
  std::string out = absl::StrCat(kCheckpointMagic, "\n");
  absl::StrAppend(&out, "step ", m.step, "\n", "version ", m.version, "\n",
                  "stage ", stage, "\n", "optimizer_steps ",
                  m.optimizer_steps, "\n");
  absl::StrAppend(&out, "slots");
  for (const auto& s : m.slots) absl::StrAppend(&out, " ", s);
  absl::StrAppend(&out, "\n", "data ", data_name, " ", m.data_bytes, " ",
                  m.data_crc, "\n");
  for (const auto& e : m.entries) {
    absl::StrAppend(&out, "tensor ", e.key, " ", e.dtype, " ", e.rows.begin,
                    " ", e.rows.end, " ", e.total_rows, " ", e.offset, " ",
                    e.bytes, " ", CheckpointDims(e.dims), "\n");
  }
  absl::StrAppend(&out, "end\n");
  return out;
}

}  // namespace apapo::worker

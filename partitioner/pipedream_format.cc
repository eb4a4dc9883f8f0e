#include "partitioner/pipedream_format.h"

#include <cmath>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace apapo {
namespace partitioner {
namespace {

absl::Status LineError(absl::string_view file, int line,
                       absl::string_view reason) {
  return absl::InvalidArgumentError(absl::StrCat(file, ":", line, ": ", reason));
}

// Parses a finite, non-negative number.
bool ParseNumber(absl::string_view text, double* out) {
  text = absl::StripAsciiWhitespace(text);
  if (text.empty()) return false;
  if (!absl::SimpleAtod(text, out)) return false;
  return std::isfinite(*out) && *out >= 0;
}

struct PendingEdge {
  std::string from;
  std::string to;
  int line;
};

// Parses "k1=v1, k2=v2, ..." where activation_size may be "[a; b]".
absl::Status ParseMetadata(absl::string_view metadata, absl::string_view file,
                           int line, Node* node) {
  bool have[4] = {false, false, false, false};
  for (absl::string_view field : absl::StrSplit(metadata, ',')) {
    field = absl::StripAsciiWhitespace(field);
    if (field.empty()) continue;
    const size_t eq = field.find('=');
    if (eq == absl::string_view::npos) {
      return LineError(file, line, absl::StrCat("expected key=value, got '",
                                                field, "'"));
    }
    const absl::string_view key = absl::StripAsciiWhitespace(field.substr(0, eq));
    absl::string_view value = absl::StripAsciiWhitespace(field.substr(eq + 1));
    double number = 0;
    int slot = -1;
    if (key == "forward_compute_time") {
      slot = 0;
    } else if (key == "backward_compute_time") {
      slot = 1;
    } else if (key == "activation_size") {
      slot = 2;
    } else if (key == "parameter_size") {
      slot = 3;
    } else {
      return LineError(file, line, absl::StrCat("unknown field '", key, "'"));
    }
    if (have[slot]) {
      return LineError(file, line, absl::StrCat("field '", key, "' repeated"));
    }
    have[slot] = true;
    if (slot == 2 && absl::ConsumePrefix(&value, "[")) {
      if (!absl::ConsumeSuffix(&value, "]")) {
        return LineError(file, line, "activation_size list lacks ']'");
      }
      number = 0;
      for (absl::string_view item : absl::StrSplit(value, ';')) {
        double part = 0;
        if (!ParseNumber(item, &part)) {
          return LineError(file, line,
                           absl::StrCat("activation_size entry '",
                                        absl::StripAsciiWhitespace(item),
                                        "' is not a non-negative number"));
        }
        number += part;
      }
    } else if (!ParseNumber(value, &number)) {
      return LineError(file, line,
                       absl::StrCat(key, " '", value,
                                    "' is not a finite non-negative number"));
    }
    switch (slot) {
      case 0:
        node->forward_seconds = number / 1000.0;
        break;
      case 1:
        node->backward_seconds = number / 1000.0;
        break;
      case 2:
        node->activation_bytes = number;
        break;
      case 3:
        node->parameter_bytes = number;
        break;
    }
  }
  static const char* const kNames[] = {"forward_compute_time",
                                       "backward_compute_time",
                                       "activation_size", "parameter_size"};
  for (int i = 0; i < 4; ++i) {
    if (!have[i]) {
      return LineError(file, line, absl::StrCat("missing field ", kNames[i]));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Graph> ParsePipeDreamGraph(absl::string_view text,
                                          absl::string_view filename) {
  Graph graph;
  std::vector<PendingEdge> edges;
  int line_number = 0;
  for (absl::string_view raw : absl::StrSplit(text, '\n')) {
    ++line_number;
    absl::string_view line = absl::StripSuffix(raw, "\r");
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    if (line.find('\0') != absl::string_view::npos) {
      return LineError(filename, line_number, "NUL byte in line");
    }
    if (line[0] == '\t') {
      std::vector<absl::string_view> parts =
          absl::StrSplit(absl::StripAsciiWhitespace(line), " -- ");
      if (parts.size() != 2 || parts[0].empty() || parts[1].empty()) {
        return LineError(filename, line_number,
                         "edge line must be '<TAB>nodeA -- nodeB'");
      }
      edges.push_back(PendingEdge{std::string(parts[0]), std::string(parts[1]),
                                  line_number});
      continue;
    }
    std::vector<absl::string_view> parts =
        absl::StrSplit(absl::StripAsciiWhitespace(line), " -- ");
    if (parts.size() < 3) {
      return LineError(filename, line_number,
                       "node line must be 'id -- description -- metrics'");
    }
    // An optional trailing "stage_id=K"; the metrics are the field before it.
    size_t metrics = parts.size() - 1;
    if (absl::StartsWith(parts[metrics], "stage_id=")) {
      int stage = 0;
      if (!absl::SimpleAtoi(parts[metrics].substr(9), &stage) || stage < 0) {
        return LineError(filename, line_number,
                         absl::StrCat("bad stage_id '", parts[metrics], "'"));
      }
      --metrics;
    }
    if (metrics < 2) {
      return LineError(filename, line_number, "node line lacks metrics");
    }
    Node node;
    node.id = std::string(absl::StripAsciiWhitespace(parts[0]));
    if (node.id.empty()) {
      return LineError(filename, line_number, "empty node id");
    }
    // Descriptions may themselves contain " -- "; rejoin the middle.
    std::vector<absl::string_view> desc(parts.begin() + 1,
                                        parts.begin() + metrics);
    node.description = absl::StrJoin(desc, " -- ");
    node.line = line_number;
    if (absl::Status s =
            ParseMetadata(parts[metrics], filename, line_number, &node);
        !s.ok()) {
      return s;
    }
    if (graph.FindNode(node.id) >= 0) {
      return LineError(filename, line_number,
                       absl::StrCat("duplicate node '", node.id,
                                    "' (first defined on line ",
                                    graph.node(graph.FindNode(node.id)).line,
                                    ")"));
    }
    graph.AddNode(std::move(node));
  }
  for (const PendingEdge& e : edges) {
    const int from = graph.FindNode(e.from);
    const int to = graph.FindNode(e.to);
    if (from < 0 || to < 0) {
      return LineError(filename, e.line,
                       absl::StrCat("dangling edge: no node '",
                                    from < 0 ? e.from : e.to, "'"));
    }
    if (absl::Status s = graph.AddEdge(from, to, e.line); !s.ok()) {
      return LineError(filename, e.line, s.message());
    }
  }
  int error_line = 0;
  if (absl::Status s = graph.Validate(&error_line); !s.ok()) {
    return LineError(filename, error_line, s.message());
  }
  return graph;
}

absl::StatusOr<Graph> ReadPipeDreamGraph(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(path, ":0: cannot open file"));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  return ParsePipeDreamGraph(buffer.str(), path);
}

std::string FormatPipeDreamGraph(const Graph& graph) {
  std::string out;
  for (const Node& n : graph.nodes()) {
    absl::StrAppendFormat(
        &out,
        "%s -- %s -- forward_compute_time=%.6f, backward_compute_time=%.6f, "
        "activation_size=%.1f, parameter_size=%.1f\n",
        n.id, n.description, n.forward_seconds * 1000.0,
        n.backward_seconds * 1000.0, n.activation_bytes, n.parameter_bytes);
  }
  for (const Edge& e : graph.edges()) {
    absl::StrAppend(&out, "\t", graph.node(e.from).id, " -- ",
                    graph.node(e.to).id, "\n");
  }
  return out;
}

}  // namespace partitioner
}  // namespace apapo

#include "worker/torchscript_model.h"

#include <ATen/CPUGeneratorImpl.h>
#include <sys/stat.h>
#include <torch/script.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <map>
#include <sstream>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "worker/confined_files.h"

namespace apapo {
namespace worker {
namespace {

using apapo::v1::LayerNode;
using apapo::v1::ModelGraph;

std::vector<int64_t> WithBatch(int64_t batch, const Shape& s) {
  std::vector<int64_t> out{batch};
  out.insert(out.end(), s.begin(), s.end());
  return out;
}

// The first line of a LibTorch error, without the C++ backtrace.
std::string Cause(const std::exception& e) {
  const auto* c10 = dynamic_cast<const c10::Error*>(&e);
  std::string msg = c10 ? c10->what_without_backtrace() : e.what();
  absl::StripTrailingAsciiWhitespace(&msg);
  return msg;
}

absl::StatusOr<torch::jit::Module> LoadModule(const std::string& path) {
  // Opened beneath its data root and read through that descriptor, so what
  // is loaded is what was checked (confined_files.h); a module is at most
  // 4 GiB.
  auto bytes = ReadFileConfined(path, "TorchScript file", int64_t{4} << 30);
  if (!bytes.ok()) return bytes.status();
  try {
    std::istringstream in(*std::move(bytes));
    return torch::jit::load(in, c10::Device(c10::kCPU));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot load TorchScript file '", path, "': ", Cause(e)));
  }
}

std::string TypeName(const torch::jit::Module& m, bool qualified) {
  const auto& name = m.type()->name();
  if (!name.has_value()) return "<unnamed>";
  return qualified ? name->qualifiedName() : name->name();
}

// Node ids: "child<i>" for Sequential's numeric names, else the child's name
// (unless it would collide with the input or the loss).
std::string ChildId(const std::string& name, int index) {
  if (name.empty() || name == "input" || name == "loss" ||
      std::all_of(name.begin(), name.end(),
                  [](char c) { return absl::ascii_isdigit(c); })) {
    return absl::StrCat("child", index);
  }
  return name;
}

absl::StatusOr<DType> DTypeOf(const at::Tensor& t) {
  if (t.scalar_type() == at::kFloat) return DType::kFloat32;
  if (t.scalar_type() == at::kLong) return DType::kInt64;
  return absl::InvalidArgumentError(absl::StrCat(
      "produces ", c10::toString(t.scalar_type()),
      " tensors; only float32 and int64 can cross stages"));
}

absl::StatusOr<ModelGraph> BuildGraph(const apapo::v1::TorchScriptModel& model,
                                      const DataShape& data,
                                      torch::jit::Module& module) {
  const std::string& path = model.path();
  auto fail = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("TorchScript file '", path, "': ", why));
  };
  const std::string type = TypeName(module, /*qualified=*/true);
  if (!absl::StrContains(type, "Sequential")) {
    return fail(absl::StrCat(
        "the top-level module is ", type,
        ", not a torch.nn.Sequential; only a sequential module can be "
        "partitioned by its children"));
  }
  if (module.named_parameters(/*recurse=*/false).size() > 0) {
    return fail("the top-level module has parameters outside its children");
  }
  std::vector<std::pair<std::string, torch::jit::Module>> children;
  for (const auto& c : module.named_children()) {
    children.emplace_back(c.name, c.value);
  }
  if (children.empty()) return fail("the sequential module has no children");

  module.eval();
  torch::NoGradGuard no_grad;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(7);
  const at::Tensor x0 =
      data.sample_dtype == DType::kInt64
          ? torch::zeros(WithBatch(2, data.sample_shape), torch::kLong)
          : torch::randn(WithBatch(2, data.sample_shape), gen);

  ModelGraph g;
  std::string base = path.substr(path.find_last_of('/') + 1);
  g.set_name(absl::StrCat("torchscript:", base));
  LayerNode* input = g.add_nodes();
  input->set_id("input");
  input->set_kind(apapo::v1::LAYER_KIND_INPUT);
  for (int64_t d : data.sample_shape) {
    (*input->mutable_attrs())["shape"].mutable_ints()->add_values(d);
  }
  (*input->mutable_attrs())["dtype"].set_s(std::string(DTypeName(data.sample_dtype)));

  at::Tensor x = x0;
  std::string prev = "input";
  for (size_t i = 0; i < children.size(); ++i) {
    torch::jit::Module& child = children[i].second;
    const std::string what = absl::StrCat(
        "child ", i, " ('", children[i].first, "', ", TypeName(child, false), ")");
    auto forward = child.find_method("forward");
    if (!forward.has_value()) return fail(absl::StrCat(what, " has no forward"));
    // arguments() includes self.
    if (forward->function().getSchema().arguments().size() != 2) {
      return fail(absl::StrCat(
          what, "'s forward takes ",
          forward->function().getSchema().arguments().size() - 1,
          " arguments; children must take one tensor"));
    }
    c10::IValue out;
    try {
      out = child.forward({x});
    } catch (const std::exception& e) {
      return fail(absl::StrCat(what, " fails on a ", c10::str(x.sizes()),
                               " batch: ", Cause(e)));
    }
    if (!out.isTensor()) {
      return fail(absl::StrCat(what, " returns ", out.tagKind(),
                               ", not a tensor"));
    }
    at::Tensor y = out.toTensor();
    if (y.dim() < 1 || y.size(0) != x.size(0)) {
      return fail(absl::StrCat(what, " maps a ", c10::str(x.sizes()),
                               " batch to ", c10::str(y.sizes()),
                               "; the batch dimension must be kept"));
    }
    auto dtype = DTypeOf(y);
    if (!dtype.ok()) return fail(absl::StrCat(what, " ", dtype.status().message()));

    LayerNode* n = g.add_nodes();
    n->set_id(ChildId(children[i].first, static_cast<int>(i)));
    n->set_kind(apapo::v1::LAYER_KIND_TORCHSCRIPT_CHILD);
    n->add_inputs(prev);
    n->set_description(TypeName(child, false));
    auto& attrs = *n->mutable_attrs();
    attrs["path"].set_s(path);
    attrs["index"].set_i(static_cast<int64_t>(i));
    auto* out_shape = attrs["out_shape"].mutable_ints();
    for (int64_t d = 1; d < y.dim(); ++d) out_shape->add_values(y.size(d));
    attrs["dtype"].set_s(std::string(DTypeName(*dtype)));
    std::vector<std::string> names;
    auto* shapes = attrs["param_shapes"].mutable_ints();
    for (const auto& p : child.named_parameters(/*recurse=*/true)) {
      if (absl::StrContains(p.name, ',')) {
        return fail(absl::StrCat(what, " has a parameter named '", p.name, "'"));
      }
      names.push_back(p.name);
      shapes->add_values(p.value.dim());
      for (int64_t d : p.value.sizes()) shapes->add_values(d);
    }
    attrs["param_names"].set_s(absl::StrJoin(names, ","));
    prev = n->id();
    x = y;
  }

  // The children chained must be what the module computes.
  try {
    c10::IValue whole = module.forward({x0});
    if (!whole.isTensor() || whole.toTensor().sizes() != x.sizes() ||
        !torch::allclose(whole.toTensor().to(at::kDouble), x.to(at::kDouble),
                         1e-4, 1e-5)) {
      return fail(
          "its forward() is not the chain of its children, so it cannot be "
          "partitioned by them");
    }
  } catch (const std::exception& e) {
    return fail(absl::StrCat("its forward() fails on a ",
                             c10::str(x0.sizes()), " batch: ", Cause(e)));
  }
  if (x.scalar_type() != at::kFloat || x.dim() < 2) {
    return fail(absl::StrCat("the last child must produce float logits per "
                             "sample, got ", c10::toString(x.scalar_type()),
                             " ", c10::str(x.sizes())));
  }
  if (data.num_classes > 0 && x.size(-1) < data.num_classes) {
    return fail(absl::StrCat("the last child produces ", x.size(-1),
                             " logits per prediction, fewer than the data's ",
                             data.num_classes, " classes"));
  }
  LayerNode* loss = g.add_nodes();
  loss->set_id("loss");
  loss->set_kind(apapo::v1::LAYER_KIND_CROSS_ENTROPY_LOSS);
  loss->add_inputs(prev);
  return g;
}

}  // namespace

absl::StatusOr<ModelGraph> TorchScriptGraph(
    const apapo::v1::TorchScriptModel& model, const DataShape& data) {
  if (model.path().empty()) {
    return absl::InvalidArgumentError(
        "spec.model.torchscript.path: must not be empty");
  }
  const Shape input(model.input_shape().begin(), model.input_shape().end());
  if (input != data.sample_shape) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.model.torchscript.input_shape ", ShapeToString(input),
        " does not match the data's sample shape ",
        ShapeToString(data.sample_shape)));
  }
  auto module = LoadModule(model.path());
  if (!module.ok()) return module.status();
  try {
    return BuildGraph(model, data, *module);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TorchScript file '", model.path(), "': ", Cause(e)));
  }
}

struct TorchScriptChild::Impl {
  torch::jit::Module module;
  // Where each parameter lives: its owning (sub)module and attribute name.
  std::vector<std::pair<torch::jit::Module, std::string>> slots;
  int training = -1;  // the mode last set on the module; -1: not yet
};

TorchScriptChild::TorchScriptChild(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}

TorchScriptChild::~TorchScriptChild() = default;

std::vector<at::Tensor> TorchScriptChild::InitialParameters() const {
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> out;
  for (const auto& [owner, name] : impl_->slots) {
    out.push_back(
        owner.attr(name).toTensor().detach().clone().set_requires_grad(true));
  }
  return out;
}

at::Tensor TorchScriptChild::Forward(const at::Tensor& input,
                                     at::ArrayRef<at::Tensor> params,
                                     bool training) {
  TORCH_CHECK(params.size() == impl_->slots.size(), "got ", params.size(),
              " parameters, the TorchScript child has ", impl_->slots.size());
  // The version's tensors themselves become the parameters, so the autograd
  // graph of this forward references exactly them.
  for (size_t i = 0; i < params.size(); ++i) {
    impl_->slots[i].first.setattr(impl_->slots[i].second, params[i]);
  }
  if (impl_->training != static_cast<int>(training)) {
    impl_->module.train(training);
    impl_->training = training;
  }
  c10::IValue out = impl_->module.forward({input});
  TORCH_CHECK(out.isTensor(), "the TorchScript child returned ",
              out.tagKind(), ", not a tensor");
  return out.toTensor();
}

std::vector<std::pair<std::string, at::Tensor>> TorchScriptChild::Buffers()
    const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& b : impl_->module.named_buffers(/*recurse=*/true)) {
    out.emplace_back(b.name, b.value);
  }
  return out;
}

absl::StatusOr<std::vector<std::unique_ptr<TorchScriptChild>>>
LoadTorchScriptChildren(const std::vector<const NodeInfo*>& nodes) {
  std::map<std::string, std::vector<torch::jit::Module>> files;
  std::vector<std::unique_ptr<TorchScriptChild>> out;
  try {
    for (const NodeInfo* info : nodes) {
      const auto& attrs = info->node->attrs();
      const std::string path =
          attrs.count("path") ? attrs.at("path").s() : std::string();
      const int64_t index = attrs.count("index") ? attrs.at("index").i() : -1;
      auto it = files.find(path);
      if (it == files.end()) {
        auto module = LoadModule(path);
        if (!module.ok()) {
          return absl::Status(module.status().code(),
                              absl::StrCat("node '", info->id(), "': ",
                                           module.status().message()));
        }
        std::vector<torch::jit::Module> children;
        for (const auto& c : module->named_children()) children.push_back(c.value);
        it = files.emplace(path, std::move(children)).first;
      }
      auto changed = [&](const std::string& why) {
        return absl::FailedPreconditionError(absl::StrCat(
            "node '", info->id(), "': TorchScript file '", path, "' ", why,
            "; it changed after the graph was built"));
      };
      if (index < 0 || index >= static_cast<int64_t>(it->second.size())) {
        return changed(absl::StrCat("has no child ", index));
      }
      auto impl = std::make_unique<TorchScriptChild::Impl>();
      impl->module = it->second[index];
      std::vector<std::pair<std::string, at::Tensor>> params;
      for (const auto& p : impl->module.named_parameters(/*recurse=*/true)) {
        params.emplace_back(p.name, p.value);
      }
      if (params.size() != info->params.size()) {
        return changed(absl::StrCat("child ", index, " has ", params.size(),
                                    " parameters, the graph ",
                                    info->params.size()));
      }
      for (size_t i = 0; i < params.size(); ++i) {
        const ParamInfo& want = info->params[i];
        if (params[i].first != want.name ||
            params[i].second.sizes() != at::IntArrayRef(want.shape)) {
          return changed(absl::StrCat(
              "child ", index, " has parameter '", params[i].first, "' ",
              c10::str(params[i].second.sizes()), ", the graph '", want.name,
              "' ", ShapeToString(want.shape)));
        }
        std::vector<std::string> parts = absl::StrSplit(params[i].first, '.');
        torch::jit::Module owner = impl->module;
        for (size_t k = 0; k + 1 < parts.size(); ++k) {
          owner = owner.attr(parts[k]).toModule();
        }
        impl->slots.emplace_back(owner, parts.back());
      }
      out.push_back(std::unique_ptr<TorchScriptChild>(
          new TorchScriptChild(std::move(impl))));
    }
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("loading TorchScript children: ", Cause(e)));
  }
  return out;
}

}  // namespace worker
}  // namespace apapo

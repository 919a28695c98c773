// torch_metallib._C.register_op: installs a MetallibKernel as an operator's CPU and MPS kernel.
#include <pybind11/stl.h>
#include <torch/csrc/Dtype.h>
#include <torch/library.h>

#include "bindings.h"
#include "bindings/python_values.h"
#include "ops/metallib_op.h"

namespace py = pybind11;

namespace torch_metallib::bindings {
namespace {

using ops::ArgumentSource;
using ops::RuleOp;
using ops::SizeRule;

// Keeps an operator's kernel registered while it lives.
struct OpRegistration {
  std::vector<std::unique_ptr<torch::Library>> libraries;  // one per dispatch key
};

c10::ScalarType dtype_of(const py::handle& value) {
  if (!THPDtype_Check(value.ptr())) throw py::type_error("expected a torch.dtype");
  return reinterpret_cast<THPDtype*>(value.ptr())->scalar_type;
}

// Any Python int (too large for its argument fails when packed, as for lib.kernel calls).
dispatch::Number number_of(const py::handle& value) {
  dispatch::Number number;
  if (!read_number(value, number)) throw py::type_error("expected a number");
  return number;
}

// (text, [(op, a, b), ...]) from torch_metallib.ops; the token stack must stay shallow
// and end with one value, which Python's rule builder guarantees and this re-checks.
SizeRule rule_of(const py::handle& value) {
  auto pair = value.cast<py::tuple>();
  SizeRule rule;
  rule.text = pair[0].cast<std::string>();
  int depth = 0;
  for (const py::handle& item : pair[1]) {
    auto token = item.cast<std::tuple<int, int64_t, int64_t>>();
    auto op = RuleOp(std::get<0>(token));
    depth += int(op) < int(RuleOp::Add) ? 1 : -1;  // leaves push, binary operations pop one
    if (depth < 1 || depth > 16) throw py::value_error("malformed size rule: " + rule.text);
    rule.tokens.push_back({op, std::get<1>(token), std::get<2>(token)});
  }
  if (depth != 1) throw py::value_error("malformed size rule: " + rule.text);
  return rule;
}

// (bytes, [(offset, type name, path, "number" | "rule" | "input", value)]) from
// torch_metallib.ops (_structs.py): numbers are packed now, the rest at each call. Every
// field lies inside the bytes and has a scalar type, which Python checked and this re-checks.
void packed_of(const py::tuple& packed, ArgumentSource& source) {
  const auto bytes = packed[0].cast<int64_t>();
  if (bytes < 0 || bytes > (int64_t(1) << 20)) throw py::value_error("packed argument: bad size");
  source.packed.assign(size_t(bytes), 0);
  for (const py::handle& item : packed[1]) {
    auto f = item.cast<py::tuple>();
    ops::PackedField field;
    field.offset = f[0].cast<int64_t>();
    field.type = dispatch::find_metal_type(f[1].cast<std::string>());
    field.path = f[2].cast<std::string>();
    if (field.type == nullptr || field.offset < 0 || field.offset + field.type->element_bytes > bytes) {
      throw py::value_error("packed argument: field " + field.path + " does not fit");
    }
    const std::string kind = f[3].cast<std::string>();
    if (kind == "number") {
      const dispatch::PackProblem problem =
          dispatch::pack_number(*field.type, number_of(f[4]), source.packed.data() + field.offset);
      if (problem != dispatch::PackProblem::None)
        throw py::value_error("packed argument: " + field.path + " does not fit its type");
      continue;
    }
    if (kind == "input")
      field.input = f[4].cast<int>();
    else
      field.rule = rule_of(f[4]);
    source.fields.push_back(std::move(field));
  }
}

std::unique_ptr<ops::DtypeKernel> kernel_of(const py::dict& k) {
  auto kernel = std::make_unique<ops::DtypeKernel>();
  kernel->dtype = dtype_of(k["dtype"]);
  kernel->spec = &k["spec"].cast<const dispatch::KernelSpec&>();
  kernel->index = k["index"].cast<int>();
  kernel->cooperative = k["cooperative"].cast<bool>();
  kernel->serial = k["serial"].cast<bool>();
  for (const py::handle& item : k["sources"]) {
    auto s = item.cast<py::tuple>();
    ArgumentSource source;
    std::string kind = s[0].cast<std::string>();
    source.kind = kind == "input"    ? ArgumentSource::Kind::Input
                  : kind == "output" ? ArgumentSource::Kind::Output
                  : kind == "rule"   ? ArgumentSource::Kind::Rule
                  : kind == "packed" ? ArgumentSource::Kind::Packed
                                     : ArgumentSource::Kind::Number;
    source.position = s[1].cast<int>();
    if (kind == "input" || kind == "output") source.index = s[2].cast<int>();
    if (kind == "rule") source.rule = rule_of(s[2]);
    if (kind == "number") source.number = number_of(s[2]);
    if (kind == "packed") packed_of(s[2].cast<py::tuple>(), source);
    kernel->sources.push_back(std::move(source));
  }
  for (const py::handle& item : k["constants"]) {
    auto c = item.cast<py::tuple>();
    ops::ConstantSource constant;
    constant.slot = c[0].cast<size_t>();
    std::string kind = c[1].cast<std::string>();
    constant.is_rule = kind == "rule";
    if (kind == "input")
      constant.input = c[2].cast<int>();
    else if (constant.is_rule)
      constant.rule = rule_of(c[2]);
    else
      constant.number = number_of(c[2]);
    kernel->constants.push_back(std::move(constant));
  }
  for (const py::handle& item : k["threadgroup"]) {
    auto t = item.cast<py::tuple>();
    kernel->threadgroup.emplace_back(t[0].cast<int>(), rule_of(t[1]));
  }
  return kernel;
}

}  // namespace

void bind_ops(py::module_& m) {
  py::class_<OpRegistration>(m, "OpRegistration");

  m.def(
      "register_op",
      [](const std::string& name, const std::vector<std::string>& argument_names,
         const std::vector<bool>& argument_mutable, int dispatch_argument, const py::list& kernels,
         const py::list& outputs, const py::list& threads, const py::list& group, py::object compile,
         py::object run_on_backend, bool checked) {
        auto spec = std::make_shared<ops::OpSpec>();
        spec->name = name;
        spec->argument_names = argument_names;
        spec->argument_mutable = argument_mutable;
        spec->dispatch_argument = dispatch_argument;
        for (const py::handle& k : kernels) spec->kernels.push_back(kernel_of(k.cast<py::dict>()));
        for (const py::handle& item : outputs) {
          auto o = item.cast<py::dict>();
          ops::OutputRule rule;
          rule.mutated = o["mutated"].cast<int>();
          rule.shape_like = o["shape_like"].cast<int>();
          for (const py::handle& extent : o["shape"]) rule.shape.push_back(rule_of(extent));
          rule.dtype_like = o["dtype_like"].cast<int>();
          if (!o["dtype"].is_none()) rule.dtype = dtype_of(o["dtype"]);
          spec->outputs.push_back(std::move(rule));
        }
        for (const py::handle& rule : threads) spec->threads.push_back(rule_of(rule));
        for (const py::handle& rule : group) spec->group.push_back(rule_of(rule));
        spec->compile = std::move(compile);
        spec->run_on_backend = std::move(run_on_backend);
        spec->checked = checked;
        size_t split = name.find("::");
        auto registration = std::make_unique<OpRegistration>();
        for (c10::DispatchKey key : {c10::DispatchKey::CPU, c10::DispatchKey::MPS, c10::DispatchKey::CUDA}) {
          auto library =
              std::make_unique<torch::Library>(torch::Library::IMPL, name.substr(0, split), key, __FILE__, __LINE__);
          library->impl(name.substr(split + 2).c_str(),
                        torch::CppFunction::makeFromBoxedFunctor(std::make_unique<ops::MetallibKernel>(spec)));
          registration->libraries.push_back(std::move(library));
        }
        return registration;
      },
      py::arg("name"), py::arg("argument_names"), py::arg("argument_mutable"), py::arg("dispatch_argument"),
      py::arg("kernels"), py::arg("outputs"), py::arg("threads"), py::arg("group"), py::arg("compile"),
      py::arg("run_on_backend"), py::arg("checked") = false,
      "Registers the CPU, MPS and CUDA kernels of operator `name` (defined already): CPU runs natively (checked "
      "calls, and MPS and CUDA, through `run_on_backend`); `checked`: every call runs checked; unregistered when "
      "the result is dropped.");
}

}  // namespace torch_metallib::bindings

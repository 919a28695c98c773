#include "dispatch/binding_plan.h"
#include "dispatch/command_list.h"
#include "dispatch/python_values.h"

#include <torch/csrc/autograd/python_variable.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

namespace py = pybind11;

namespace torch_metallib::dispatch {
namespace {

constexpr int64_t kMetalMaxThreadsPerGroup = 1024;
constexpr int64_t kMetalMaxThreadgroupBytes = 32768;  // Apple GPUs' threadgroup memory
constexpr int64_t kMetalMaxGroupDim[3] = {1024, 1024, 64};

}  // namespace

std::string python_type(const py::handle& value) { return Py_TYPE(value.ptr())->tp_name; }

std::string short_repr(const py::handle& value) {
  std::string text = py::repr(value).cast<std::string>();
  return text.size() > 60 ? text.substr(0, 57) + "..." : text;
}

bool is_tensor(const py::handle& value) { return THPVariable_Check(value.ptr()); }

bool is_sequence(const py::handle& value) {
  return PyList_Check(value.ptr()) || PyTuple_Check(value.ptr());
}

bool is_bytes(const py::handle& value) {
  return PyBytes_Check(value.ptr()) || PyByteArray_Check(value.ptr()) || PyMemoryView_Check(value.ptr());
}

int64_t available_bytes(const at::Tensor& tensor) {
  return int64_t(tensor.storage().nbytes()) - tensor.storage_offset() * int64_t(tensor.element_size());
}

Span view_span(const at::Tensor& tensor) {
  if (tensor.numel() == 0) return {};
  int64_t low = 0, high = 0;  // elements from the first one, below and above it
  for (int64_t d = 0; d < tensor.dim(); ++d) {
    const int64_t reach = (tensor.sizes()[size_t(d)] - 1) * tensor.strides()[size_t(d)];
    (reach < 0 ? low : high) += reach;
  }
  const int64_t item = int64_t(tensor.element_size());
  return {low * item, (high - low + 1) * item, false};
}

Span storage_span(const at::Tensor& tensor) {
  return {-int64_t(tensor.storage_offset()) * int64_t(tensor.element_size()), int64_t(tensor.storage().nbytes()), true};
}

bool Plan::storage_bounded(int position) const {
  return size_t(position) < storage_bounds.size() && storage_bounds[size_t(position)];
}

Span Plan::span(int position) const {
  const ParameterBinding& binding = bindings[size_t(position)];
  if (binding.kind == ParameterBinding::Kind::Tensor) {
    return storage_bounded(position) ? storage_span(binding.tensor) : view_span(binding.tensor);
  }
  return {0, extents[size_t(position)]};
}

// 8-byte-aligned owned storage for packed values.
std::shared_ptr<std::vector<uint64_t>> allocate(size_t bytes) {
  return std::make_shared<std::vector<uint64_t>>((bytes + 7) / 8 + 1, 0);
}

std::string ArgumentSpec::describe() const {
  // Built with std::to_string, not a stream: an extension's inlined stream code met a
  // system libstdc++ it did not match on one GPU machine (torch 2.11) and crashed.
  if (!description.empty()) return description;
  const std::string head = "argument " + std::to_string(position) + " '" + name + "' (";
  if (kind == "indirect_buffer") {
    return head + "buffer(" + std::to_string(binding) + "), argument buffer " + type_name + ")";
  }
  std::string out = head + (kind == "threadgroup" ? "threadgroup" : "buffer") + "(" + std::to_string(binding) + "), " +
                    address_space + (access == "read" && address_space == "device" ? " const " : " ") + type_name;
  if (buffer_size < 0) {
    out += "*";
  } else if (type_size > 0 && buffer_size > type_size) {
    out += " (&)[" + std::to_string(buffer_size / type_size) + "]";
  } else {
    out += "&";
  }
  return out + ")";
}

KernelSpec::KernelSpec(std::string name, int parameter_count, std::vector<ArgumentSpec> arguments,
                       std::vector<ConstantSpec> constants, int64_t max_threads, int64_t static_threadgroup_bytes,
                       std::vector<std::pair<std::string, ConstantPredicate>> predicates)
    : name_(std::move(name)),
      parameter_count_(parameter_count),
      arguments_(std::move(arguments)),
      constants_(std::move(constants)),
      max_threads_(max_threads > 0 ? max_threads : kMetalMaxThreadsPerGroup),
      static_threadgroup_bytes_(static_threadgroup_bytes),
      predicates_(std::move(predicates)) {
  for (ArgumentSpec& argument : arguments_) argument.type = find_metal_type(argument.type_name);
  for (ConstantSpec& constant : constants_) constant.type = find_metal_type(constant.type_name);
  std::stable_sort(arguments_.begin(), arguments_.end(), [](const ArgumentSpec& a, const ArgumentSpec& b) {
    // Buffer slots first ([[buffer(n)]], argument buffers included), in binding order.
    auto buffer_slot = [](const ArgumentSpec& x) { return x.kind != "buffer" && x.kind != "indirect_buffer"; };
    return std::make_pair(buffer_slot(a), a.binding) < std::make_pair(buffer_slot(b), b.binding);
  });
}

// --- values ---------------------------------------------------------------------------

PackProblem pack_number(const MetalType& type, const Number& value, uint8_t* out) {
  using Kind = Number::Kind;
  if (type.kind == ScalarKind::Float) {
    double real = value.as_double();
    if (value.kind == Kind::Huge && !value.real_ok) return PackProblem::OutOfRange;
    // A finite value that rounds to infinity in the type does not fit it (inf and nan do).
    const bool finite = std::isfinite(real);
    if (type.element_bytes == 4) {
      float v = finite && std::fabs(real) > double(std::numeric_limits<float>::max()) * (1 + 0x1p-25)
                    ? std::numeric_limits<float>::infinity() : float(real);
      if (finite && std::isinf(v)) return PackProblem::OutOfRange;
      std::memcpy(out, &v, 4);
    } else if (type.name.rfind("half", 0) == 0 || type.name == "float16_t") {
      c10::Half v(static_cast<float>(finite ? std::clamp(real, -1e30, 1e30) : real));
      if (finite && std::isinf(float(v))) return PackProblem::OutOfRange;
      std::memcpy(out, &v, 2);
    } else {
      c10::BFloat16 v(static_cast<float>(finite ? std::clamp(real, -3.5e38, 3.5e38) : real));
      if (finite && std::isinf(float(v))) return PackProblem::OutOfRange;
      std::memcpy(out, &v, 2);
    }
    return PackProblem::None;
  }
  if (value.kind == Kind::Float) return PackProblem::FloatForInteger;
  if (type.kind == ScalarKind::Bool) {
    if (value.kind != Kind::Bool && value.kind != Kind::Int) return PackProblem::NotBool;
    if (value.integer != 0 && value.integer != 1) return PackProblem::NotBool;
    out[0] = uint8_t(value.integer);
    return PackProblem::None;
  }
  int bits = type.element_bytes * 8;
  unsigned long long u = 0;
  if (value.kind == Kind::Huge) return PackProblem::OutOfRange;
  if (value.kind == Kind::UInt64) {
    if (type.kind != ScalarKind::Unsigned || bits != 64) return PackProblem::OutOfRange;
    u = value.big;
  } else if (type.kind == ScalarKind::Signed) {
    int64_t v = value.integer;
    if (bits < 64 && (v < -(1LL << (bits - 1)) || v >= (1LL << (bits - 1)))) return PackProblem::OutOfRange;
    u = static_cast<unsigned long long>(v);
  } else {
    int64_t v = value.integer;
    if (v < 0 || (bits < 64 && v >= (1LL << bits))) return PackProblem::OutOfRange;
    u = static_cast<unsigned long long>(v);
  }
  std::memcpy(out, &u, type.element_bytes);  // little-endian: the low bytes
  return PackProblem::None;
}

bool read_number(const py::handle& value, Number& number) {
  py::object held = py::reinterpret_borrow<py::object>(value);
  if (!PyLong_Check(value.ptr()) && !PyFloat_Check(value.ptr())) {
    // numpy's integer scalars (__index__) and floating scalars (__float__); an array
    // whose __index__ refuses is not a number.
    PyObject* converted = PyIndex_Check(value.ptr()) ? PyNumber_Index(value.ptr())
                          : Py_TYPE(value.ptr())->tp_as_number && Py_TYPE(value.ptr())->tp_as_number->nb_float
                              ? PyNumber_Float(value.ptr()) : nullptr;
    if (converted == nullptr) {
      PyErr_Clear();
      return false;
    }
    held = py::reinterpret_steal<py::object>(converted);
  }
  PyObject* object = held.ptr();
  if (PyBool_Check(object)) {
    number = Number::of_bool(object == Py_True);
  } else if (PyFloat_Check(object)) {
    number = Number::of(PyFloat_AsDouble(object));
  } else if (PyLong_Check(object)) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(object, &overflow);
    if (!overflow) {
      number = Number::of(int64_t(v));
      return true;
    }
    unsigned long long u = overflow > 0 ? PyLong_AsUnsignedLongLong(object) : 0;
    if (overflow > 0 && !PyErr_Occurred()) {
      number = Number{Number::Kind::UInt64, 0, u, 0, false};
      return true;
    }
    PyErr_Clear();
    number = Number{Number::Kind::Huge};
    number.real = PyLong_AsDouble(object);
    number.real_ok = !(number.real == -1.0 && PyErr_Occurred());
    PyErr_Clear();
  } else {
    return false;
  }
  return true;
}

py::tuple constants_tuple(const std::vector<ConstantValue>& constants) {
  py::tuple out(constants.size());
  for (size_t i = 0; i < constants.size(); ++i) {
    const auto& c = constants[i];
    out[i] = py::make_tuple(c.index, c.is_float ? py::object(py::float_(c.real)) : py::object(py::int_(c.integer)));
  }
  return out;
}

// "an integer that fits uint" and the like: what `type` wants.
std::string wanted(const MetalType& type) {
  return type.kind == ScalarKind::Float ? "a number within " + type.name + "'s range"
         : type.kind == ScalarKind::Bool ? "a bool" : "an integer that fits " + type.name;
}

// What the caller gave, worded for `problem`: `text` is the value as written.
std::string found(PackProblem problem, const std::string& text) {
  switch (problem) {
    case PackProblem::OutOfRange: return text + ", out of range";
    case PackProblem::FloatForInteger: return "the float " + text;
    default: return text;
  }
}

std::string number_text(const Number& number) {
  switch (number.kind) {
    case Number::Kind::Bool: return number.integer ? "True" : "False";
    case Number::Kind::Int: return std::to_string(number.integer);
    case Number::Kind::UInt64: return std::to_string(number.big);
    default: {
      char text[32];
      std::snprintf(text, sizeof text, "%.17g", number.real);
      return text;
    }
  }
}

void KernelSpec::check_device(Plan& plan, const ArgumentSpec& argument, const at::Tensor& tensor,
                              bool& device_seen) const {
  if (device_seen && tensor.device() != plan.device) {
    throw ArgumentError(name_ + ": " + argument.describe() + ": expected a tensor on " + plan.device.str() +
                        " like the arguments before it, got one on " + tensor.device().str() +
                        ". Move all tensors to one device");
  }
  plan.device = tensor.device();
  device_seen = true;
}

// torch's names of the layouts (no stream: see ArgumentSpec::describe).
static std::string layout_name(c10::Layout layout) {
  switch (layout) {
    case c10::kStrided: return "torch.strided";
    case c10::kSparse: return "torch.sparse_coo";
    case c10::kSparseCsr: return "torch.sparse_csr";
    case c10::kSparseCsc: return "torch.sparse_csc";
    case c10::kSparseBsr: return "torch.sparse_bsr";
    case c10::kSparseBsc: return "torch.sparse_bsc";
    case c10::kMkldnn: return "torch._mkldnn";
    default: return "number " + std::to_string(int(layout));
  }
}

void KernelSpec::check_layout(const ArgumentSpec& argument, const at::Tensor& tensor) const {
  if (tensor.layout() != c10::kStrided) {
    throw ArgumentError(name_ + ": " + argument.describe() + ": expected a dense (strided) tensor, got one with layout " +
                        layout_name(tensor.layout()) + ", whose elements have no address a kernel can use. "
                        "Pass x.to_dense()");
  }
}

void KernelSpec::bind_tensor(Plan& plan, const ArgumentSpec& argument, const at::Tensor& tensor,
                             bool& device_seen) const {
  check_layout(argument, tensor);
  // A 0-d CPU tensor read as a value (of another dtype, or beside tensors on a GPU, as
  // torch takes CPU scalars): its value, converted to the kernel's type.
  const bool beside_gpu_tensors = device_seen && !plan.device.is_cpu() && !plan.device.is_meta();
  if (tensor.dim() == 0 && tensor.device().is_cpu() && !argument.writable() && argument.type != nullptr &&
      (tensor.scalar_type() != argument.type->dtypes.front() || beside_gpu_tensors)) {
    at::Scalar item = tensor.item();
    bind_number(plan, argument, item.isFloatingPoint() ? Number::of(item.toDouble())
                                : item.isBoolean() ? Number::of_bool(item.toBool()) : Number::of(item.toLong()));
    return;
  }
  check_device(plan, argument, tensor, device_seen);
  check_tensor(argument, tensor);
  refuse_overlap(argument, tensor);
  plan.addresses[argument.position] = tensor.data_ptr();
  plan.extents[argument.position] = available_bytes(tensor);
  plan.bindings[argument.position] = {ParameterBinding::Kind::Tensor, argument.binding, tensor, argument.writable()};
}

void KernelSpec::check_tensor(const ArgumentSpec& argument, const at::Tensor& tensor) const {
  auto where = [&] { return name_ + ": " + argument.describe(); };
  if (argument.type != nullptr) {
    const auto& dtypes = argument.type->dtypes;
    if (std::find(dtypes.begin(), dtypes.end(), tensor.scalar_type()) == dtypes.end()) {
      throw ArgumentError(where() + ": expected a tensor of " + dtype_names(*argument.type) + ", got " +
                          torch_dtype_name(tensor.scalar_type()) + ". Convert it with .to(" +
                          torch_dtype_name(dtypes.front()) + ")");
    }
  }
  int64_t bytes = available_bytes(tensor);
  int64_t needed = argument.buffer_size >= 0 ? argument.buffer_size : (argument.type ? 0 : argument.type_size);
  if (bytes < needed) {
    throw DispatchFailure(where() + ": expected at least " + std::to_string(needed) + " bytes, got a tensor with " +
                          std::to_string(bytes) + " bytes from its first element to the end of its storage");
  }
}

// "[64, 1]" (no stream: see ArgumentSpec::describe).
static std::string int_list(c10::IntArrayRef values) {
  std::string out;
  for (int64_t v : values) out += (out.empty() ? "" : ", ") + std::to_string(v);
  return "[" + out + "]";
}

std::string overlap_refusal(const at::Tensor& tensor) {
  // torch's own test (Yes: a stride 0 over more than one element); TooHard passes, as in torch.
  if (at::has_internal_overlap(tensor) != at::MemOverlap::Yes) return "";
  return "expected a tensor whose elements do not overlap, got sizes " + int_list(tensor.sizes()) + " and strides " +
         int_list(tensor.strides()) + ", in which several indices reach one element (torch refuses in-place "
         "writes into such a tensor too). Pass a tensor of its own, e.g. x.clone()";
}

void KernelSpec::refuse_overlap(const ArgumentSpec& argument, const at::Tensor& tensor) const {
  if (!argument.writable()) return;  // reading one element twice is fine
  const std::string problem = overlap_refusal(tensor);
  if (!problem.empty()) throw ArgumentError(name_ + ": " + argument.describe() + ": the kernel writes to it; " + problem);
}

void KernelSpec::bind_number(Plan& plan, const ArgumentSpec& argument, const Number& number) const {
  auto where = [&] { return name_ + ": " + argument.describe(); };
  if (argument.writable()) {
    throw ArgumentError(where() + ": the kernel writes to it; expected a tensor, got " + number_text(number));
  }
  if (argument.type == nullptr || argument.type->components != 1) {
    throw ArgumentError(where() + ": '" + argument.type_name + "' is not a scalar type; expected a tensor, got " +
                        number_text(number));
  }
  auto storage = allocate(size_t(std::max<int64_t>(argument.type_size, argument.type->element_bytes)));
  PackProblem problem = pack_number(*argument.type, number, reinterpret_cast<uint8_t*>(storage->data()));
  if (problem != PackProblem::None) {
    throw ArgumentError(where() + ": expected " + wanted(*argument.type) + ", got " + found(problem, number_text(number)));
  }
  bind_bytes(plan, argument, std::move(storage), argument.type_size, [&] { return number_text(number); });
}

void KernelSpec::bind_absent(Plan& plan, const ArgumentSpec& argument) const {
  // Apple's compiler may load from an argument before the branch that needs it (MLX's
  // GEMM reads its addmm_params even when use_out_source is false); on a GPU an unbound
  // slot reads harmlessly, so here it points at zeros of the argument's size.
  if (argument.kind != "buffer" && argument.kind != "indirect_buffer") return;
  const int64_t bytes = std::max<int64_t>({argument.buffer_size, argument.type_size, 16});
  auto storage = allocate(size_t(bytes));
  plan.addresses[argument.position] = storage->data();
  plan.extents[argument.position] = bytes;
  plan.bindings[argument.position] = {ParameterBinding::Kind::Bytes, argument.binding, {}, false};
  plan.packed.push_back(std::move(storage));
}

void KernelSpec::bind_bytes(Plan& plan, const ArgumentSpec& argument, std::shared_ptr<std::vector<uint64_t>> storage,
                            int64_t bytes, c10::function_ref<std::string()> source) const {
  if (argument.buffer_size >= 0 && bytes < argument.buffer_size) {
    throw DispatchFailure(name_ + ": " + argument.describe() + ": expected " + std::to_string(argument.buffer_size) +
                          " bytes, got " + std::to_string(bytes) + " from " + source());
  }
  plan.addresses[argument.position] = storage->data();
  plan.extents[argument.position] = bytes;
  plan.bindings[argument.position] = {ParameterBinding::Kind::Bytes, argument.binding, {}, false};
  plan.packed.push_back(std::move(storage));
}

void KernelSpec::bind_value(Plan& plan, const ArgumentSpec& argument, const py::handle& value,
                            bool& device_seen) const {
  if (argument.kind == "indirect_buffer") {
    bind_argument_buffer(plan, argument, value, device_seen);
    return;
  }
  auto where = [&] { return name_ + ": " + argument.describe(); };
  if (is_tensor(value)) {
    const at::Tensor& tensor = THPVariable_Unpack(value.ptr());
    if (argument.writable() && tensor.requires_grad() && tensor.is_leaf() && at::GradMode::is_enabled()) {
      throw ArgumentError(where() + ": the kernel writes to it, and it is a leaf tensor that requires grad, "
                          "which torch does not let an operation change in place. Pass a tensor that does not "
                          "require grad, or call under torch.no_grad()");
    }
    bind_tensor(plan, argument, tensor, device_seen);
    return;
  }
  if (py::hasattr(value, "__array_interface__") && py::len(py::getattr(value, "shape")) > 0) {
    throw ArgumentError(where() + ": expected a tensor, got a " + python_type(value) +
                        ". Pass torch.from_numpy(x) (or torch.as_tensor(x))");
  }
  if (argument.writable()) {
    throw ArgumentError(where() + ": the kernel writes to it; expected a tensor, got " + short_repr(value) +
                        " (" + python_type(value) + ")");
  }
  std::shared_ptr<std::vector<uint64_t>> storage;
  int64_t bytes = 0;
  if (is_bytes(value)) {
    Py_buffer view;
    if (PyObject_GetBuffer(value.ptr(), &view, PyBUF_C_CONTIGUOUS) != 0) {
      PyErr_Clear();
      throw ArgumentError(where() + ": expected contiguous bytes, got a non-contiguous " + python_type(value) +
                          ". Pass bytes(view) or view.tobytes()");
    }
    bytes = int64_t(view.len);
    storage = allocate(size_t(bytes));
    std::memcpy(storage->data(), view.buf, size_t(bytes));
    PyBuffer_Release(&view);
  } else if (argument.type == nullptr) {
    throw ArgumentError(where() + ": '" + argument.type_name + "' is not a scalar or vector type; expected a tensor or " +
                        "bytes of its " + std::to_string(argument.type_size) + "-byte layout, got " + short_repr(value));
  } else {
    const MetalType& type = *argument.type;
    std::vector<py::handle> numbers;
    if (is_sequence(value)) {
      for (const py::handle& item : value) numbers.push_back(item);
    } else {
      numbers.push_back(value);
    }
    if (numbers.empty() || numbers.size() % size_t(type.components)) {
      throw ArgumentError(where() + ": expected " + (type.components > 1 ? std::to_string(type.components) +
                          " numbers per " + type.name : std::string("a number or a sequence of numbers")) +
                          ", got " + short_repr(value) +
                          (is_sequence(value) ? " (" + std::to_string(numbers.size()) + " numbers)" : " (one number)"));
    }
    // Each element takes the type's full size: a uint3 is 16 bytes, as Metal lays it out.
    size_t slot = size_t(std::max<int64_t>(argument.type_size, type.element_bytes * type.components));
    size_t count = numbers.size() / size_t(type.components);
    bytes = int64_t(slot * count);
    storage = allocate(size_t(bytes));
    auto* out = reinterpret_cast<uint8_t*>(storage->data());
    for (size_t i = 0; i < numbers.size(); ++i) {
      size_t at = (i / size_t(type.components)) * slot + (i % size_t(type.components)) * size_t(type.element_bytes);
      Number number;
      if (!read_number(numbers[i], number)) {
        throw ArgumentError(where() + ": expected " + wanted(type) + ", got a " + python_type(numbers[i]));
      }
      PackProblem problem = pack_number(type, number, out + at);
      if (problem != PackProblem::None) {
        throw ArgumentError(where() + ": expected " + wanted(type) + ", got " + found(problem, short_repr(numbers[i])));
      }
    }
  }
  bind_bytes(plan, argument, std::move(storage), bytes, [&] { return short_repr(value); });
}

// --- constants ----------------------------------------------------------------------------

std::vector<ConstantValue> KernelSpec::check_constants(const std::vector<std::pair<size_t, Number>>& values) const {
  std::vector<ConstantValue> bound;
  std::vector<bool> seen(constants_.size(), false);
  for (const auto& [slot, value] : values) {
    const ConstantSpec& c = constants_.at(slot);
    if (seen[slot]) throw DispatchFailure(name_ + ": constants: " + c.name + " is given twice (by name and by index)");
    seen[slot] = true;
    if (c.type == nullptr || c.type->components != 1) {
      throw DispatchFailure(name_ + ": function constant " + c.name + " has type " + c.type_name +
                            ", which this backend cannot set");
    }
    uint8_t scratch[8] = {0};
    PackProblem problem = pack_number(*c.type, value, scratch);
    if (problem != PackProblem::None) {
      throw DispatchFailure(name_ + ": function constant " + c.name + " (" + c.type_name + ", index " +
                            std::to_string(c.index) + "): expected " +
                            (c.type->kind == ScalarKind::Bool ? "a bool" : c.type->kind == ScalarKind::Float ? "a number" : "an integer") +
                            ", got " + found(problem, number_text(value)));
    }
    ConstantValue cv{c.index, c.type->kind == ScalarKind::Float, 0, 0.0, c.type};
    std::memcpy(cv.bytes, scratch, sizeof(cv.bytes));
    if (cv.is_float) {
      cv.real = value.as_double();
    } else {
      cv.integer = value.kind == Number::Kind::UInt64 ? int64_t(value.big) : value.integer;
    }
    bound.push_back(cv);
  }
  std::string missing;
  for (size_t i = 0; i < constants_.size(); ++i) {
    if (!seen[i] && constants_[i].required) {
      missing += (missing.empty() ? "" : ", ") + constants_[i].name + " (" + constants_[i].type_name + ", index " +
                 std::to_string(constants_[i].index) + ")";
    }
  }
  if (!missing.empty()) {
    throw DispatchFailure(name_ + ": missing function constants: " + missing +
                          ". Pass them as constants={name: value, ...}");
  }
  std::sort(bound.begin(), bound.end(), [](const ConstantValue& a, const ConstantValue& b) { return a.index < b.index; });
  return bound;
}

namespace {

// Python's constants={name or index: value} as (index into `constants`, value).
std::vector<std::pair<size_t, Number>> read_constants(const std::string& kernel, const std::vector<ConstantSpec>& constants,
                                                      const py::handle& values) {
  std::vector<std::pair<size_t, Number>> read;
  if (values.is_none()) return read;
  if (!PyDict_Check(values.ptr())) {
    throw ArgumentError(kernel + ": constants: expected a dict of name or index -> value, got " + short_repr(values));
  }
  for (const auto& [key, value] : py::reinterpret_borrow<py::dict>(values)) {
    size_t i = 0;
    for (; i < constants.size(); ++i) {
      const ConstantSpec& c = constants[i];
      if ((PyUnicode_Check(key.ptr()) && key.cast<std::string>() == c.name) ||
          (PyLong_Check(key.ptr()) && !PyBool_Check(key.ptr()) && key.cast<int64_t>() == c.index)) break;
    }
    if (i == constants.size()) {
      std::string declared;
      for (const ConstantSpec& c : constants) declared += (declared.empty() ? "" : ", ") + c.name + " (" + std::to_string(c.index) + ")";
      throw DispatchFailure(kernel + ": constants: no function constant " + short_repr(key) + "; expected one of: " +
                            (declared.empty() ? "none (the kernel declares no function constants)" : declared));
    }
    Number number;
    if (!read_number(value, number)) {
      const ConstantSpec& c = constants[i];
      throw DispatchFailure(kernel + ": function constant " + c.name + " (" + c.type_name + ", index " +
                            std::to_string(c.index) + "): expected a number, got a " + python_type(value));
    }
    read.emplace_back(i, number);
  }
  return read;
}

}  // namespace

// --- grid -----------------------------------------------------------------------------------

namespace {

std::vector<int64_t> read_dims(const std::string& kernel, const char* what, const py::handle& value) {
  std::vector<py::handle> items;
  if (PyIndex_Check(value.ptr()) && !PyBool_Check(value.ptr())) {
    items.push_back(value);
  } else if (is_sequence(value)) {
    for (const py::handle& item : value) items.push_back(item);
  }
  bool ok = !items.empty() && items.size() <= 3;
  std::vector<int64_t> dims;
  for (const py::handle& item : items) {
    int overflow = 0;
    long long v = 0;
    if (PyIndex_Check(item.ptr()) && !PyBool_Check(item.ptr())) {  // ints, numpy ints
      py::object index = py::reinterpret_steal<py::object>(PyNumber_Index(item.ptr()));
      if (!index) throw py::error_already_set();
      v = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
    }
    if (overflow || v < 1 || v > int64_t(std::numeric_limits<uint32_t>::max())) ok = false;
    dims.push_back(v);
  }
  if (!ok) {
    throw DispatchFailure(kernel + ": " + what + ": expected a positive int or 1-3 positive ints below 2**32, got " + short_repr(value));
  }
  dims.resize(3, 1);
  return dims;
}

// Python's threadgroup_memory={binding: bytes} as (binding, bytes); sizes that are not
// ints are refused here, the rest in bind_threadgroup_memory.
std::vector<std::pair<int, int64_t>> read_threadgroup_sizes(const std::string& kernel, const py::handle& sizes) {
  std::vector<std::pair<int, int64_t>> read;
  if (sizes.is_none()) return read;
  if (!PyDict_Check(sizes.ptr())) {
    throw ArgumentError(kernel + ": threadgroup_memory: expected a dict of threadgroup index -> bytes, got " +
                        short_repr(sizes));
  }
  for (const auto& [key, value] : py::reinterpret_borrow<py::dict>(sizes)) {
    int overflow = 0;
    long long binding = PyLong_Check(key.ptr()) && !PyBool_Check(key.ptr()) ? PyLong_AsLongLongAndOverflow(key.ptr(), &overflow) : -1;
    if (overflow || binding < 0 || binding > std::numeric_limits<int>::max()) {
      throw DispatchFailure(kernel + ": threadgroup_memory: no threadgroup argument at index " + short_repr(key));
    }
    long long bytes = PyLong_Check(value.ptr()) && !PyBool_Check(value.ptr()) ? PyLong_AsLongLongAndOverflow(value.ptr(), &overflow) : -1;
    if (overflow || bytes <= 0) {
      throw DispatchFailure(kernel + ": threadgroup_memory[" + short_repr(key) +
                            "]: expected a positive multiple of 16 bytes, as Metal requires, got " + short_repr(value));
    }
    read.emplace_back(int(binding), int64_t(bytes));
  }
  return read;
}

}  // namespace

void KernelSpec::bind_grid(Plan& plan, std::vector<int64_t> grid, std::vector<int64_t> group) const {
  grid.resize(3, 1);
  if (group.empty()) group = {std::min(grid[0], max_threads_), 1, 1};
  group.resize(3, 1);
  int64_t total = group[0] * group[1] * group[2];
  if (total > max_threads_ || group[0] > kMetalMaxGroupDim[0] || group[1] > kMetalMaxGroupDim[1] ||
      group[2] > kMetalMaxGroupDim[2]) {
    throw DispatchFailure(name_ + ": group_size: expected at most " + std::to_string(max_threads_) +
                          " threads per threadgroup (at most 1024 x 1024 x 64), got " + std::to_string(group[0]) + " x " +
                          std::to_string(group[1]) + " x " + std::to_string(group[2]));
  }
  uint64_t count = 1;
  for (int axis = 0; axis < 3; ++axis) {
    int64_t groups = (grid[axis] + group[axis] - 1) / group[axis];
    plan.dims[axis] = uint32_t(grid[axis]);
    plan.dims[3 + axis] = uint32_t(group[axis]);
    plan.dims[6 + axis] = uint32_t(groups);
    count *= uint64_t(groups);
  }
  if (count > std::numeric_limits<uint32_t>::max()) {
    throw DispatchFailure(name_ + ": threads / group_size: expected fewer than 2**32 threadgroups, got " +
                          std::to_string(count) + ". Use a larger group_size");
  }
  plan.group_count = count;
}

bool KernelSpec::guard_on(const ArgumentSpec& argument, const std::vector<ConstantValue>& constants) const {
  if (argument.guard.empty()) return true;
  for (const ConstantSpec& c : constants_) {
    if (c.name != argument.guard) continue;
    for (const ConstantValue& v : constants) {
      if (v.index == c.index) return v.integer != 0;
    }
    return false;  // an optional constant that was not set
  }
  for (const auto& [name, predicate] : predicates_) {
    if (name == argument.guard) return predicate.evaluate(constants) != 0;
  }
  return true;  // a derived guard whose expression reflection could not read
}

std::string KernelSpec::left_out_because(const ArgumentSpec& argument) const {
  const bool declared = std::any_of(constants_.begin(), constants_.end(),
                                    [&](const ConstantSpec& c) { return c.name == argument.guard; });
  return declared ? "function constant " + argument.guard + " is false"
                  : argument.guard + " (which the kernel derives from its function constants) is false";
}

void KernelSpec::refuse_unbindable(const std::vector<ConstantValue>& constants) const {
  for (const ArgumentSpec& argument : arguments_) {
    const bool bindable = argument.kind == "buffer" || argument.kind == "threadgroup" || argument.kind == "indirect_buffer";
    if (bindable || !guard_on(argument, constants)) continue;
    std::string because = argument.guard.empty() ? "" : " (present because " + argument.guard + " is true)";
    throw UnsupportedCall(name_ + ": cannot be called: " + argument.describe() + because + " is a " + argument.kind +
                          ", which the binding plan does not bind yet. Run it on a Mac with MPS tensors" +
                          (argument.guard.empty() ? "" : ", or choose constants that leave it out"));
  }
}

Plan KernelSpec::pipeline_plan(const py::handle& constants) const {
  Plan plan;
  plan.constants = check_constants(read_constants(name_, constants_, constants));
  plan.commands = std::make_shared<const CommandList>(command_list(plan, name_));
  return plan;
}

// --- the whole call ---------------------------------------------------------------------

Plan KernelSpec::bind(const py::tuple& args, const py::dict& kwargs, const py::handle& threads,
                      const py::handle& group_size, const py::handle& constants,
                      const py::handle& threadgroup_memory, const py::handle& storage_bounds) const {
  Plan plan;
  plan.addresses.assign(size_t(parameter_count_), nullptr);
  plan.extents.assign(size_t(parameter_count_), 0);
  plan.bindings.assign(size_t(parameter_count_), {});
  plan.constants = check_constants(read_constants(name_, constants_, constants));
  refuse_unbindable(plan.constants);
  auto guard_on = [&](const ArgumentSpec& argument) { return this->guard_on(argument, plan.constants); };
  std::vector<const ArgumentSpec*> active;
  for (const ArgumentSpec& argument : arguments_) {
    if (guard_on(argument) && argument.kind != "threadgroup") active.push_back(&argument);
  }
  std::vector<py::handle> values(arguments_.size());
  auto slot_of = [&](const ArgumentSpec* argument) { return size_t(argument - arguments_.data()); };
  if (size_t(args.size()) > active.size()) {
    std::string names, left_out;
    for (const ArgumentSpec* a : active) names += (names.empty() ? "" : ", ") + a->name;
    for (const ArgumentSpec& a : arguments_) {
      if (!guard_on(a)) left_out += "; " + a.name + " is left out because " + left_out_because(a);
    }
    throw ArgumentError(name_ + ": expected at most " + std::to_string(active.size()) + " arguments (" + names +
                        left_out + "), got " + std::to_string(args.size()));
  }
  for (size_t i = 0; i < size_t(args.size()); ++i) values[slot_of(active[i])] = args[i];
  for (const auto& [key, value] : kwargs) {
    std::string name = key.cast<std::string>();
    auto found = std::find_if(arguments_.begin(), arguments_.end(), [&](const ArgumentSpec& a) { return a.name == name; });
    if (found == arguments_.end()) {
      std::string names;
      for (const ArgumentSpec& a : arguments_) names += (names.empty() ? "" : ", ") + a.name;
      throw ArgumentError(name_ + ": no argument named '" + name + "'; expected one of: " + names);
    }
    if (found->kind == "threadgroup") {
      throw ArgumentError(name_ + ": " + found->describe() + " is threadgroup memory, not a value; set its size with "
                          "threadgroup_memory={" + std::to_string(found->binding) + ": nbytes}");
    }
    size_t slot = slot_of(&*found);
    if (values[slot]) {
      throw ArgumentError(name_ + ": " + found->describe() + " is given twice (by position and by name)");
    }
    values[slot] = value;
  }
  bool device_seen = false;
  int64_t default_threads = -1;
  std::vector<const ArgumentSpec*> empty;  // used arguments given a tensor without elements
  for (size_t slot = 0; slot < arguments_.size(); ++slot) {
    const ArgumentSpec& argument = arguments_[slot];
    if (argument.kind == "threadgroup") continue;  // see bind_threadgroup_memory
    py::handle value = values[slot];
    bool present = value && !value.is_none();
    if (!guard_on(argument)) {
      if (present) {
        const bool declared = std::any_of(constants_.begin(), constants_.end(),
                                          [&](const ConstantSpec& c) { return c.name == argument.guard; });
        throw DispatchFailure(name_ + ": " + argument.describe() + " is left out because " + left_out_because(argument) +
                              (declared ? "; set constants={'" + argument.guard + "': True} or drop it"
                                        : " with these constants; drop it or change the constants it derives from"));
      }
      bind_absent(plan, argument);
      continue;
    }
    if (!present) {
      if (argument.unused) {  // the kernel never reads it
        bind_absent(plan, argument);
        continue;
      }
      throw ArgumentError(name_ + ": missing " + argument.describe() + "; pass it by position or as " + argument.name + "=...");
    }
    bind_value(plan, argument, value, device_seen);
    if (is_tensor(value)) {
      const int64_t numel = THPVariable_Unpack(value.ptr()).numel();
      if (default_threads < 0) default_threads = numel;
      if (numel == 0 && !argument.unused) empty.push_back(&argument);
    }
  }
  bind_threadgroup_memory(plan, read_threadgroup_sizes(name_, threadgroup_memory));
  std::vector<int64_t> grid;
  if (threads.is_none()) {
    if (default_threads < 1) {
      throw DispatchFailure(name_ + ": threads: no tensor argument to take the thread count from" +
                            std::string(default_threads == 0 ? " (the first tensor is empty)" : "") + "; pass threads=N");
    }
    if (default_threads > int64_t(std::numeric_limits<uint32_t>::max())) {
      throw DispatchFailure(name_ + ": threads: the first tensor has " + std::to_string(default_threads) +
                            " elements, more than 2**32 - 1 threads; pass threads=(x, y, z)");
    }
    grid = {default_threads};
  } else {
    grid = read_dims(name_, "threads", threads);
  }
  bind_grid(plan, grid, group_size.is_none() ? std::vector<int64_t>{} : read_dims(name_, "group_size", group_size));
  refuse_empty(plan, empty);
  allow_storage(plan, storage_bounds);
  finish(plan);
  return plan;
}

void KernelSpec::refuse_empty(const Plan& plan, const std::vector<const ArgumentSpec*>& empty) const {
  const uint64_t threads = uint64_t(plan.dims[0]) * plan.dims[1] * plan.dims[2];
  if (threads > 0 && !empty.empty()) {
    throw DispatchFailure(name_ + ": " + empty.front()->describe() + ": expected a tensor with elements, got an "
                          "empty one; the kernel uses this argument, and its " + std::to_string(threads) +
                          " threads would read or write past the tensor. Pass a tensor with elements");
  }
}

Plan KernelSpec::bind_native(const std::vector<NativeArgument>& values, const std::vector<int64_t>& threads,
                             const std::vector<int64_t>& group, const std::vector<std::pair<size_t, Number>>& constants,
                             const std::vector<std::pair<int, int64_t>>& threadgroup_bytes) const {
  Plan plan;
  plan.addresses.assign(size_t(parameter_count_), nullptr);
  plan.extents.assign(size_t(parameter_count_), 0);
  plan.bindings.assign(size_t(parameter_count_), {});
  plan.constants = check_constants(constants);
  refuse_unbindable(plan.constants);
  bool device_seen = false;
  std::vector<const ArgumentSpec*> empty;
  for (const ArgumentSpec& argument : arguments_) {
    if (argument.kind == "threadgroup") continue;
    if (!guard_on(argument, plan.constants)) {
      bind_absent(plan, argument);
      continue;
    }
    const NativeArgument& value = values.at(size_t(argument.position));
    if (argument.kind == "indirect_buffer" && (value.tensor != nullptr || value.has_number)) {
      throw ArgumentError(name_ + ": " + argument.describe() + ": operators cannot bind argument buffers yet; "
                          "call the kernel with a dict of its members instead");
    }
    if (value.tensor != nullptr) {
      bind_tensor(plan, argument, *value.tensor, device_seen);
      if (value.tensor->numel() == 0 && !argument.unused) empty.push_back(&argument);
    } else if (value.has_number) {
      bind_number(plan, argument, value.number);
    } else if (!argument.unused) {
      throw ArgumentError(name_ + ": missing " + argument.describe());
    } else {
      bind_absent(plan, argument);
    }
  }
  bind_threadgroup_memory(plan, threadgroup_bytes);
  for (int64_t extent : threads) {
    if (extent < 1 || extent > int64_t(std::numeric_limits<uint32_t>::max())) {
      throw DispatchFailure(name_ + ": threads: expected 1-3 positive extents below 2**32, got " + std::to_string(extent));
    }
  }
  for (int64_t extent : group) {
    if (extent < 1 || extent > 1024) {
      throw DispatchFailure(name_ + ": group_size: expected extents from 1 to 1024, got " + std::to_string(extent));
    }
  }
  bind_grid(plan, threads, group);
  refuse_empty(plan, empty);
  finish(plan);
  return plan;
}

void KernelSpec::allow_storage(Plan& plan, const py::handle& names) const {
  if (names.is_none()) return;
  std::vector<py::handle> items;
  if (PyUnicode_Check(names.ptr())) {
    items.push_back(names);  // one name
  } else if (py::isinstance<py::iterable>(names)) {
    for (const py::handle& item : names) items.push_back(item);
  } else {
    throw ArgumentError(name_ + ": storage_bounds: expected a set of argument names, got " + short_repr(names) +
                        ". Pass e.g. storage_bounds={'out'}");
  }
  for (const py::handle& item : items) {
    if (!PyUnicode_Check(item.ptr())) {
      throw ArgumentError(name_ + ": storage_bounds: expected argument names, got " + short_repr(item) + " (" +
                          python_type(item) + ") in " + short_repr(names) + ". Pass e.g. storage_bounds={'out'}");
    }
    const std::string name = item.cast<std::string>();
    auto found = std::find_if(arguments_.begin(), arguments_.end(), [&](const ArgumentSpec& a) { return a.name == name; });
    if (found == arguments_.end()) {
      std::string all;
      for (const ArgumentSpec& a : arguments_) all += (all.empty() ? "" : ", ") + a.name;
      throw ArgumentError(name_ + ": storage_bounds: no argument named '" + name + "'; expected one of: " + all);
    }
    plan.storage_bounds.resize(plan.bindings.size(), false);
    plan.storage_bounds[size_t(found->position)] = true;
  }
}

void KernelSpec::finish(Plan& plan) const {
  auto commands = std::make_shared<CommandList>(command_list(plan, name_));
  plan.addresses = cpu_addresses(*commands, plan.addresses.size());
  plan.commands = std::move(commands);
}

void KernelSpec::bind_threadgroup_memory(Plan& plan, const std::vector<std::pair<int, int64_t>>& sizes) const {
  std::vector<const ArgumentSpec*> wanted;
  for (const ArgumentSpec& argument : arguments_) {
    if (argument.kind == "threadgroup") wanted.push_back(&argument);
  }
  for (const auto& [binding, bytes] : sizes) {
    if (std::none_of(wanted.begin(), wanted.end(), [&](const ArgumentSpec* a) { return a->binding == binding; })) {
      std::string slots;
      for (const ArgumentSpec* a : wanted) slots += (slots.empty() ? "" : ", ") + std::to_string(a->binding) + " (" + a->name + ")";
      throw DispatchFailure(name_ + ": threadgroup_memory: no threadgroup argument at index " + std::to_string(binding) +
                            "; expected " + (slots.empty() ? "none (the kernel takes no threadgroup memory)" : slots));
    }
  }
  int64_t total = static_threadgroup_bytes_;
  for (const ArgumentSpec* a : wanted) {
    auto given = std::find_if(sizes.begin(), sizes.end(), [&](const auto& size) { return size.first == a->binding; });
    if (given == sizes.end()) {
      throw DispatchFailure(name_ + ": " + a->describe() + " needs its size: pass threadgroup_memory={" +
                            std::to_string(a->binding) + ": nbytes}");
    }
    int64_t bytes = given->second;
    if (bytes <= 0 || bytes % 16) {
      throw DispatchFailure(name_ + ": threadgroup_memory[" + std::to_string(a->binding) + "] (" + a->name +
                            "): expected a positive multiple of 16 bytes, as Metal requires, got " + std::to_string(bytes));
    }
    // What the kernel's own type says is there: a fixed array or struct (a reference), or
    // at least one element.
    const int64_t declared = std::max<int64_t>(a->buffer_size, a->type_size);
    if (bytes < declared) {
      throw DispatchFailure(name_ + ": threadgroup_memory[" + std::to_string(a->binding) + "] (" + a->name +
                            "): expected at least " + std::to_string(declared) + " bytes, the size of " +
                            a->describe() + " as the kernel declares it, got " + std::to_string(bytes));
    }
    total += bytes;
    plan.threadgroup_buffers.emplace_back(a->position, bytes);
    plan.bindings[size_t(a->position)] = {ParameterBinding::Kind::Threadgroup, a->binding, {}, true};
  }
  if (total > kMetalMaxThreadgroupBytes) {
    throw DispatchFailure(name_ + ": threadgroup memory: expected at most " + std::to_string(kMetalMaxThreadgroupBytes) +
                          " bytes per threadgroup (Apple GPUs), got " + std::to_string(total) + " (" +
                          std::to_string(static_threadgroup_bytes_) + " declared by the kernel)");
  }
}

}  // namespace torch_metallib::dispatch

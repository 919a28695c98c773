// Reading a Python kernel call into native values (python_values.h).
#include "bindings/python_values.h"

#include <torch/csrc/autograd/python_variable.h>

#include <cstring>
#include <limits>

namespace py = pybind11;

namespace torch_metallib::bindings {

using dispatch::ArgumentError;
using dispatch::CallValue;
using dispatch::ConstantSpec;
using dispatch::DispatchFailure;
using dispatch::Number;

namespace {

std::string python_type(const py::handle& value) { return Py_TYPE(value.ptr())->tp_name; }

std::string short_repr(const py::handle& value) {
  std::string text = py::repr(value).cast<std::string>();
  return text.size() > 60 ? text.substr(0, 57) + "..." : text;
}

bool is_sequence(const py::handle& value) {
  return PyList_Check(value.ptr()) || PyTuple_Check(value.ptr());
}

bool is_bytes(const py::handle& value) {
  return PyBytes_Check(value.ptr()) || PyByteArray_Check(value.ptr()) || PyMemoryView_Check(value.ptr());
}


// threads / group_size: an int or 1-3 of them, each from 1 to 2**32 - 1.
c10::SmallVector<int64_t, 3> read_dims(const std::string& kernel, const char* what, const py::handle& value) {
  c10::SmallVector<py::handle, 4> items;
  if (PyIndex_Check(value.ptr()) && !PyBool_Check(value.ptr())) {
    items.push_back(value);
  } else if (is_sequence(value)) {
    for (const py::handle& item : value) items.push_back(item);
  }
  bool ok = !items.empty() && items.size() <= 3;
  c10::SmallVector<int64_t, 3> dims;
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

py::tuple constants_tuple(const std::vector<dispatch::ConstantValue>& constants) {
  py::tuple out(constants.size());
  for (size_t i = 0; i < constants.size(); ++i) {
    const auto& c = constants[i];
    out[i] = py::make_tuple(c.index, c.is_float ? py::object(py::float_(c.real)) : py::object(py::int_(c.integer)));
  }
  return out;
}


std::vector<std::pair<size_t, Number>> read_constants(const dispatch::KernelSpec& spec, const py::handle& values) {
  const std::string& kernel = spec.name();
  const std::vector<ConstantSpec>& constants = spec.constants();
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


CallValue read_value(const py::handle& value) {
  CallValue out;
  PyObject* object = value.ptr();
  if (object == nullptr || object == Py_None) return out;
  if (THPVariable_Check(object)) {
    out.kind = CallValue::Kind::Tensor;
    out.tensor = THPVariable_Unpack(object);
  }
  // Words for messages, made only if a refusal asks (the call's arguments outlive it).
  out.text = [object] { return short_repr(py::handle(object)); };
  out.type_name = Py_TYPE(object)->tp_name;
  if (out.kind == CallValue::Kind::Tensor) return out;
  if (PyLong_Check(object) || PyFloat_Check(object)) {  // the common case first: no attribute lookups
    read_number(value, out.number);
    out.kind = CallValue::Kind::Number;
    return out;
  }
  if (is_sequence(value)) {
    out.kind = CallValue::Kind::Sequence;
    for (const py::handle& item : value) out.items.push_back(read_value(item));
    return out;
  }
  if (PyDict_Check(object)) {
    out.kind = CallValue::Kind::Mapping;
    for (const auto& [key, item] : py::reinterpret_borrow<py::dict>(value)) {
      out.items.push_back(read_value(item));
      out.items.back().key = py::str(key).cast<std::string>();
    }
    return out;
  }
  if (py::hasattr(value, "__array_interface__") && py::len(py::getattr(value, "shape")) > 0) {
    out.kind = CallValue::Kind::Array;
    return out;
  }
  if (is_bytes(value)) {
    Py_buffer view;
    if (PyObject_GetBuffer(object, &view, PyBUF_C_CONTIGUOUS) != 0) {
      PyErr_Clear();
      out.kind = CallValue::Kind::Strided;
      return out;
    }
    out.kind = CallValue::Kind::Bytes;
    out.byte_count = int64_t(view.len);
    out.bytes = dispatch::allocate(size_t(view.len));
    std::memcpy(out.bytes->data(), view.buf, size_t(view.len));
    PyBuffer_Release(&view);
    return out;
  }
  out.kind = read_number(value, out.number) ? CallValue::Kind::Number : CallValue::Kind::Other;
  return out;
}

dispatch::CallArguments read_call(const dispatch::KernelSpec& spec, const py::tuple& args, const py::dict& kwargs,
                                  const py::handle& threads, const py::handle& group_size, const py::handle& constants,
                                  const py::handle& threadgroup_memory, const py::handle& storage_bounds) {
  const std::string& kernel = spec.name();
  dispatch::CallArguments call;
  call.constants = read_constants(spec, constants);
  for (const py::handle& item : args) call.positional.push_back(read_value(item));
  for (const auto& [key, item] : kwargs) call.named.emplace_back(key.cast<std::string>(), read_value(item));
  call.threadgroup_memory = read_threadgroup_sizes(kernel, threadgroup_memory);
  if (!threads.is_none()) call.threads = read_dims(kernel, "threads", threads);
  if (!group_size.is_none()) call.group = read_dims(kernel, "group_size", group_size);
  if (storage_bounds.is_none()) return call;
  std::vector<py::handle> items;
  if (PyUnicode_Check(storage_bounds.ptr())) {
    items.push_back(storage_bounds);  // one name
  } else if (py::isinstance<py::iterable>(storage_bounds)) {
    for (const py::handle& item : storage_bounds) items.push_back(item);
  } else {
    throw ArgumentError(kernel + ": storage_bounds: expected a set of argument names, got " + short_repr(storage_bounds) +
                        ". Pass e.g. storage_bounds={'out'}");
  }
  for (const py::handle& item : items) {
    if (!PyUnicode_Check(item.ptr())) {
      throw ArgumentError(kernel + ": storage_bounds: expected argument names, got " + short_repr(item) + " (" +
                          python_type(item) + ") in " + short_repr(storage_bounds) + ". Pass e.g. storage_bounds={'out'}");
    }
    call.storage_bounds.push_back(item.cast<std::string>());
  }
  return call;
}

dispatch::ConstantPredicate read_predicate(const py::handle& node) {
  auto items = py::reinterpret_borrow<py::sequence>(node);
  if (items.size() < 3) throw std::invalid_argument("a predicate node has at least 3 elements");
  const std::string kind = items[0].cast<std::string>();
  const int bits = items[1].cast<int>();
  int64_t literal = 0;
  std::string name;
  size_t first = 2;  // where the operands start
  if (kind == "int" || kind == "const" || kind == "defined") {
    literal = items[2].cast<int64_t>();
    first = 3;
  } else if (kind == "icmp") {
    name = items[2].cast<std::string>();
    first = 3;
  } else if (kind == "zext" || kind == "sext" || kind == "trunc") {
    literal = items[2].cast<int>();
    first = 3;
  }
  std::vector<dispatch::ConstantPredicate> operands;
  for (size_t i = first; i < items.size(); ++i) operands.push_back(read_predicate(items[i]));
  return dispatch::ConstantPredicate::node(kind, bits, literal, std::move(name), std::move(operands));
}

}  // namespace torch_metallib::bindings

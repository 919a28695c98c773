#include "cpu/bounds_check.h"
#include "cpu/cooperative.h"
#include "cuda/driver_api.h"
#include "dispatch/binding_plan.h"
#include "metallib/format_error.h"

#include "bindings.h"
#include "bindings/python_errors.h"

namespace py = pybind11;

namespace torch_metallib::bindings {
namespace {

// Messages can quote file bytes (names, tags) that are not UTF-8; never fail on them.
py::str lenient_str(const std::string& text) {
  PyObject* decoded = PyUnicode_DecodeUTF8(text.data(), Py_ssize_t(text.size()), "backslashreplace");
  if (decoded == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(decoded);
}

void raise(const char* name, const std::string& message) {
  py::object cls = py::module_::import("torch_metallib.errors").attr(name);
  PyErr_SetObject(cls.ptr(), cls(lenient_str(message)).ptr());
}

}  // namespace

void throw_python_error(const char* class_name, const std::string& message) {
  py::gil_scoped_acquire gil;
  raise(class_name, message);
  throw py::error_already_set();
}

void bind_errors(py::module_& m) {
  (void)m;
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const metallib::FormatError& e) {
      // The Python class lives in torch_metallib.errors so users can import and catch it
      // without the native module; it carries the byte offset and field as attributes.
      py::object cls = py::module_::import("torch_metallib.errors").attr("MetallibFormatError");
      py::object error = cls(lenient_str(e.what()), py::arg("offset") = e.offset(),
                             py::arg("field") = lenient_str(e.field()));
      PyErr_SetObject(cls.ptr(), error.ptr());
    } catch (const dispatch::ArgumentError& e) {
      raise("KernelArgumentError", e.what());
    } catch (const dispatch::DispatchFailure& e) {
      raise("DispatchError", e.what());
    } catch (const dispatch::UnsupportedCall& e) {
      raise("UnsupportedKernelError", e.what());
    } catch (const cpu::ExecutionError& e) {
      raise("KernelExecutionError", e.what());
    } catch (const cuda::DriverError& e) {
      raise("KernelExecutionError", e.what());
    } catch (const cpu::MemoryViolation& e) {
      raise("KernelMemoryError", e.what());
    }
  });
}

}  // namespace torch_metallib::bindings

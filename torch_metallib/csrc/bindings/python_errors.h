// Raising torch_metallib's Python exception types from native code that pybind11's
// translators do not cover (operator kernels run inside torch's dispatcher).
#pragma once

#include <string>

namespace torch_metallib::bindings {

// Sets torch_metallib.errors.<class_name>(message) as the Python error and throws
// pybind11::error_already_set. Takes the GIL itself.
[[noreturn]] void throw_python_error(const char* class_name, const std::string& message);

}  // namespace torch_metallib::bindings

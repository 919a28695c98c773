// Entry points that register each native concept with the Python module.
#pragma once

#include <pybind11/pybind11.h>

namespace torch_metallib::bindings {

// Maps C++ exceptions to torch_metallib's Python exception types.
void bind_errors(pybind11::module_& m);

// torch_metallib._C.Container, parse() and pack().
void bind_container(pybind11::module_& m);

// torch_metallib._C.KernelSpec, Plan and launch_cpu.
void bind_dispatch(pybind11::module_& m);

// torch_metallib._C.call, Launchers, CpuLauncher: calls that stay native (call_bindings.cpp).
void bind_calls(pybind11::module_& m);

// torch_metallib._C.register_op: metallib kernels as torch.library operators.
void bind_ops(pybind11::module_& m);

// torch_metallib._C.parse_bitcode_guarded (guard_bindings.cpp).
void bind_guard(pybind11::module_& m);

}  // namespace torch_metallib::bindings

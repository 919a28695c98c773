// torch_metallib._C: the native module. Each concept binds itself from its own file.
#include <torch/extension.h>  // type casters for tensors; loads before pybind11

#include "bindings/bindings.h"
#ifdef __APPLE__
#include "mps/mps_bindings.h"  // csrc/mps is built on macOS only
#endif

PYBIND11_MODULE(_C, m) {
  m.doc() = "torch_metallib native core";
  torch_metallib::bindings::bind_errors(m);
  torch_metallib::bindings::bind_container(m);
  torch_metallib::bindings::bind_dispatch(m);
  torch_metallib::bindings::bind_calls(m);
  torch_metallib::bindings::bind_ops(m);
  torch_metallib::bindings::bind_guard(m);
#ifdef __APPLE__
  torch_metallib::mps::register_metal_backend(m);
#endif
}

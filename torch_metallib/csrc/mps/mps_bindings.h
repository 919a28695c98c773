// The Metal backend's Python face: torch_metallib._C.MetalLibrary on a Mac
// (torch_metallib/backends/mps_backend.py drives it); tests/metal_sim registers the same in its module.
#pragma once

#include <pybind11/pybind11.h>

namespace torch_metallib::mps {

void register_metal_backend(pybind11::module_& m);

}  // namespace torch_metallib::mps

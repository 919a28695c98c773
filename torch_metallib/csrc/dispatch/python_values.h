// Helpers the binding plan's files share for reading Python values and wording errors
// about them (defined in binding_plan.cpp).
#pragma once

#include <pybind11/pybind11.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dispatch/binding_plan.h"

namespace torch_metallib::dispatch {

std::string python_type(const pybind11::handle& value);
std::string short_repr(const pybind11::handle& value);  // repr, cut to 60 characters
bool is_tensor(const pybind11::handle& value);
bool is_sequence(const pybind11::handle& value);         // list or tuple
bool is_bytes(const pybind11::handle& value);            // bytes, bytearray or memoryview
// 8-byte-aligned owned storage for packed values, zeroed.
std::shared_ptr<std::vector<uint64_t>> allocate(size_t bytes);
std::string wanted(const MetalType& type);               // "an integer that fits uint", ...
std::string found(PackProblem problem, const std::string& text);
std::string number_text(const Number& number);

}  // namespace torch_metallib::dispatch

// Python values read into the plain native ones the core takes (dispatch/call_values.h),
// and the core's values handed back to Python. The only place the binding plan's inputs
// meet Python.
#pragma once

#include <pybind11/pybind11.h>

#include <string>
#include <vector>

#include "dispatch/binding_plan.h"

namespace torch_metallib::bindings {

// Python number -> Number; false if `value` is not a number (ints of any kind, numpy's
// too through __index__, floats and bools).
bool read_number(const pybind11::handle& value, dispatch::Number& number);

// One argument's value as the caller wrote it.
dispatch::CallValue read_value(const pybind11::handle& value);

// A whole kernel call (KernelFunction.__call__'s arguments); refuses malformed threads,
// group_size, constants, threadgroup_memory and storage_bounds with the kernel's name.
dispatch::CallArguments read_call(const dispatch::KernelSpec& spec, const pybind11::tuple& args,
                                  const pybind11::dict& kwargs, const pybind11::handle& threads,
                                  const pybind11::handle& group_size, const pybind11::handle& constants,
                                  const pybind11::handle& threadgroup_memory, const pybind11::handle& storage_bounds);

// constants={name or index: value} as (index into spec.constants(), value).
std::vector<std::pair<size_t, dispatch::Number>> read_constants(const dispatch::KernelSpec& spec,
                                                                const pybind11::handle& values);

// A derived guard from reflection's nested-list form (reflection/constant_predicates.py).
dispatch::ConstantPredicate read_predicate(const pybind11::handle& node);

// (index, value) pairs of bound constants, as Python sees them (the JIT cache key).
pybind11::tuple constants_tuple(const std::vector<dispatch::ConstantValue>& constants);

}  // namespace torch_metallib::bindings

// Metal scalar and vector types as kernels name them (air.arg_type_name), with what a
// tensor or Python value bound to them must be.
#pragma once

#include <c10/core/ScalarType.h>

#include <string>
#include <vector>

namespace torch_metallib::dispatch {

enum class ScalarKind { Float, Signed, Unsigned, Bool };

struct MetalType {
  std::string name;  // "float", "uint3", "bfloat"
  ScalarKind kind;
  int element_bytes;                    // bytes of one component
  int components;                       // 1 for scalars, 2-4 for vectors
  std::vector<c10::ScalarType> dtypes;  // tensor dtypes accepted, preferred first
};

// The type named `name` ("float", "uint", "half4", "int64_t", ...), nullptr if it is not
// a plain scalar or vector type (structs, templates, decltype spellings).
const MetalType* find_metal_type(const std::string& name);

// "torch.float32" for ScalarType::Float, and so on.
std::string torch_dtype_name(c10::ScalarType dtype);

// Human-readable list of `type`'s accepted dtypes, e.g. "torch.int32 or torch.uint32".
std::string dtype_names(const MetalType& type);

}  // namespace torch_metallib::dispatch

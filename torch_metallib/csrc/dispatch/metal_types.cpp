#include "dispatch/metal_types.h"

#include <c10/core/ScalarType.h>

#include <unordered_map>

namespace torch_metallib::dispatch {
namespace {

using c10::ScalarType;

struct Scalar {
  const char* name;
  ScalarKind kind;
  int bytes;
  std::vector<ScalarType> dtypes;
};

// Unsigned Metal types also accept the signed torch dtype of the same width: torch has
// few kernels for uint16/32/64, and the bits are what the GPU reads.
const std::vector<Scalar>& scalars() {
  static const std::vector<Scalar> table = {
      {"float", ScalarKind::Float, 4, {ScalarType::Float}},
      {"half", ScalarKind::Float, 2, {ScalarType::Half}},
      {"bfloat", ScalarKind::Float, 2, {ScalarType::BFloat16}},
      {"bool", ScalarKind::Bool, 1, {ScalarType::Bool}},
      {"char", ScalarKind::Signed, 1, {ScalarType::Char}},
      {"uchar", ScalarKind::Unsigned, 1, {ScalarType::Byte}},
      {"short", ScalarKind::Signed, 2, {ScalarType::Short}},
      {"ushort", ScalarKind::Unsigned, 2, {ScalarType::UInt16, ScalarType::Short}},
      {"int", ScalarKind::Signed, 4, {ScalarType::Int}},
      {"uint", ScalarKind::Unsigned, 4, {ScalarType::UInt32, ScalarType::Int}},
      {"long", ScalarKind::Signed, 8, {ScalarType::Long}},
      {"ulong", ScalarKind::Unsigned, 8, {ScalarType::UInt64, ScalarType::Long}},
  };
  return table;
}

// Other spellings kernels use for the same scalar types.
const std::unordered_map<std::string, std::string>& aliases() {
  static const std::unordered_map<std::string, std::string> table = {
      {"int8_t", "char"},     {"uint8_t", "uchar"},     {"int16_t", "short"},       {"uint16_t", "ushort"},
      {"int32_t", "int"},     {"uint32_t", "uint"},     {"int64_t", "long"},        {"uint64_t", "ulong"},
      {"size_t", "ulong"},    {"unsigned int", "uint"}, {"float16_t", "half"},      {"bfloat16_t", "bfloat"},
      {"float32_t", "float"}, {"signed char", "char"},  {"unsigned char", "uchar"},
  };
  return table;
}

std::unordered_map<std::string, MetalType> build_table() {
  std::unordered_map<std::string, MetalType> table;
  for (const Scalar& s : scalars()) {
    table.emplace(s.name, MetalType{s.name, s.kind, s.bytes, 1, s.dtypes});
    for (int n = 2; n <= 4; ++n) {
      std::string vector = std::string(s.name) + std::to_string(n);
      table.emplace(vector, MetalType{vector, s.kind, s.bytes, n, s.dtypes});
    }
  }
  for (const auto& [alias, name] : aliases()) table.emplace(alias, table.at(name));
  return table;
}

}  // namespace

const MetalType* find_metal_type(const std::string& name) {
  static const std::unordered_map<std::string, MetalType> table = build_table();
  auto found = table.find(name);
  return found == table.end() ? nullptr : &found->second;
}

std::string torch_dtype_name(c10::ScalarType dtype) {
  switch (dtype) {
    case ScalarType::Float: return "torch.float32";
    case ScalarType::Double: return "torch.float64";
    case ScalarType::Half: return "torch.float16";
    case ScalarType::BFloat16: return "torch.bfloat16";
    case ScalarType::Bool: return "torch.bool";
    case ScalarType::Char: return "torch.int8";
    case ScalarType::Byte: return "torch.uint8";
    case ScalarType::Short: return "torch.int16";
    case ScalarType::UInt16: return "torch.uint16";
    case ScalarType::Int: return "torch.int32";
    case ScalarType::UInt32: return "torch.uint32";
    case ScalarType::Long: return "torch.int64";
    case ScalarType::UInt64: return "torch.uint64";
    case ScalarType::ComplexFloat: return "torch.complex64";
    default: return std::string("torch.") + c10::toString(dtype);
  }
}

std::string dtype_names(const MetalType& type) {
  std::string names;
  for (size_t i = 0; i < type.dtypes.size(); ++i) {
    if (i > 0) names += " or ";
    names += torch_dtype_name(type.dtypes[i]);
  }
  return names;
}

}  // namespace torch_metallib::dispatch

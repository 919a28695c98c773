#include "dispatch/numbers.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

namespace torch_metallib::dispatch {

// 8-byte-aligned owned storage for packed values.
std::shared_ptr<std::vector<uint64_t>> allocate(size_t bytes) {
  return std::make_shared<std::vector<uint64_t>>((bytes + 7) / 8 + 1, 0);
}

PackProblem pack_number(const MetalType& type, const Number& value, uint8_t* out) {
  using Kind = Number::Kind;
  if (type.kind == ScalarKind::Float) {
    double real = value.as_double();
    if (value.kind == Kind::Huge && !value.real_ok) return PackProblem::OutOfRange;
    // A finite value that rounds to infinity in the type does not fit it (inf and nan do).
    const bool finite = std::isfinite(real);
    if (type.element_bytes == 4) {
      float v = finite && std::fabs(real) > double(std::numeric_limits<float>::max()) * (1 + 0x1p-25)
                    ? std::numeric_limits<float>::infinity()
                    : float(real);
      if (finite && std::isinf(v)) return PackProblem::OutOfRange;
      std::memcpy(out, &v, 4);
    } else if (type.name.rfind("half", 0) == 0 || type.name == "float16_t") {
      c10::Half v(static_cast<float>(finite ? std::clamp(real, -1e30, 1e30) : real));
      if (finite && std::isinf(float(v))) return PackProblem::OutOfRange;
      std::memcpy(out, &v, 2);
    } else {
      c10::BFloat16 v(static_cast<float>(finite ? std::clamp(real, -3.5e38, 3.5e38) : real));
      if (finite && std::isinf(float(v))) return PackProblem::OutOfRange;
      std::memcpy(out, &v, 2);
    }
    return PackProblem::None;
  }
  if (value.kind == Kind::Float) return PackProblem::FloatForInteger;
  if (type.kind == ScalarKind::Bool) {
    if (value.kind != Kind::Bool && value.kind != Kind::Int) return PackProblem::NotBool;
    if (value.integer != 0 && value.integer != 1) return PackProblem::NotBool;
    out[0] = uint8_t(value.integer);
    return PackProblem::None;
  }
  int bits = type.element_bytes * 8;
  unsigned long long u = 0;
  if (value.kind == Kind::Huge) return PackProblem::OutOfRange;
  if (value.kind == Kind::UInt64) {
    if (type.kind != ScalarKind::Unsigned || bits != 64) return PackProblem::OutOfRange;
    u = value.big;
  } else if (type.kind == ScalarKind::Signed) {
    int64_t v = value.integer;
    if (bits < 64 && (v < -(1LL << (bits - 1)) || v >= (1LL << (bits - 1)))) return PackProblem::OutOfRange;
    u = static_cast<unsigned long long>(v);
  } else {
    int64_t v = value.integer;
    if (v < 0 || (bits < 64 && v >= (1LL << bits))) return PackProblem::OutOfRange;
    u = static_cast<unsigned long long>(v);
  }
  std::memcpy(out, &u, type.element_bytes);  // little-endian: the low bytes
  return PackProblem::None;
}

// "an integer that fits uint" and the like: what `type` wants.
std::string wanted(const MetalType& type) {
  return type.kind == ScalarKind::Float  ? "a number within " + type.name + "'s range"
         : type.kind == ScalarKind::Bool ? "a bool"
                                         : "an integer that fits " + type.name;
}

// What the caller gave, worded for `problem`: `text` is the value as written.
std::string found(PackProblem problem, const std::string& text) {
  switch (problem) {
    case PackProblem::OutOfRange: return text + ", out of range";
    case PackProblem::FloatForInteger: return "the float " + text;
    default: return text;
  }
}

std::string number_text(const Number& number) {
  switch (number.kind) {
    case Number::Kind::Bool: return number.integer ? "True" : "False";
    case Number::Kind::Int: return std::to_string(number.integer);
    case Number::Kind::UInt64: return std::to_string(number.big);
    default: {
      char text[32];
      std::snprintf(text, sizeof text, "%.17g", number.real);
      return text;
    }
  }
}

}  // namespace torch_metallib::dispatch

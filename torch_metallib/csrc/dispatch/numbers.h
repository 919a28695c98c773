// Numbers as callers give them (a Python int or float, an operator's scalar argument) and
// how they are packed as Metal scalar types, with the words messages use for them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dispatch/metal_types.h"

namespace torch_metallib::dispatch {

// A number as a caller gave it, before it is packed as a Metal type.
struct Number {
  enum class Kind { Bool, Int, UInt64, Huge, Float } kind = Kind::Int;
  int64_t integer = 0;  // Bool, Int
  uint64_t big = 0;     // UInt64: above INT64_MAX
  double real = 0;      // Float; Huge: the nearest double if real_ok
  bool real_ok = false;
  static Number of(int64_t v) { return {Kind::Int, v}; }
  static Number of(double v) { return {Kind::Float, 0, 0, v, true}; }
  static Number of_bool(bool v) { return {Kind::Bool, v ? 1 : 0}; }
  // The value as a double (for float types; Huge: the nearest double).
  double as_double() const {
    return kind == Kind::Float || kind == Kind::Huge ? real : kind == Kind::UInt64 ? double(big) : double(integer);
  }
};

// Why a Number does not fit a Metal type; the caller words the message.
enum class PackProblem { None, OutOfRange, FloatForInteger, NotBool };

// Writes `value` as one component of `type` at `out`.
PackProblem pack_number(const MetalType& type, const Number& value, uint8_t* out);

// 8-byte-aligned owned storage for packed values, zeroed.
std::shared_ptr<std::vector<uint64_t>> allocate(size_t bytes);

std::string wanted(const MetalType& type);                        // "an integer that fits uint", ...
std::string found(PackProblem problem, const std::string& text);  // "5000000000, out of range", ...
std::string number_text(const Number& number);                    // "3", "True", "0.5"

}  // namespace torch_metallib::dispatch

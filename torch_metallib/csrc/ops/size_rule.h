// An integer rule over an operator's arguments: a tensor's numel, size, stride or dim, an
// int or bool argument, constants, and arithmetic. torch_metallib.ops writes rules in
// Python (ops.size("x", -1) // 4) and hands them over as postfix tokens, so each call
// evaluates them without Python.
#pragma once

#include <ATen/core/ivalue.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <string>
#include <vector>

namespace torch_metallib::ops {

enum class RuleOp : int {
  Constant = 0,  // a
  Numel = 1,     // of argument a
  Size = 2,      // of argument a, dimension b (negative counts from the end)
  Stride = 3,    // of argument a, dimension b
  Dim = 4,       // of argument a
  Argument = 5,  // the int or bool argument a
  Present = 6,   // 1 if optional argument a is given, else 0
  Add = 10,
  Sub,
  Mul,
  FloorDiv,
  Mod,
  Min,
  Max,
  Eq,
  Ne,
  Lt,
  Le,
  Gt,
  Ge,
};

struct RuleToken {
  RuleOp op;
  int64_t a = 0;
  int64_t b = 0;
};

struct SizeRule {
  std::vector<RuleToken> tokens;
  std::string text;  // as written, for messages: "size(x, -1) // 4"

  // Raises dispatch::DispatchFailure for a dimension out of range or a division by zero.
  int64_t evaluate(c10::ArrayRef<c10::IValue> arguments, const std::vector<std::string>& names) const;
};

}  // namespace torch_metallib::ops

// An argument guard the compiler derives from function constants (``use_bias = fused_bias
// && !batched``), read back from the module's static initializer by
// reflection/constant_predicates.py and evaluated here for the constants of a call.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace torch_metallib::dispatch {

struct ConstantValue;

class ConstantPredicate {
 public:
  // One node of the nested form reflection writes (reflection/constant_predicates.py):
  // `kind` ("int", "const", "defined", "icmp", "select", "zext", "sext", "trunc" or a
  // binary operator), its width, and what that kind carries: `literal` (int: the value;
  // const/defined: the constant index; casts: the operand's width), `name` (icmp: the
  // predicate) and `operands`. Throws std::invalid_argument for a node it does not know.
  static ConstantPredicate node(const std::string& kind, int bits, int64_t literal, std::string name,
                                std::vector<ConstantPredicate> operands);

  // The value (truncated to its width) for `constants` (sorted by index; an optional
  // constant that is not among them reads as 0 and is not "defined").
  uint64_t evaluate(const std::vector<ConstantValue>& constants) const;

 private:
  enum class Op { Int, Const, Defined, Binary, Icmp, Select, Zext, Sext, Trunc };
  Op op_ = Op::Int;
  std::string name_;     // the binary operator or icmp predicate
  int bits_ = 1;         // width of the result
  int source_bits_ = 0;  // casts: width of the operand
  int64_t value_ = 0;    // Int: the literal; Const/Defined: the constant index
  std::vector<ConstantPredicate> operands_;
};

}  // namespace torch_metallib::dispatch

#include "dispatch/constant_predicate.h"

#include "dispatch/binding_plan.h"

#include <c10/util/Half.h>

#include <cstring>
#include <stdexcept>

namespace torch_metallib::dispatch {

namespace {

uint64_t truncate(uint64_t value, int bits) { return bits >= 64 ? value : value & ((uint64_t(1) << bits) - 1); }

int64_t sign_extend(uint64_t value, int bits) {
  if (bits >= 64) return int64_t(value);
  const uint64_t sign = uint64_t(1) << (bits - 1);
  return int64_t((truncate(value, bits) ^ sign) - sign);
}

uint64_t binary(const std::string& op, uint64_t a, uint64_t b, int bits) {
  const int64_t sa = sign_extend(a, bits), sb = sign_extend(b, bits);
  if (op == "add") return a + b;
  if (op == "sub") return a - b;
  if (op == "mul") return a * b;
  if (op == "and") return a & b;
  if (op == "or") return a | b;
  if (op == "xor") return a ^ b;
  if (op == "shl") return b >= uint64_t(bits) ? 0 : a << b;
  if (op == "lshr") return b >= uint64_t(bits) ? 0 : a >> b;
  if (op == "ashr") return uint64_t(b >= uint64_t(bits) ? (sa < 0 ? -1 : 0) : sa >> b);
  // Division by zero is undefined in LLVM; 0 keeps the evaluation total.
  if (op == "udiv") return b == 0 ? 0 : a / b;
  if (op == "urem") return b == 0 ? 0 : a % b;
  if (op == "sdiv") return sb == 0 ? 0 : uint64_t(sa / sb);
  if (op == "srem") return sb == 0 ? 0 : uint64_t(sa % sb);
  throw std::invalid_argument("unknown operator " + op);
}

bool compare(const std::string& predicate, uint64_t a, uint64_t b, int bits) {
  const int64_t sa = sign_extend(a, bits), sb = sign_extend(b, bits);
  if (predicate == "eq") return a == b;
  if (predicate == "ne") return a != b;
  if (predicate == "ult") return a < b;
  if (predicate == "ule") return a <= b;
  if (predicate == "ugt") return a > b;
  if (predicate == "uge") return a >= b;
  if (predicate == "slt") return sa < sb;
  if (predicate == "sle") return sa <= sb;
  if (predicate == "sgt") return sa > sb;
  if (predicate == "sge") return sa >= sb;
  throw std::invalid_argument("unknown icmp predicate " + predicate);
}

// A float constant read as an integer of its width (the initializer loaded as iN).
uint64_t float_bits(double value, int bits) {
  if (bits == 64) {
    uint64_t out;
    std::memcpy(&out, &value, 8);
    return out;
  }
  if (bits == 16) return c10::Half(float(value)).x;
  const float single = float(value);
  uint32_t out;
  std::memcpy(&out, &single, 4);
  return truncate(out, bits);
}

}  // namespace

ConstantPredicate ConstantPredicate::node(const std::string& kind, int bits, int64_t literal, std::string name,
                                          std::vector<ConstantPredicate> operands) {
  ConstantPredicate p;
  p.bits_ = bits;
  if (p.bits_ < 1 || p.bits_ > 64) throw std::invalid_argument("a predicate node's width is 1 to 64 bits");
  p.operands_ = std::move(operands);
  if (kind == "int") {
    p.op_ = Op::Int;
    p.value_ = literal;
  } else if (kind == "const" || kind == "defined") {
    p.op_ = kind == "const" ? Op::Const : Op::Defined;
    p.value_ = literal;
  } else if (kind == "icmp") {
    p.op_ = Op::Icmp;
    p.name_ = std::move(name);
  } else if (kind == "select") {
    p.op_ = Op::Select;
  } else if (kind == "zext" || kind == "sext" || kind == "trunc") {
    p.op_ = kind == "zext" ? Op::Zext : kind == "sext" ? Op::Sext : Op::Trunc;
    p.source_bits_ = int(literal);
  } else {
    p.op_ = Op::Binary;
    p.name_ = kind;
    binary(kind, 0, 1, p.bits_);  // throws for an unknown operator
  }
  const size_t arity = p.op_ == Op::Select                                              ? 3
                       : p.op_ == Op::Icmp || p.op_ == Op::Binary                       ? 2
                       : p.op_ == Op::Int || p.op_ == Op::Const || p.op_ == Op::Defined ? 0
                                                                                        : 1;
  if (p.operands_.size() != arity) throw std::invalid_argument("predicate node " + kind + ": wrong operand count");
  return p;
}

uint64_t ConstantPredicate::evaluate(const std::vector<ConstantValue>& constants) const {
  auto operand = [&](size_t i) { return operands_[i].evaluate(constants); };
  switch (op_) {
    case Op::Int: return truncate(uint64_t(value_), bits_);
    case Op::Const:
    case Op::Defined:
      for (const ConstantValue& c : constants) {
        if (c.index != value_) continue;
        if (op_ == Op::Defined) return 1;
        if (c.is_float) return float_bits(c.real, bits_);
        return truncate(uint64_t(c.integer), bits_);
      }
      return 0;
    case Op::Binary: return truncate(binary(name_, operand(0), operand(1), bits_), bits_);
    case Op::Icmp: return compare(name_, operand(0), operand(1), operands_[0].bits_) ? 1 : 0;
    case Op::Select: return operand(0) ? operand(1) : operand(2);
    case Op::Zext: return truncate(operand(0), source_bits_);
    case Op::Sext: return truncate(uint64_t(sign_extend(operand(0), source_bits_)), bits_);
    case Op::Trunc: return truncate(operand(0), bits_);
  }
  return 0;
}

}  // namespace torch_metallib::dispatch

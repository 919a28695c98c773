#include "ops/size_rule.h"

#include <algorithm>

#include "dispatch/binding_plan.h"

namespace torch_metallib::ops {
namespace {

using dispatch::DispatchFailure;

// Python's // and %: rounding toward negative infinity.
int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

}  // namespace

int64_t SizeRule::evaluate(c10::ArrayRef<c10::IValue> arguments, const std::vector<std::string>& names) const {
  int64_t stack[16];
  int depth = 0;
  auto tensor = [&](int64_t index) -> const at::Tensor& { return arguments[size_t(index)].toTensor(); };
  auto dimension = [&](const RuleToken& token) {
    const at::Tensor& t = tensor(token.a);
    int64_t dims = t.dim(), d = token.b < 0 ? token.b + dims : token.b;
    if (d < 0 || d >= dims) {
      throw DispatchFailure(text + ": dimension " + std::to_string(token.b) + " is out of range for '" +
                            names[size_t(token.a)] + "', which has " + std::to_string(dims) + " dimensions");
    }
    return d;
  };
  for (const RuleToken& token : tokens) {
    int64_t value = 0;
    switch (token.op) {
      case RuleOp::Constant: value = token.a; break;
      case RuleOp::Numel: value = tensor(token.a).numel(); break;
      case RuleOp::Size: value = tensor(token.a).size(dimension(token)); break;
      case RuleOp::Stride: value = tensor(token.a).stride(dimension(token)); break;
      case RuleOp::Dim: value = tensor(token.a).dim(); break;
      case RuleOp::Argument: {
        const c10::IValue& v = arguments[size_t(token.a)];
        value = v.isBool() ? int64_t(v.toBool()) : v.toInt();
        break;
      }
      case RuleOp::Present: value = arguments[size_t(token.a)].isNone() ? 0 : 1; break;
      default: {
        int64_t b = stack[--depth], a = stack[--depth];
        switch (token.op) {
          case RuleOp::Add: value = a + b; break;
          case RuleOp::Sub: value = a - b; break;
          case RuleOp::Mul: value = a * b; break;
          case RuleOp::FloorDiv:
          case RuleOp::Mod:
            if (b == 0) throw DispatchFailure(text + ": division by zero");
            value = token.op == RuleOp::FloorDiv ? floor_div(a, b) : a - floor_div(a, b) * b;
            break;
          case RuleOp::Min: value = std::min(a, b); break;
          case RuleOp::Max: value = std::max(a, b); break;
          case RuleOp::Eq: value = a == b; break;
          case RuleOp::Ne: value = a != b; break;
          case RuleOp::Lt: value = a < b; break;
          case RuleOp::Le: value = a <= b; break;
          case RuleOp::Gt: value = a > b; break;
          case RuleOp::Ge: value = a >= b; break;
          default: throw DispatchFailure(text + ": unknown rule operation " + std::to_string(int(token.op)));
        }
      }
    }
    stack[depth++] = value;  // depth was checked when the rule was registered
  }
  return stack[0];
}

}  // namespace torch_metallib::ops

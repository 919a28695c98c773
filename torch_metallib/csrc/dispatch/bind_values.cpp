// One argument's value, as the caller gave it (call_values.h), bound into the plan: a
// tensor by address, numbers and bytes packed as the argument's Metal type.
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cstring>

#include "dispatch/binding_plan.h"

namespace torch_metallib::dispatch {

void KernelSpec::bind_value(Plan& plan, const ArgumentSpec& argument, const CallValue& value, CallOrigin origin,
                            bool& device_seen) const {
  if (argument.kind == ArgumentKind::IndirectBuffer) {
    if (origin == CallOrigin::Operator && !argument.holds_pointer) {
      throw ArgumentError(name_ + ": " + argument.describe() +
                          ": operators cannot bind argument buffers yet; "
                          "call the kernel with a dict of its members instead");
    }
    bind_argument_buffer(plan, argument, value, device_seen);
    return;
  }
  auto where = [&] { return name_ + ": " + argument.describe(); };
  using Kind = CallValue::Kind;
  if (value.kind == Kind::Tensor) {
    const at::Tensor& tensor = value.tensor;
    if (origin == CallOrigin::Python && argument.writable() && tensor.requires_grad() && tensor.is_leaf() &&
        at::GradMode::is_enabled()) {
      throw ArgumentError(where() +
                          ": the kernel writes to it, and it is a leaf tensor that requires grad, "
                          "which torch does not let an operation change in place. Pass a tensor that does not "
                          "require grad, or call under torch.no_grad()");
    }
    bind_tensor(plan, argument, tensor, device_seen);
    return;
  }
  if (value.kind == Kind::Array) {
    throw ArgumentError(where() + ": expected a tensor, got a " + value.type_name +
                        ". Pass torch.from_numpy(x) (or torch.as_tensor(x))");
  }
  if (argument.writable()) {
    const std::string type = value.type_name.empty() ? "" : " (" + value.type_name + ")";
    throw ArgumentError(where() + ": the kernel writes to it; expected a tensor, got " + value.written() + type);
  }
  if (value.kind == Kind::Strided) {
    throw ArgumentError(where() + ": expected contiguous bytes, got a non-contiguous " + value.type_name +
                        ". Pass bytes(view) or view.tobytes()");
  }
  if (value.kind == Kind::Bytes) {
    bind_bytes(plan, argument, value.bytes, value.byte_count, [&] { return value.written(); });
    return;
  }
  if (argument.type == nullptr) {
    throw ArgumentError(where() + ": '" + argument.type_name +
                        "' is not a scalar or vector type; expected a tensor or " + "bytes of its " +
                        std::to_string(argument.type_size) + "-byte layout, got " + value.written());
  }
  bind_numbers(plan, argument, value);
}

void KernelSpec::bind_numbers(Plan& plan, const ArgumentSpec& argument, const CallValue& value) const {
  auto where = [&] { return name_ + ": " + argument.describe(); };
  const MetalType& type = *argument.type;
  const bool sequence = value.kind == CallValue::Kind::Sequence;
  std::vector<const CallValue*> numbers;
  if (sequence) {
    for (const CallValue& item : value.items) numbers.push_back(&item);
  } else {
    numbers.push_back(&value);
  }
  if (numbers.empty() || numbers.size() % size_t(type.components)) {
    throw ArgumentError(where() + ": expected " +
                        (type.components > 1 ? std::to_string(type.components) + " numbers per " + type.name
                                             : std::string("a number or a sequence of numbers")) +
                        ", got " + value.written() +
                        (sequence ? " (" + std::to_string(numbers.size()) + " numbers)" : " (one number)"));
  }
  // Each element takes the type's full size: a uint3 is 16 bytes, as Metal lays it out.
  const size_t slot = size_t(std::max<int64_t>(argument.type_size, type.element_bytes * type.components));
  const size_t count = numbers.size() / size_t(type.components);
  const int64_t bytes = int64_t(slot * count);
  auto storage = allocate(size_t(bytes));
  auto* out = reinterpret_cast<uint8_t*>(storage->data());
  for (size_t i = 0; i < numbers.size(); ++i) {
    const CallValue& item = *numbers[i];
    const size_t at = (i / size_t(type.components)) * slot + (i % size_t(type.components)) * size_t(type.element_bytes);
    if (item.kind != CallValue::Kind::Number) {
      throw ArgumentError(where() + ": expected " + wanted(type) + ", got a " +
                          (item.type_name.empty() ? std::string("value that is not a number") : item.type_name));
    }
    const PackProblem problem = pack_number(type, item.number, out + at);
    if (problem != PackProblem::None) {
      throw ArgumentError(where() + ": expected " + wanted(type) + ", got " + found(problem, item.written()));
    }
  }
  bind_bytes(plan, argument, std::move(storage), bytes, [&] { return value.written(); });
}

}  // namespace torch_metallib::dispatch

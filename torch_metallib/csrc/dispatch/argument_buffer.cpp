// Argument buffers: a struct argument whose members carry [[id(n)]] (pointers and values),
// which Metal encodes with an argument encoder. A call passes it as a mapping from member
// name to a tensor (a pointer), a sequence of tensors (an array of pointers) or a number
// (a value), or as a sequence in id order. The plan lays the struct out as reflection says,
// with host addresses in its pointer slots, and lists the slots for GPU backends.
#include <algorithm>
#include <cstring>

#include "dispatch/binding_plan.h"

namespace torch_metallib::dispatch {
namespace {

std::string member_names(const ArgumentSpec& argument) {
  std::string names;
  for (const MemberSpec& m : argument.members) {
    names += (names.empty() ? "" : ", ") + m.name + " [[id(" + std::to_string(m.id) + ")]]";
  }
  return names;
}

}  // namespace

void KernelSpec::bind_argument_buffer(Plan& plan, const ArgumentSpec& argument, const CallValue& value,
                                      bool& device_seen) const {
  auto where = [&] { return name_ + ": " + argument.describe(); };
  const size_t n = argument.members.size();
  std::vector<const CallValue*> values(n, nullptr);
  if (argument.holds_pointer && n == 1 && value.kind == CallValue::Kind::Tensor) {
    values[0] = &value;  // the tensor it points to
  } else if (argument.holds_pointer) {
    throw ArgumentError(where() + ": expected a tensor (its address is bound), got " + value.written());
  } else if (value.kind == CallValue::Kind::Mapping) {
    for (const CallValue& item : value.items) {
      const std::string& name = item.key;
      auto found = std::find_if(argument.members.begin(), argument.members.end(),
                                [&](const MemberSpec& m) { return m.name == name; });
      if (found == argument.members.end()) {
        throw ArgumentError(where() + ": no member named '" + name + "'; expected " + member_names(argument));
      }
      values[size_t(found - argument.members.begin())] = &item;
    }
  } else if (value.kind == CallValue::Kind::Sequence && value.items.size() == n) {
    for (size_t i = 0; i < n; ++i) values[i] = &value.items[i];
  } else {
    throw ArgumentError(where() + ": expected a dict of its members (" + member_names(argument) +
                        ") or a sequence of " + std::to_string(n) + " values in id order, got " + value.written());
  }
  auto storage = allocate(size_t(std::max<int64_t>(argument.type_size, 8)));
  auto* bytes = reinterpret_cast<uint8_t*>(storage->data());
  ArgumentBuffer buffer{argument.position, argument.binding, storage, {}};
  for (size_t i = 0; i < n; ++i) {
    const MemberSpec& member = argument.members[i];
    const ArgumentSpec& element = *member.element;
    auto member_where = [&] { return name_ + ": " + element.describe(); };
    const CallValue* item = values[i];
    if (item == nullptr || !item->given()) {
      throw ArgumentError(member_where() + ": missing; pass " + argument.name + "={'" + member.name + "': ..., ...}");
    }
    if (member.pointer) {
      std::vector<const CallValue*> tensors;
      if (item->kind == CallValue::Kind::Tensor) {
        tensors.push_back(item);
      } else if (item->kind == CallValue::Kind::Sequence) {
        for (const CallValue& t : item->items) tensors.push_back(&t);
      }
      if (tensors.empty() || int64_t(tensors.size()) > member.count ||
          !std::all_of(tensors.begin(), tensors.end(),
                       [](const CallValue* t) { return t->kind == CallValue::Kind::Tensor; })) {
        throw ArgumentError(
            member_where() + ": expected " +
            (member.count > 1 ? "1 to " + std::to_string(member.count) + " tensors" : std::string("a tensor")) +
            ", got " + item->written());
      }
      for (size_t k = 0; k < tensors.size(); ++k) {
        const at::Tensor& tensor = tensors[k]->tensor;
        check_layout(element, tensor);
        check_device(plan, element, tensor, device_seen);
        check_tensor(element, tensor);
        refuse_overlap(element, tensor);
        const int64_t at = member.offset + int64_t(k) * 8;
        if (at + 8 > argument.type_size) {
          throw DispatchFailure(member_where() + ": pointer " + std::to_string(k) + " at byte " + std::to_string(at) +
                                " lies outside the " + std::to_string(argument.type_size) + "-byte struct");
        }
        const uint64_t address = reinterpret_cast<uintptr_t>(tensor.data_ptr());
        std::memcpy(bytes + at, &address, 8);
        buffer.slots.push_back({at, tensor, element.writable()});
      }
    } else {
      if (element.type == nullptr || element.type->components != 1 || item->kind != CallValue::Kind::Number) {
        throw ArgumentError(member_where() + ": expected " + (element.type ? wanted(*element.type) : "a number") +
                            ", got " + item->written());
      }
      const Number& number = item->number;
      if (member.offset + element.type->element_bytes > argument.type_size) {
        throw DispatchFailure(member_where() + ": the value at byte " + std::to_string(member.offset) +
                              " lies outside the " + std::to_string(argument.type_size) + "-byte struct");
      }
      PackProblem problem = pack_number(*element.type, number, bytes + member.offset);
      if (problem != PackProblem::None) {
        throw ArgumentError(member_where() + ": expected " + wanted(*element.type) + ", got " +
                            found(problem, item->written()));
      }
    }
  }
  plan.addresses[argument.position] = storage->data();
  plan.extents[argument.position] = argument.type_size;
  plan.bindings[argument.position] = {ParameterBinding::Kind::ArgumentBuffer, argument.binding, {}, false};
  plan.packed.push_back(storage);
  plan.argument_buffers.push_back(std::move(buffer));
}

}  // namespace torch_metallib::dispatch

// Argument buffers: a struct argument whose members carry [[id(n)]] (pointers and values),
// which Metal encodes with an argument encoder. A call passes it as a mapping from member
// name to a tensor (a pointer), a sequence of tensors (an array of pointers) or a number
// (a value), or as a sequence in id order. The plan lays the struct out as reflection says,
// with host addresses in its pointer slots, and lists the slots for GPU backends.
#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>
#include <cstring>

#include "dispatch/binding_plan.h"
#include "dispatch/python_values.h"

namespace py = pybind11;

namespace torch_metallib::dispatch {
namespace {

std::string member_names(const ArgumentSpec& argument) {
  std::string names;
  for (const MemberSpec& m : argument.members) {
    names += (names.empty() ? "" : ", ") + m.name +
             " [[id(" + std::to_string(m.id) + ")]]";
  }
  return names;
}

}  // namespace

void KernelSpec::bind_argument_buffer(Plan& plan, const ArgumentSpec& argument, const py::handle& value,
                                      bool& device_seen) const {
  auto where = [&] { return name_ + ": " + argument.describe(); };
  const size_t n = argument.members.size();
  std::vector<py::handle> values(n);
  if (PyDict_Check(value.ptr())) {
    for (const auto& [key, item] : py::reinterpret_borrow<py::dict>(value)) {
      const std::string name = py::str(key).cast<std::string>();
      auto found = std::find_if(argument.members.begin(), argument.members.end(),
                                [&](const MemberSpec& m) { return m.name == name; });
      if (found == argument.members.end()) {
        throw ArgumentError(where() + ": no member named '" + name + "'; expected " + member_names(argument));
      }
      values[size_t(found - argument.members.begin())] = item;
    }
  } else if (is_sequence(value) && size_t(py::len(value)) == n) {
    size_t i = 0;
    for (const py::handle& item : value) values[i++] = item;
  } else {
    throw ArgumentError(where() + ": expected a dict of its members (" + member_names(argument) +
                        ") or a sequence of " + std::to_string(n) + " values in id order, got " + short_repr(value));
  }
  auto storage = allocate(size_t(std::max<int64_t>(argument.type_size, 8)));
  auto* bytes = reinterpret_cast<uint8_t*>(storage->data());
  ArgumentBuffer buffer{argument.position, argument.binding, storage, {}};
  for (size_t i = 0; i < n; ++i) {
    const MemberSpec& member = argument.members[i];
    const ArgumentSpec& element = *member.element;
    auto member_where = [&] { return name_ + ": " + element.describe(); };
    const py::handle item = values[i];
    if (!item || item.is_none()) {
      throw ArgumentError(member_where() + ": missing; pass " + argument.name + "={'" +
                          member.name + "': ..., ...}");
    }
    if (member.pointer) {
      std::vector<py::handle> tensors;
      if (is_tensor(item)) {
        tensors.push_back(item);
      } else if (is_sequence(item)) {
        for (const py::handle& t : item) tensors.push_back(t);
      }
      if (tensors.empty() || int64_t(tensors.size()) > member.count ||
          !std::all_of(tensors.begin(), tensors.end(), [](const py::handle& t) { return is_tensor(t); })) {
        throw ArgumentError(member_where() + ": expected " + (member.count > 1 ? "1 to " + std::to_string(member.count) +
                            " tensors" : std::string("a tensor")) + ", got " + short_repr(item));
      }
      for (size_t k = 0; k < tensors.size(); ++k) {
        const at::Tensor& tensor = THPVariable_Unpack(tensors[k].ptr());
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
      Number number;
      if (element.type == nullptr || element.type->components != 1 || is_tensor(item) || !read_number(item, number)) {
        throw ArgumentError(member_where() + ": expected " + (element.type ? wanted(*element.type) : "a number") +
                            ", got " + short_repr(item));
      }
      if (member.offset + element.type->element_bytes > argument.type_size) {
        throw DispatchFailure(member_where() + ": the value at byte " + std::to_string(member.offset) +
                              " lies outside the " + std::to_string(argument.type_size) + "-byte struct");
      }
      PackProblem problem = pack_number(*element.type, number, bytes + member.offset);
      if (problem != PackProblem::None) {
        throw ArgumentError(member_where() + ": expected " + wanted(*element.type) + ", got " +
                            found(problem, short_repr(item)));
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

#include "dispatch/replay.h"

#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>

namespace torch_metallib::dispatch {

Plan replayed_plan(const Plan& plan, const EncodedCommands& encoded) {
  Plan out = plan;
  out.commands = nullptr;  // the encoder's record, not the list, is what runs
  for (size_t position = 0; position < plan.bindings.size(); ++position) {
    const ParameterBinding& binding = plan.bindings[position];
    switch (binding.kind) {
      case ParameterBinding::Kind::Tensor:
      case ParameterBinding::Kind::Bytes:
      case ParameterBinding::Kind::ArgumentBuffer: {
        if (auto found = encoded.buffers.find(binding.index); found != encoded.buffers.end()) {
          out.addresses[position] = found->second;
        } else if (auto set = encoded.bytes.find(binding.index); set != encoded.bytes.end()) {
          auto owned = std::make_shared<std::vector<uint64_t>>((set->second.size() + 7) / 8 + 1, 0);
          std::memcpy(owned->data(), set->second.data(), set->second.size());
          out.packed.push_back(owned);
          out.addresses[position] = owned->data();
        } else {
          throw std::invalid_argument("the encoder set nothing at buffer index " + std::to_string(binding.index));
        }
        break;
      }
      case ParameterBinding::Kind::Threadgroup:
      case ParameterBinding::Kind::None: break;
    }
  }
  for (auto& [position, bytes] : out.threadgroup_buffers) {
    auto found = encoded.threadgroup.find(plan.bindings[size_t(position)].index);
    if (found == encoded.threadgroup.end()) {
      throw std::invalid_argument("the encoder set no threadgroup memory at index " +
                                  std::to_string(plan.bindings[size_t(position)].index));
    }
    bytes = found->second;
  }
  uint64_t groups = 1;
  for (int axis = 0; axis < 3; ++axis) {
    out.dims[axis] = encoded.grid[axis];
    out.dims[3 + axis] = encoded.group[axis];
    out.dims[6 + axis] = (encoded.grid[axis] + encoded.group[axis] - 1) / encoded.group[axis];
    groups *= out.dims[6 + axis];
  }
  out.group_count = groups;
  return out;
}

}  // namespace torch_metallib::dispatch

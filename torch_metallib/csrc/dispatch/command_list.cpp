#include "dispatch/command_list.h"

#include <algorithm>

#include "dispatch/binding_plan.h"

namespace torch_metallib::dispatch {

CommandList command_list(const Plan& plan, const std::string& function) {
  CommandList out;
  out.function = function;
  out.constants = plan.constants;
  out.buffers.reserve(plan.bindings.size());
  for (int axis = 0; axis < 3; ++axis) {
    out.grid[axis] = plan.dims[axis];
    out.group[axis] = plan.dims[3 + axis];
  }
  for (size_t position = 0; position < plan.bindings.size(); ++position) {
    const ParameterBinding& binding = plan.bindings[position];
    const int p = int(position);
    switch (binding.kind) {
      case ParameterBinding::Kind::Tensor: {
        const at::Tensor& tensor = binding.tensor;
        out.buffers.push_back({binding.index, p, tensor, int64_t(tensor.storage_offset()) * int64_t(tensor.itemsize()),
                               binding.writable});
        break;
      }
      case ParameterBinding::Kind::Bytes:
      case ParameterBinding::Kind::ArgumentBuffer: {
        const int64_t length = plan.extents[position];
        const ArgumentBuffer* argument_buffer = nullptr;
        for (const ArgumentBuffer& buffer : plan.argument_buffers) {
          if (buffer.position == p) argument_buffer = &buffer;
        }
        out.bytes.push_back(
            {binding.index, p, plan.addresses[position], length, length > kSetBytesLimit, argument_buffer});
        break;
      }
      case ParameterBinding::Kind::Threadgroup: break;  // from plan.threadgroup_buffers, below
      case ParameterBinding::Kind::None: break;
    }
  }
  for (const auto& [position, bytes] : plan.threadgroup_buffers) {
    const int64_t length = (bytes + 15) / 16 * 16;
    out.threadgroup.push_back({plan.bindings[size_t(position)].index, position, length});
    out.threadgroup_total += length;
  }
  auto by_index = [](const auto& a, const auto& b) { return a.index < b.index; };
  std::sort(out.buffers.begin(), out.buffers.end(), by_index);
  std::sort(out.bytes.begin(), out.bytes.end(), by_index);
  std::sort(out.threadgroup.begin(), out.threadgroup.end(), by_index);
  return out;
}

void cpu_addresses(const CommandList& commands, std::vector<void*>& addresses) {
  std::fill(addresses.begin(), addresses.end(), nullptr);
  for (const BufferCommand& buffer : commands.buffers) {
    // The storage's start plus the command's offset: what a GPU reads at buffer + offset.
    auto* first = static_cast<char*>(buffer.tensor.data_ptr());
    if (first == nullptr) continue;
    char* start = first - int64_t(buffer.tensor.storage_offset()) * int64_t(buffer.tensor.itemsize());
    addresses[size_t(buffer.position)] = start + buffer.offset;
  }
  for (const BytesCommand& bytes : commands.bytes) addresses[size_t(bytes.position)] = const_cast<void*>(bytes.data);
}

}  // namespace torch_metallib::dispatch

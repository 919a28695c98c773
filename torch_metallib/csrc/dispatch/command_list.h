// The Metal-shaped command list of one kernel call: what a compute encoder is told,
// built from the binding plan and consumed by every backend. The CPU backend takes its
// per-parameter addresses from it (cpu_addresses), so every CPU call exercises it; the
// Metal backend replays it as setBuffer / setBytes / setThreadgroupMemoryLength /
// dispatchThreads on the MPS stream's encoder.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace torch_metallib::dispatch {

struct ArgumentBuffer;
struct ConstantValue;
struct Plan;

// Metal's limit for setBytes:length:atIndex:; larger values go in a buffer of their own.
constexpr int64_t kSetBytesLimit = 4096;

// setBuffer:offset:atIndex: with the tensor's storage (its MTLBuffer on a Mac).
struct BufferCommand {
  int index = 0;       // [[buffer(n)]]
  int position = 0;    // IR parameter (for the CPU backend)
  at::Tensor tensor;   // keeps the storage alive; the buffer is its storage
  int64_t offset = 0;  // bytes from the storage's start: storage_offset * itemsize
  bool writable = false;
};

// Bytes the plan packed (a value, a struct, an argument buffer's struct, zeros for a
// left-out argument): setBytes when at most kSetBytesLimit, else a buffer made from them.
struct BytesCommand {
  int index = 0;
  int position = 0;
  const void* data = nullptr;  // owned by the plan
  int64_t length = 0;
  bool as_buffer = false;                           // length > kSetBytesLimit
  const ArgumentBuffer* argument_buffer = nullptr;  // its pointer slots, to re-encode
};

// setThreadgroupMemoryLength:atIndex:, rounded up to 16 bytes.
struct ThreadgroupCommand {
  int index = 0;
  int position = 0;
  int64_t length = 0;
};

struct CommandList {
  // The pipeline key: the function and its constant values (by index).
  std::string function;
  std::vector<ConstantValue> constants;
  std::vector<BufferCommand> buffers;  // by index
  std::vector<BytesCommand> bytes;     // by index
  std::vector<ThreadgroupCommand> threadgroup;
  uint32_t grid[3] = {1, 1, 1};   // dispatchThreads: threads per grid
  uint32_t group[3] = {1, 1, 1};  //   threads per threadgroup (the last ones may be partial)
  int64_t threadgroup_total = 0;  // what the commands set, for the device limit
};

// The commands of `plan` (whose arguments were bound by KernelSpec `function`).
CommandList command_list(const Plan& plan, const std::string& function);

// Fills `addresses` (one per IR parameter) with the address each parameter gets from the
// commands (nullptr for builtins and threadgroup memory, which the CPU backend allocates
// per threadgroup).
void cpu_addresses(const CommandList& commands, std::vector<void*>& addresses);

}  // namespace torch_metallib::dispatch

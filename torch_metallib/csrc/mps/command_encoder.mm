#include "mps/command_encoder.h"

#include <cstring>
#include <string>

#include "dispatch/binding_plan.h"
#include "mps/torch_mps_stream.h"

namespace torch_metallib::mps {

namespace {

// An argument buffer's struct with each pointer slot holding the GPU address of its
// tensor (Metal 3: resources written straight into the struct, no MTLArgumentEncoder),
// every tensor made resident for the dispatch with the usage the kernel declares.
std::string reencoded_argument_buffer(id<MTLComputeCommandEncoder> encoder, const dispatch::BytesCommand& bytes,
                                      const std::string& function) {
  std::string out(static_cast<const char*>(bytes.data), size_t(bytes.length));
  for (const dispatch::ArgumentBufferSlot& slot : bytes.argument_buffer->slots) {
    id<MTLBuffer> buffer = tensor_buffer(slot.tensor);
    if (![buffer respondsToSelector:@selector(gpuAddress)]) {
      throw dispatch::UnsupportedCall(function + ": argument buffers (buffer(" + std::to_string(bytes.index) +
                                      ")) need MTLBuffer.gpuAddress, macOS 13 or later. Update macOS or run "
                                      "the kernel on cpu tensors");
    }
    const uint64_t address = buffer.gpuAddress + uint64_t(slot.tensor.storage_offset()) * slot.tensor.itemsize();
    std::memcpy(out.data() + slot.offset, &address, sizeof(address));
    [encoder useResource:buffer
                   usage:slot.writable ? (MTLResourceUsageRead | MTLResourceUsageWrite) : MTLResourceUsageRead];
  }
  return out;
}

}  // namespace

std::vector<id<MTLBuffer>> encode_commands(id<MTLComputeCommandEncoder> encoder, id<MTLComputePipelineState> pipeline,
                                           id<MTLDevice> device, const dispatch::CommandList& commands) {
  std::vector<id<MTLBuffer>> copies;
  [encoder setComputePipelineState:pipeline];
  for (const dispatch::BufferCommand& buffer : commands.buffers) {
    [encoder setBuffer:tensor_buffer(buffer.tensor) offset:NSUInteger(buffer.offset) atIndex:NSUInteger(buffer.index)];
  }
  for (const dispatch::BytesCommand& bytes : commands.bytes) {
    std::string reencoded;
    const void* data = bytes.data;
    if (bytes.argument_buffer != nullptr) {
      reencoded = reencoded_argument_buffer(encoder, bytes, commands.function);
      data = reencoded.data();
    }
    if (!bytes.as_buffer) {
      [encoder setBytes:data length:NSUInteger(bytes.length) atIndex:NSUInteger(bytes.index)];
      continue;
    }
    id<MTLBuffer> copy = [device newBufferWithBytes:data
                                             length:NSUInteger(bytes.length)
                                            options:MTLResourceStorageModeShared];
    [encoder setBuffer:copy offset:0 atIndex:NSUInteger(bytes.index)];
    copies.push_back(copy);
  }
  for (const dispatch::ThreadgroupCommand& memory : commands.threadgroup) {
    [encoder setThreadgroupMemoryLength:NSUInteger(memory.length) atIndex:NSUInteger(memory.index)];
  }
  [encoder dispatchThreads:MTLSizeMake(commands.grid[0], commands.grid[1], commands.grid[2])
      threadsPerThreadgroup:MTLSizeMake(commands.group[0], commands.group[1], commands.group[2])];
  return copies;
}

}  // namespace torch_metallib::mps

#include "mps/command_encoder.h"

#include "mps/torch_mps_stream.h"

namespace torch_metallib::mps {

std::vector<id<MTLBuffer>> encode_commands(id<MTLComputeCommandEncoder> encoder, id<MTLComputePipelineState> pipeline,
                                           id<MTLDevice> device, const dispatch::CommandList& commands) {
  std::vector<id<MTLBuffer>> copies;
  [encoder setComputePipelineState:pipeline];
  for (const dispatch::BufferCommand& buffer : commands.buffers) {
    [encoder setBuffer:tensor_buffer(buffer.tensor) offset:NSUInteger(buffer.offset) atIndex:NSUInteger(buffer.index)];
  }
  for (const dispatch::BytesCommand& bytes : commands.bytes) {
    if (!bytes.as_buffer) {
      [encoder setBytes:bytes.data length:NSUInteger(bytes.length) atIndex:NSUInteger(bytes.index)];
      continue;
    }
    id<MTLBuffer> copy = [device newBufferWithBytes:bytes.data length:NSUInteger(bytes.length)
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

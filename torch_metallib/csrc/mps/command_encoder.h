// Replays a command list into a Metal compute encoder (Objective-C++ only).
#pragma once

#import <Metal/Metal.h>

#include <vector>

#include "dispatch/command_list.h"

namespace torch_metallib::mps {

// setComputePipelineState, then per binding index setBuffer:offset:atIndex: (tensor
// storage) or setBytes:length:atIndex: (a value up to 4 KB; larger ones are copied into a
// new buffer, returned so the caller releases it after the GPU is done; an argument
// buffer's pointers rewritten as GPU addresses, its tensors made resident), threadgroup memory
// lengths, and dispatchThreads:threadsPerThreadgroup: (partial edge groups, as on the CPU).
std::vector<id<MTLBuffer>> encode_commands(id<MTLComputeCommandEncoder> encoder, id<MTLComputePipelineState> pipeline,
                                           id<MTLDevice> device, const dispatch::CommandList& commands);

}  // namespace torch_metallib::mps

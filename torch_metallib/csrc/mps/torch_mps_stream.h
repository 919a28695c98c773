// The only part of the Metal backend that touches PyTorch's MPS headers (implemented in
// torch_mps_stream.mm; tests/metal_sim/sim_stream.mm stands in for it on Linux).
// Objective-C++ only.
#pragma once

#import <Metal/Metal.h>

#include <functional>

#include <ATen/core/Tensor.h>

namespace torch_metallib::mps {

// The MPS device torch uses.
id<MTLDevice> current_device();

// The MTLBuffer holding an mps tensor's storage (the storage's data pointer is the buffer).
id<MTLBuffer> tensor_buffer(const at::Tensor& tensor);

// Runs `encode` on the calling thread's current MPS stream: on the stream's serial queue,
// with the stream's own compute encoder (valid only inside). Exceptions reach the caller.
void encode_on_current_stream(const std::function<void(id<MTLComputeCommandEncoder>)>& encode);

// Releases `buffer` once the stream's command buffer has completed (a value too large for
// setBytes, copied into a buffer of its own). Call outside encode_on_current_stream.
void release_when_completed(id<MTLBuffer> buffer);

}  // namespace torch_metallib::mps

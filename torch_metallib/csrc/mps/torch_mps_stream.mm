// Everything that touches PyTorch's MPS headers. Across versions (docs/backends/metal.md,
// tools/check_torch_mps_headers.py): from torch 2.14 the current stream is per thread,
// so it is asked for on every call; no macOS-version helper of torch's is used (they were
// renamed in 2.14 and renumbered in 2.15); dispatch_sync with our own rethrow instead of
// torch's dispatch_sync_with_rethrow keeps one code path for 2.4 to 2.15.
#include "mps/torch_mps_stream.h"

#include <ATen/mps/MPSDevice.h>
#include <ATen/mps/MPSStream.h>

#include <exception>

namespace torch_metallib::mps {

id<MTLDevice> current_device() { return at::mps::MPSDevice::getInstance()->device(); }

id<MTLBuffer> tensor_buffer(const at::Tensor& tensor) {
  return (id<MTLBuffer>)const_cast<void*>(tensor.storage().data());
}

void encode_on_current_stream(const std::function<void(id<MTLComputeCommandEncoder>)>& encode) {
  at::mps::MPSStream* stream = at::mps::getCurrentMPSStream();
  __block std::exception_ptr failure;
  dispatch_sync(stream->queue(), ^() {
    @autoreleasepool {
      try {
        encode(stream->commandEncoder());
      } catch (...) {
        failure = std::current_exception();
      }
    }
  });
  if (failure) std::rethrow_exception(failure);
}

void release_when_completed(id<MTLBuffer> buffer) {
  at::mps::getCurrentMPSStream()->addCompletedHandler(^(id<MTLCommandBuffer>) {
    [buffer release];
  });
}

}  // namespace torch_metallib::mps

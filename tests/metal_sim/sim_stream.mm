// Stands in for csrc/mps/torch_mps_stream.mm (the file that includes PyTorch's MPS
// headers, which a CPU build of torch cannot run): the simulated device, tensors' storage
// wrapped as buffers in place, one serial "stream" whose encoder records, and copies kept
// until the test has replayed the recording (complete_command_buffer in sim_module.mm).
#include "mps/torch_mps_stream.h"

#include <mutex>
#include <vector>

#include "recorder.h"

id<MTLBuffer> sim_buffer(void* contents, NSUInteger length, bool owned);
id<MTLComputeCommandEncoder> sim_encoder();

namespace metal_sim {
std::vector<id<MTLBuffer>>& pending_copies() {
  static std::vector<id<MTLBuffer>> copies;
  return copies;
}
}  // namespace metal_sim

namespace torch_metallib::mps {

id<MTLDevice> current_device() { return MTLCreateSystemDefaultDevice(); }

id<MTLBuffer> tensor_buffer(const at::Tensor& tensor) {
  // On a Mac the storage's data pointer is the MTLBuffer; here the buffer wraps the
  // storage's memory, so what the encoder records points into the tensor itself.
  const at::Storage& storage = tensor.storage();
  return [sim_buffer(const_cast<void*>(storage.data()), NSUInteger(storage.nbytes()), false) autorelease];
}

void encode_on_current_stream(const std::function<void(id<MTLComputeCommandEncoder>)>& encode) {
  __block std::exception_ptr failure;
  dispatch_sync(nullptr, ^() {
    NSAutoreleasePool* pool = [[NSAutoreleasePool alloc] init];
    try {
      encode(sim_encoder());
    } catch (...) {
      failure = std::current_exception();
    }
    [pool drain];
  });
  if (failure) std::rethrow_exception(failure);
}

void release_when_completed(id<MTLBuffer> buffer) {
  std::lock_guard<std::mutex> lock(metal_sim::recorder().mutex);
  metal_sim::pending_copies().push_back(buffer);
}

}  // namespace torch_metallib::mps

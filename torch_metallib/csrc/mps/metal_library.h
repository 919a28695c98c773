// The Metal backend's C++ face: a library made from a metallib's bytes, its pipeline
// cache, and a command list (dispatch/command_list.h) run on PyTorch's MPS stream. The
// Objective-C++ behind it is in this folder, built on macOS only; tests/metal_sim builds
// the same files on Linux against a simulated Metal.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dispatch/command_list.h"

namespace torch_metallib::dispatch {
struct ConstantValue;
}

namespace torch_metallib::mps {

// What a pipeline allows, from the pipeline itself.
struct PipelineLimits {
  int64_t max_total_threads = 0;          // maxTotalThreadsPerThreadgroup
  int64_t execution_width = 0;            // threadExecutionWidth
  int64_t static_threadgroup_memory = 0;  // staticThreadgroupMemoryLength
};

class MetalLibrary {
 public:
  // Metal reads `bytes` in place (no copy, no temporary file): `owner` keeps them alive and
  // unmoved for the library's life. Throws dispatch::UnsupportedCall if Metal refuses them.
  MetalLibrary(std::shared_ptr<const void> owner, const void* bytes, size_t length);
  ~MetalLibrary();
  MetalLibrary(const MetalLibrary&) = delete;
  MetalLibrary& operator=(const MetalLibrary&) = delete;

  // The pipeline of (function, constant values), built once however many threads ask.
  PipelineLimits limits(const std::string& function, const std::vector<dispatch::ConstantValue>& constants);

  // Checks `commands` against the pipeline's and the device's limits (dispatch::DispatchFailure,
  // before anything is encoded), then encodes them into the current MPS stream's compute
  // encoder. Never ends encoding or commits: the stream owns that.
  void run(const dispatch::CommandList& commands);

  int64_t pipelines_built() const;     // how many (function, constants) were compiled
  int64_t pipelines_archived() const;  // how many came from the binary archive instead

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace torch_metallib::mps

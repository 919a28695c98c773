// The CUDA backend's native launcher (dispatch/launcher.h): one loaded kernel on one GPU,
// launched from the plan's command list as backends/cuda/backend.py launches it (the same
// parameters, blocks, edge launches and coarsening), on torch's current stream. Plans with
// bytes commands (values the kernel reads from device memory) take the full path, which
// keeps their device copies.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "cuda/driver_api.h"
#include "dispatch/launcher.h"

namespace torch_metallib::cuda {

struct KernelHandles {
  int device = 0;             // the GPU's index
  Context context = nullptr;  // its primary context (torch's)
  Function function = nullptr;
  int max_threads = 0;        // CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK
  int static_shared = 0;      // CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES
  int dynamic_allowed = 0;    // dynamic shared memory the kernel was opted in to (48 KB without)
  int coarsening = 1;         // grid positions per CUDA thread along x
  bool grid_only = false;     // the block is ours to choose (1-D grids: grid_only_block threads)
  int grid_only_block = 256;
};

// An entry parameter: a bound argument's global pointer, or a [[threadgroup(n)]] offset.
struct ParameterSlot {
  bool threadgroup = false;
  int binding = 0;
};

class CudaLauncher final : public dispatch::Launcher {
 public:
  // `current_stream(device)`: torch's current stream there (the caller's, with the GIL).
  CudaLauncher(std::vector<dispatch::ConstantValue> constants, KernelHandles kernel, std::vector<ParameterSlot> slots,
               std::function<Stream(int)> current_stream);
  ~CudaLauncher() override;

  bool accepts(const dispatch::Plan& plan) const override;
  void launch(const dispatch::Plan& plan) override;
  bool releases_gil(const dispatch::Plan& plan) const override { return false; }

 private:
  int slot_of(bool threadgroup, int binding) const;
  // The CUDA grid (coarsened along x) and block of a launch of `commands`.
  void shape(const dispatch::CommandList& commands, int64_t grid[3], int64_t block[3]) const;
  // Puts the bytes commands in device memory (stream-ordered on `stream`) and their
  // addresses in `packed`.
  void place_bytes(const dispatch::CommandList& commands, Stream stream, uint8_t* packed);

  std::vector<dispatch::ConstantValue> constants_;
  KernelHandles kernel_;
  std::vector<ParameterSlot> slots_;
  std::vector<size_t> offsets_;  // of each slot, then of the 9 launch parameters, in the packed buffer
  size_t size_ = 0;
  std::function<Stream(int)> current_stream_;
  const DriverApi& api_;
  struct DeviceBytes {
    DevicePointer base = 0;
    Stream stream = nullptr;
    uint64_t used = 0;  // when last used, for eviction
  };
  static constexpr size_t kKeptBytes = 256;  // distinct contents kept on the device
  std::unordered_map<std::string, DeviceBytes> bytes_;  // (stream, each command's bytes) -> copy
  uint64_t clock_ = 0;
};

}  // namespace torch_metallib::cuda

// The few CUDA driver entry points a native launch needs, reached with dlopen at run time
// (as Triton's launchers do): the extension builds and imports without CUDA. Loading
// modules and reading attributes stay in Python (backends/cuda/driver.py), which hands the
// launcher the handles it made.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace torch_metallib::cuda {

// Raised as torch_metallib.KernelExecutionError.
struct DriverError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

using Result = int;  // CUresult
using Context = void*;
using Function = void*;
using Stream = void*;
using DevicePointer = unsigned long long;  // CUdeviceptr

struct DriverApi {
  Result (*ctx_get_current)(Context*) = nullptr;
  Result (*ctx_set_current)(Context) = nullptr;
  Result (*launch_kernel)(Function, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, Stream,
                          void**, void**) = nullptr;
  Result (*get_error_string)(Result, const char**) = nullptr;
  Result (*memcpy_htod_async)(DevicePointer, const void*, size_t, Stream) = nullptr;
  // Stream-ordered allocation (drivers since CUDA 11.2); null where the driver lacks it.
  Result (*mem_alloc_async)(DevicePointer*, size_t, Stream) = nullptr;
  Result (*mem_free_async)(DevicePointer, Stream) = nullptr;

  // Throws DriverError naming `call` unless `status` is CUDA_SUCCESS.
  void check(Result status, const char* call) const;
};

// The process's driver entry points, resolved on first use; throws DriverError where
// libcuda.so.1 cannot be loaded.
const DriverApi& driver_api();

}  // namespace torch_metallib::cuda

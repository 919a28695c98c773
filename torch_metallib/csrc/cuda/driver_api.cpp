#include "cuda/driver_api.h"

#include <dlfcn.h>

#include <mutex>

namespace torch_metallib::cuda {
namespace {

template <typename T>
void resolve(void* library, const char* name, T& out) {
  out = reinterpret_cast<T>(dlsym(library, name));
  if (out == nullptr) throw DriverError(std::string("CUDA driver: libcuda.so.1 has no ") + name);
}

DriverApi load() {
  void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* why = dlerror();
    throw DriverError(std::string("the CUDA backend needs NVIDIA's driver (libcuda.so.1): ") + (why ? why : "not found"));
  }
  DriverApi api;
  resolve(library, "cuCtxGetCurrent", api.ctx_get_current);
  resolve(library, "cuCtxSetCurrent", api.ctx_set_current);
  resolve(library, "cuLaunchKernel", api.launch_kernel);
  resolve(library, "cuGetErrorString", api.get_error_string);
  resolve(library, "cuMemcpyHtoDAsync_v2", api.memcpy_htod_async);
  api.mem_alloc_async = reinterpret_cast<decltype(api.mem_alloc_async)>(dlsym(library, "cuMemAllocAsync"));
  api.mem_free_async = reinterpret_cast<decltype(api.mem_free_async)>(dlsym(library, "cuMemFreeAsync"));
  if (api.mem_alloc_async == nullptr || api.mem_free_async == nullptr) api.mem_alloc_async = nullptr;
  return api;
}

}  // namespace

void DriverApi::check(Result status, const char* call) const {
  if (status == 0) return;
  const char* text = nullptr;
  if (get_error_string == nullptr || get_error_string(status, &text) != 0 || text == nullptr) text = "unknown";
  throw DriverError(std::string("CUDA driver: ") + call + " failed with error " + std::to_string(status) + " (" +
                    text + ")");
}

const DriverApi& driver_api() {
  static std::once_flag once;
  static DriverApi api;
  static std::string failure;
  std::call_once(once, [] {
    try {
      api = load();
    } catch (const DriverError& error) {
      failure = error.what();
    }
  });
  if (!failure.empty()) throw DriverError(failure);
  return api;
}

}  // namespace torch_metallib::cuda

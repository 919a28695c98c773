"""The CUDA driver API, reached at run time: ``libcuda.so.1`` through ctypes, so the
extension builds and imports on machines without CUDA (as Triton's driver does).

Only what the backend needs: load a module from PTX (the driver compiles it for the GPU
it runs on) or from a cubin (an archive's, for exactly this GPU), look up its kernel and
the kernel's limits, and launch it on a stream. Calls run in the context torch's CUDA
runtime made current (its primary context for the device).
"""

import ctypes
import functools
import threading
from typing import Optional, Sequence

from ...errors import KernelExecutionError, UnsupportedDeviceError

__all__ = ["driver", "Driver", "ParameterBuffer", "MAX_THREADS_PER_BLOCK", "SHARED_SIZE_BYTES",
           "MAX_DYNAMIC_SHARED_SIZE_BYTES"]

# CUfunction_attribute
MAX_THREADS_PER_BLOCK = 0
SHARED_SIZE_BYTES = 1
MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
# CUdevice_attribute
_COMPUTE_MAJOR, _COMPUTE_MINOR = 75, 76
_SHARED_PER_BLOCK_OPTIN = 97
# cuLaunchKernel's `extra` keys
_PARAM_END, _PARAM_BUFFER_POINTER, _PARAM_BUFFER_SIZE = 0, 1, 2


class Driver:
    def __init__(self):
        try:
            self._cuda = ctypes.CDLL("libcuda.so.1")
        except OSError as error:
            raise UnsupportedDeviceError(f"the CUDA backend needs NVIDIA's driver (libcuda.so.1): {error}") from None
        self._check(self._cuda.cuInit(0), "cuInit")
        self._cuda.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
        self._primary = {}  # device index -> its primary context

    def _check(self, status: int, call: str) -> None:
        if status != 0:
            text = ctypes.c_char_p()
            self._cuda.cuGetErrorString(status, ctypes.byref(text))
            raise KernelExecutionError(f"CUDA driver: {call} failed with error {status} "
                                       f"({(text.value or b'unknown').decode()})")

    def use_device(self, index: int) -> None:
        """Makes device `index`'s primary context (torch's) current on this thread."""
        current = ctypes.c_void_p()
        self._check(self._cuda.cuCtxGetCurrent(ctypes.byref(current)), "cuCtxGetCurrent")
        primary = self._primary.get(index)
        if primary is not None and current.value == primary.value:
            return
        device = ctypes.c_int()
        self._check(self._cuda.cuDeviceGet(ctypes.byref(device), index), "cuDeviceGet")
        context = ctypes.c_void_p()
        self._check(self._cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device), "cuDevicePrimaryCtxRetain")
        if primary is not None:  # retained once per device and process
            self._cuda.cuDevicePrimaryCtxRelease(device)
        self._primary[index] = context
        self._check(self._cuda.cuCtxSetCurrent(context), "cuCtxSetCurrent")

    def primary_context(self, index: int) -> int:
        """The handle of device `index`'s primary context (after use_device made it current)."""
        self.use_device(index)
        return self._primary[index].value

    def device_attribute(self, index: int, attribute: int) -> int:
        value, device = ctypes.c_int(), ctypes.c_int()
        self._check(self._cuda.cuDeviceGet(ctypes.byref(device), index), "cuDeviceGet")
        self._check(self._cuda.cuDeviceGetAttribute(ctypes.byref(value), attribute, device), "cuDeviceGetAttribute")
        return value.value

    def compute_capability(self, index: int) -> int:
        """e.g. 90 for an H100."""
        return 10 * self.device_attribute(index, _COMPUTE_MAJOR) + self.device_attribute(index, _COMPUTE_MINOR)

    @functools.lru_cache(maxsize=None)
    def max_shared_per_block(self, index: int) -> int:
        """The most shared memory one block may use (opting in past 48 KB)."""
        return self.device_attribute(index, _SHARED_PER_BLOCK_OPTIN)

    def load(self, ptx: str, entry: str, threads_per_block: int = 0) -> ctypes.c_void_p:
        """The kernel `entry` of a module loaded from `ptx` (in the current context); where
        `threads_per_block` is given, compiled to run blocks of that many threads (fewer
        registers per thread: CU_JIT_THREADS_PER_BLOCK)."""
        module, function = ctypes.c_void_p(), ctypes.c_void_p()
        log = ctypes.create_string_buffer(8192)
        # CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES[, CU_JIT_THREADS_PER_BLOCK]
        keys = [5, 6] + ([1] if threads_per_block else [])
        settings = [ctypes.cast(log, ctypes.c_void_p), ctypes.c_void_p(len(log))]
        settings += [ctypes.c_void_p(threads_per_block)] if threads_per_block else []
        options = (ctypes.c_int * len(keys))(*keys)
        values = (ctypes.c_void_p * len(keys))(*settings)
        status = self._cuda.cuModuleLoadDataEx(ctypes.byref(module), ctypes.c_char_p(ptx.encode()), len(keys), options,
                                               values)
        if status != 0:
            self._check(status, f"cuModuleLoadDataEx ({log.value.decode(errors='replace').strip()[:500]})")
        self._check(self._cuda.cuModuleGetFunction(ctypes.byref(function), module, entry.encode()),
                    "cuModuleGetFunction")
        return function

    def load_cubin(self, image: bytes, entry: str) -> ctypes.c_void_p:
        """The kernel `entry` of a module loaded from cubin `image` (in the current context;
        archived.cubin_problem checked its headers first). Raises KernelExecutionError with
        the driver's error where it refuses the image or has no such kernel."""
        module, function = ctypes.c_void_p(), ctypes.c_void_p()
        self._check(self._cuda.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(image)), "cuModuleLoadData")
        status = self._cuda.cuModuleGetFunction(ctypes.byref(function), module, entry.encode())
        if status != 0:
            self._cuda.cuModuleUnload(module)
            self._check(status, f"cuModuleGetFunction ({entry})")
        return function

    def attribute(self, function, attribute: int) -> int:
        value = ctypes.c_int()
        self._check(self._cuda.cuFuncGetAttribute(ctypes.byref(value), attribute, function), "cuFuncGetAttribute")
        return value.value

    def set_attribute(self, function, attribute: int, value: int) -> None:
        self._check(self._cuda.cuFuncSetAttribute(function, attribute, value), "cuFuncSetAttribute")

    def launch(self, function, blocks: Sequence[int], threads: Sequence[int], shared: int, stream: int,
               parameters: "ParameterBuffer") -> None:
        """Launches `function` with the `parameters` packed in their buffer (the driver copies
        them before it returns)."""
        self._check(self._cuda.cuLaunchKernel(function, blocks[0], blocks[1], blocks[2], threads[0], threads[1],
                                              threads[2], shared, stream, None, parameters.extra), "cuLaunchKernel")


class ParameterBuffer:
    """A kernel's launch parameters packed in one buffer, as the kernel lays them out, and
    cuLaunchKernel's `extra` array pointing at it (CU_LAUNCH_PARAM_BUFFER_POINTER): ~1 us a
    launch, where a ctypes pointer per parameter cost ~20. Made once per kernel; one launch
    at a time fills it (`lock`)."""

    def __init__(self, size: int):
        self.buffer = ctypes.create_string_buffer(max(size, 1))
        self._size = ctypes.c_size_t(size)
        self.extra = (ctypes.c_void_p * 5)(_PARAM_BUFFER_POINTER, ctypes.addressof(self.buffer), _PARAM_BUFFER_SIZE,
                                           ctypes.addressof(self._size), _PARAM_END)
        self.lock = threading.Lock()


_driver: Optional[Driver] = None
_lock = threading.Lock()


def driver() -> Driver:
    """The process's driver, loaded on first use."""
    global _driver
    with _lock:
        if _driver is None:
            _driver = Driver()
        return _driver

"""The CUDA backend: kernels on ``cuda`` tensors, launched on torch's current CUDA stream.

It replays the binding plan's command list (csrc/dispatch/command_list.h) as one kernel
launch per block shape: buffers are global pointers (storage + byte offset), the bytes a
call packed (values, structs, argument buffers, which hold device addresses already) are
copied to the device in one piece, and ``[[threadgroup(n)]]`` lengths become offsets into
the block's dynamic shared memory. ``dispatchThreads`` grids whose size is not a multiple
of the threadgroup get their edge threadgroups in launches of their own with the smaller
block, so every CUDA block is exactly a Metal threadgroup. A kernel that cannot tell how
the grid is cut into threadgroups (no threadgroup memory, barriers or SIMD-group functions,
and only grid builtins) runs in blocks of GRID_ONLY_BLOCK threads whatever group the call
names: MLX sizes its groups for Apple GPUs (1,024 threads), which is slower here; where
its code allows, each CUDA thread runs 4 consecutive grid positions (coarsening.py).

PTX is made once per (function HASH, constant values, GPU architecture, the package's code:
cache/fingerprint.py) and kept in the disk cache; the driver loads it once per device and process.
An archive's cubin for exactly the device's architecture is loaded instead where there is
one (no compile in the driver either); any refusal falls back to the PTX (archived.py).
"""

import collections
import ctypes
import functools
import hashlib
import itertools
import struct
import threading
import time
from typing import Dict, List, Tuple

import llvmlite
import torch

from ... import _C
from ...cache.archives import warn_once
from ...cache.disk_cache import cache_directory, read_entry, write_entry
from ...dispatch.backend import Backend
from ...errors import DispatchError, KernelExecutionError
from ...cache.fingerprint import code_fingerprint
from torch_metallib import diagnostics
from . import driver as cuda_driver
from .coarsening import COARSENING
from .lowering import entry_name
from .ptx import kernel_ptx
from .archived import archived_cubin, archived_ptx, cubin_problem

__all__ = ["CudaBackend"]

_BYTE_COPIES = 1024  # the bytes of this many recent calls stay on the device
# (device, each bytes command's data) -> (their device copy, the stream it was made on)
_byte_copies: "collections.OrderedDict" = collections.OrderedDict()
_byte_lock = threading.Lock()
_DEFAULT_SHARED = 48 * 1024  # dynamic shared memory a launch may use without opting in
_MAX_BLOCKS = (2 ** 31 - 1, 65535, 65535)
# Builtins that do not depend on how the grid is cut into threadgroups.
_GRID_BUILTINS = {"thread_position_in_grid", "threads_per_grid", "grid_size", "grid_origin",
                  "thread_execution_width", "threads_per_simdgroup"}
GRID_ONLY_BLOCK = 256  # a 1-D grid-only kernel's block (H100: 0.80x torch's speed at 1,024, 0.89x at 256)


class CudaKernel:
    """One function with one set of constant values: its PTX and, per device, its kernel."""

    def __init__(self, function, constants: tuple, grid_only: bool):
        self.function = function
        self.grid_only = grid_only  # it cannot tell its threadgroups apart: the block is ours to choose
        self.constants = constants
        self._ptx: Dict[str, str] = {}
        self._loaded: Dict[Tuple[int, int], Tuple[ctypes.c_void_p, int, int, int]] = {}  # (device, threads) -> loaded()
        self._dynamic_allowed: Dict[int, int] = {}
        self._lock = threading.Lock()
        self.symbol = "k" + function.hash[:16]
        # The entry's parameters: the bound arguments in IR position order (a global pointer, or
        # a u32 offset into shared memory per threadgroup argument), then LAUNCH_PARAMETERS.
        bound = sorted((a for a in function.arguments if not a.is_builtin), key=lambda a: a.position)
        self.slots = {(a.kind == "threadgroup", a.binding): slot for slot, a in enumerate(bound)}
        self.parameters = struct.Struct(_parameter_layout([a.kind == "threadgroup" for a in bound]))
        self._packed = cuda_driver.ParameterBuffer(self.parameters.size)

    def ptx(self, arch: str) -> str:
        text = self._ptx.get(arch)
        if text is None:
            key = f"cuda-ptx code {code_fingerprint('cuda')} llvmlite {llvmlite.__version__} {arch} " \
                  f"{self.function.hash} {sorted(self.constants)!r} grid-only {self.grid_only}"
            directory = cache_directory("cuda")
            path = f"{directory}/{hashlib.sha256(key.encode()).hexdigest()}" if directory else None
            started = time.perf_counter()
            source = "loaded from the disk cache"
            payload = None if diagnostics.dumps() else archived_ptx(self.function, self.constants, arch, self.grid_only)
            if payload is not None:
                source, path = "loaded from an archive", None
            elif path and not diagnostics.dumps():
                payload = read_entry(path, key)
            if payload is None:
                source = "compiled"
                with diagnostics.dumping(self.function.name, hashlib.sha256(key.encode()).hexdigest()):
                    payload = kernel_ptx(self.function, dict(self.constants), self.symbol, arch, self.grid_only).encode()
                if path:
                    write_entry(path, key, payload)
            diagnostics.get_logger().info("cuda: %s: %s (%s) in %.3f s", self.function.name, source, arch,
                                          time.perf_counter() - started)
            text = self._ptx[arch] = payload.decode()
        return text

    def loaded(self, device: int, threads: int = 0):
        """(kernel, max threads per block, static shared bytes, grid positions per thread) on
        `device`; where `threads` is given, compiled for blocks of that many threads."""
        with self._lock:
            found = self._loaded.get((device, threads))
            if found is None:
                driver = cuda_driver.driver()
                capability = driver.compute_capability(device)
                # An archive's cubin is assembled for its default registers per thread: blocks
                # larger than it allows take the PTX, compiled for them.
                cubin = None if threads else self._from_cubin(driver, f"sm_{capability}")
                if cubin is not None:
                    kernel, coarsening = cubin
                else:
                    ptx = self.ptx(f"sm_{min(capability, 90)}")
                    # The PTX's entry says whether the lowering coarsened the kernel (coarsening.py).
                    coarsening = COARSENING if f".entry {entry_name(self.symbol, COARSENING)}(" in ptx else 1
                    kernel = driver.load(ptx, entry_name(self.symbol, coarsening), threads)
                found = self._loaded[(device, threads)] = (
                    kernel, driver.attribute(kernel, cuda_driver.MAX_THREADS_PER_BLOCK),
                    driver.attribute(kernel, cuda_driver.SHARED_SIZE_BYTES), coarsening)
            return found

    def _from_cubin(self, driver, arch: str):
        """(kernel, grid positions per thread) from an archive's cubin for exactly `arch`
        (SASS runs only there); None where no archive has one or the driver refuses it
        (warned once per kernel: its PTX is loaded instead, from the archive or compiled)."""
        if diagnostics.dumps():  # dumps are of a compile
            return None
        started = time.perf_counter()
        cubin = archived_cubin(self.function, self.constants, arch, self.grid_only)
        if cubin is None:
            return None
        entries = {entry_name(self.symbol): 1, entry_name(self.symbol, COARSENING): COARSENING}
        problem = None if cubin.entry in entries else f"its entry {cubin.entry!r} is not this kernel's"
        problem = problem or cubin_problem(cubin.image)
        if problem is None:
            try:
                kernel = driver.load_cubin(cubin.image, cubin.entry)
            except KernelExecutionError as error:
                problem = str(error)
        if problem is not None:
            warn_once((cubin.archive, self.function.name, arch, "cubin"),
                      f"archive {cubin.archive}: {self.function.name}: its {arch} cubin (ptxas {cubin.ptxas}) "
                      f"was refused: {problem}. Loading the kernel's PTX instead; rebuild the archive with "
                      f"`python -m torch_metallib precompile` (a ptxas no newer than this driver supports)")
            return None
        diagnostics.get_logger().info("cuda: %s: %s (%s) in %.3f s", self.function.name, "loaded from an archive",
                                      f"{arch} cubin, ptxas {cubin.ptxas}", time.perf_counter() - started)
        return kernel, entries[cubin.entry]

    def launch(self, plan) -> None:
        buffers, data, threadgroup, grid, group = plan.launch_record
        device = _device(plan.device)
        index = device.index
        driver = cuda_driver.driver()
        driver.use_device(index)
        kernel, max_threads, static_shared, coarsening = self.loaded(index)
        name = self.function.name
        threads = group[0] * group[1] * group[2]
        if threads > max_threads:
            # Compiled for the registers of smaller blocks: again, for blocks this large (Metal
            # runs the threadgroups its device allows; PyTorch's sorts use 1,024 threads).
            kernel, max_threads, static_shared, coarsening = self.loaded(index, threads)
        if threads > max_threads:
            raise DispatchError(f"{name}: group_size {tuple(group)} is {threads} threads; this kernel allows at most "
                                f"{max_threads} on this GPU (CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK). "
                                f"Pass a smaller group_size")
        stream = _raw_stream(index)
        values = [0] * len(self.slots)  # unbound: a null pointer
        for binding, address in buffers:
            values[self.slots[(False, binding)]] = address
        self._bytes(data, device, stream, values)
        dynamic = 0
        for binding, length in threadgroup:
            values[self.slots[(True, binding)]] = dynamic
            dynamic += length
        limit = driver.max_shared_per_block(index)
        if dynamic + static_shared > limit:
            raise DispatchError(f"{name}: threadgroup memory of {dynamic + static_shared} bytes ({dynamic} set by the "
                                f"call, {static_shared} declared by the kernel) exceeds this GPU's {limit} per block. "
                                f"Pass smaller threadgroup_memory lengths")
        if dynamic + static_shared > _DEFAULT_SHARED and self._dynamic_allowed.get(index, 0) < dynamic:
            driver.set_attribute(kernel, cuda_driver.MAX_DYNAMIC_SHARED_SIZE_BYTES, dynamic)
            self._dynamic_allowed[index] = dynamic
        # CUDA's threads: the grid's, or where each runs `coarsening` positions along x, fewer.
        cuda_grid = grid if coarsening == 1 else (-(-grid[0] // coarsening), grid[1], grid[2])
        group = launch_group(cuda_grid, group, self.grid_only)
        packed = self._packed
        with packed.lock:
            for blocks, block, base in _launches(cuda_grid, group):
                self.parameters.pack_into(packed.buffer, 0, *values, *grid, *group, *base)
                driver.launch(kernel, blocks, block, dynamic, stream, packed)

    def native_launcher(self, plan):
        """A `_C.CudaLauncher` that launches plans like `plan` as `launch` just did (it keeps
        device copies of the bytes commands itself)."""
        index = _device(plan.device).index
        kernel, max_threads, static_shared, coarsening = self.loaded(index)
        _, _, _, _, group = plan.launch_record
        threads = group[0] * group[1] * group[2]
        if threads > max_threads and not self.grid_only:  # as launch() reloads it
            kernel, max_threads, static_shared, coarsening = self.loaded(index, threads)
        context = cuda_driver.driver().primary_context(index)
        slots = [key for key, _ in sorted(self.slots.items(), key=lambda item: item[1])]
        return _C.CudaLauncher(plan, index, context, kernel.value, max_threads, static_shared,
                               self._dynamic_allowed.get(index, 0), coarsening, self.grid_only, GRID_ONLY_BLOCK,
                               slots, _raw_stream)

    def _bytes(self, records, device, stream: int, values) -> None:
        """Puts the bytes commands (`records`: [(binding, bytes)]) in device memory, in one
        piece (256-byte aligned parts): the same bytes as an earlier call's are reused
        (kernels do not write them), new ones copied through pinned memory in stream order
        (no wait for the GPU); fills `values` with their addresses. `stream`: the launch's."""
        if not records:
            return
        starts, end = [], 0
        for _, data in records:
            end += -end % 256
            starts.append(end)
            end += len(data)
        key = (device.index, tuple(data for _, data in records))
        with _byte_lock:
            found = _byte_copies.get(key)
            if found is None:
                blob = bytearray(end)
                for (_, data), start in zip(records, starts):
                    blob[start:start + len(data)] = data
                # torch's pinned-memory cache keeps the staging block until the copy has run.
                staging = torch.empty(len(blob), dtype=torch.uint8, pin_memory=True)
                staging.copy_(torch.frombuffer(blob, dtype=torch.uint8))
                found = _byte_copies[key] = (staging.to(device, non_blocking=True), stream)
                if len(_byte_copies) > _BYTE_COPIES:
                    _byte_copies.popitem(last=False)
            else:
                _byte_copies.move_to_end(key)
        copy, made_on = found
        if stream != made_on:  # on its own stream the allocator orders reuse after this launch already
            copy.record_stream(torch.cuda.current_stream(device))  # not reused while this launch may read it
        base = copy.data_ptr()
        for (binding, _), start in zip(records, starts):
            values[self.slots[(False, binding)]] = base + start


def _parameter_layout(threadgroup: List[bool]) -> str:
    """The struct format of an entry's parameters as the kernel lays them out (each at its
    natural alignment): per bound argument a u64 pointer or (`threadgroup`) a u32 offset,
    then the 9 u32 LAUNCH_PARAMETERS."""
    layout, offset = "<", 0
    for is_offset in threadgroup + [True] * 9:
        size = 4 if is_offset else 8
        layout += "x" * (-offset % size) + ("I" if is_offset else "Q")
        offset += -offset % size + size
    return layout


def grid_only(function, cooperative: bool, serial: bool) -> bool:
    """Whether kernel `function` computes the same whatever threadgroups its grid is cut
    into: no threadgroup memory, barriers or SIMD-group functions (`cooperative`), no
    threadgroup variables (`serial`), only grid builtins."""
    return not (cooperative or serial) and all(a.builtin in _GRID_BUILTINS for a in function.arguments if a.is_builtin)


def launch_group(grid, group, ours_to_choose: bool):
    """The threadgroup a launch uses: `group`, or where the block is `ours_to_choose` (a
    grid-only kernel) and the grid 1-D, GRID_ONLY_BLOCK threads (the grid's own size if smaller)."""
    if ours_to_choose and grid[1] == grid[2] == 1:
        return (max(1, min(GRID_ONLY_BLOCK, grid[0])), 1, 1)
    return tuple(group)


@functools.lru_cache(maxsize=64)
def _device(name: str) -> torch.device:
    device = torch.device(name)
    return device if device.index is not None else torch.device("cuda", torch.cuda.current_device())


# The handle of torch's current CUDA stream on a device index (its raw accessor where torch
# has it: a Stream object per call costs microseconds).
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
    lambda index: torch.cuda.current_stream(index).cuda_stream)


@functools.lru_cache(maxsize=256)
def _launches(grid, group) -> List[Tuple[Tuple[int, int, int], Tuple[int, int, int], Tuple[int, int, int]]]:
    """(blocks, block, first threadgroup) per launch: whole threadgroups together, the
    smaller ones at the grid's edge on their own, no launch over CUDA's grid limits
    (`grid` and `group` tuples; the list is shared: not to be changed)."""
    axes = []
    for axis in range(3):
        full, rest = divmod(grid[axis], group[axis])
        parts = []
        for start in range(0, full, _MAX_BLOCKS[axis]):
            parts.append((min(full - start, _MAX_BLOCKS[axis]), group[axis], start))
        if rest:
            parts.append((1, rest, full))
        axes.append(parts)
    return [((x[0], y[0], z[0]), (x[1], y[1], z[1]), (x[2], y[2], z[2])) for z, y, x in
            itertools.product(axes[2], axes[1], axes[0])]


class CudaBackend(Backend):
    device_type = "cuda"

    def prepare(self, function, state, constants: tuple, checked: bool = False):
        # Checked execution is a CPU-backend feature: calls run unchecked.
        key = ("cuda", constants)
        kernel = state.prepared.get(key)
        if kernel is None:
            kernel = state.prepared[key] = CudaKernel(function, constants,
                                                      grid_only(function, state.cooperative, state.serial))
        return kernel

    def run(self, function, prepared, plan) -> None:
        prepared.launch(plan)

    def launcher(self, function, prepared, plan, checked: bool):
        return prepared.native_launcher(plan)

"""The CPU backend: AIR lowered to host code (see jit, lowering), run on torch's thread pool."""

import torch

from ... import _C
from ...dispatch.backend import Backend
from .jit import compile_kernel
from .schedule import current_schedule

__all__ = ["CpuBackend"]


class CpuBackend(Backend):
    device_type = "cpu"

    def prepare(self, function, state, constants: tuple):
        mode, seed = current_schedule()
        parallel = mode == "parallel"
        # Permuted runs need every thread as a coroutine, whatever the kernel does.
        cooperative = state.cooperative or mode == "permuted"
        key = ("cpu", constants, cooperative)
        compiled = state.prepared.get(key)
        # A kernel with threadgroup variables needs a loaded copy per worker thread.
        copies = torch.get_num_threads() if state.serial and parallel else 1
        if compiled is None or len(compiled.launchers) < copies:
            compiled = state.prepared[key] = compile_kernel(function, constants, state.serial, cooperative, copies)
        return compiled, mode, seed

    def run(self, function, prepared, plan) -> None:
        compiled, mode, seed = prepared
        parallel = mode == "parallel"
        if compiled.cooperative:
            _C.launch_cpu_cooperative(plan, compiled.launchers, compiled.serial, function.name,
                                      parallel, mode == "permuted", seed)
        else:
            _C.launch_cpu(plan, compiled.launchers, compiled.serial, parallel)

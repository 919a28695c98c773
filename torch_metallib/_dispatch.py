"""Calling a kernel: reflection -> binding plan (C++) -> backend.

``KernelFunction.__call__`` lands here. What a call needs from reflection is kept as
plain data in memory and on disk (``<cache>/calls``), keyed by the function's HASH. The
plan (``_C.KernelSpec.bind``) validates the whole call before anything runs; the CPU
backend then compiles the kernel for the call's function-constant values (once; see
_cpu_jit) and runs it on torch's thread pool.
"""

import json
import os

import torch

from . import _C
from ._cpu_jit import compile_kernel
from ._disk_cache import cache_directory, read_entry, write_entry
from ._errors import UnsupportedKernelError
from ._schedule import current_schedule

__all__ = ["DispatchState", "dispatch_state", "call"]

CALL_RECORD_VERSION = 4  # bump when call_record's fields change


class DispatchState:
    """What calling a function needs, built once per KernelFunction."""

    __slots__ = ("spec", "problem", "serial", "cooperative", "compiled")

    def __init__(self, spec, problem: str, serial: bool, cooperative: bool):
        self.spec = spec                # _C.KernelSpec, None when the function cannot run here
        self.problem = problem          # why the CPU backend cannot run it, or ""
        self.serial = serial            # threadgroup variables: a compiled copy per worker
        self.cooperative = cooperative  # barriers / SIMD-group functions: threads as coroutines
        self.compiled = {}              # (constant values, as coroutines) -> _cpu_jit.CompiledKernel


def call_record(function) -> dict:
    """The plain data calling needs from reflection: the bindable arguments, constants,
    max threads per threadgroup, CPU support and serial execution."""
    reflection = function.reflection
    fields = ("name", "position", "kind", "binding", "address_space", "access", "type_name",
              "type_size", "buffer_size", "function_constant", "unused")
    return {
        "parameter_count": len(reflection.arguments),
        "arguments": [{f: getattr(a, f) for f in fields} for a in reflection.arguments if not a.is_builtin],
        "constants": [[c.name, c.type, c.index, c.required] for c in reflection.function_constants],
        "max_threads": reflection.max_total_threads_per_threadgroup or 0,
        "static_threadgroup_bytes": reflection.threadgroup_memory_static,
        "problem": cpu_support_problem(function),
        "serial": bool(reflection.threadgroup_variables),
        # Threadgroup-memory arguments need a buffer per threadgroup: the cooperative runner's.
        "cooperative": reflection.uses_barriers or reflection.uses_simdgroup_ops
        or any(a.kind == "threadgroup" for a in reflection.arguments),
    }


def _cached_call_record(function) -> dict:
    """call_record, from the disk cache when this function (by HASH) was seen before: a
    warm start then skips parsing the bitcode."""
    directory = cache_directory("calls")
    path = os.path.join(directory, f"{function.hash}-{function.type}-v{CALL_RECORD_VERSION}.json") \
        if directory else None
    payload = read_entry(path) if path else None
    if payload is not None:
        return json.loads(payload)
    record = call_record(function)
    if path:
        write_entry(path, json.dumps(record).encode())
    return record


def dispatch_state(function) -> DispatchState:
    if function.type != "kernel":
        return DispatchState(None, f"it is a {function.type} function; only kernel functions can be "
                                   f"called", False, False)
    record = _cached_call_record(function)
    spec = None if record["problem"] else _C.KernelSpec(
        function.name, record["parameter_count"], record["arguments"],
        [tuple(c) for c in record["constants"]], record["max_threads"], record["static_threadgroup_bytes"])
    return DispatchState(spec, record["problem"], record["serial"], record["cooperative"])


def cpu_support_problem(function) -> str:
    """Why the CPU backend cannot run kernel `function` yet ("" if it can)."""
    reflection = function.reflection
    kinds = sorted({a.kind for a in reflection.arguments if a.kind not in ("buffer", "threadgroup", "builtin")})
    if kinds:
        return (f"it takes {', '.join(kinds)} arguments, which the CPU backend does not bind yet. "
                f"Run it on a Mac with MPS tensors")
    return ""


def call(function, args: tuple, kwargs: dict, threads, group_size, constants, threadgroup_memory) -> None:
    state = function._dispatch_state()
    if state.problem:
        raise UnsupportedKernelError(f"{function.name}: cannot run on the CPU: {state.problem}")
    plan = state.spec.bind(args, kwargs, threads, group_size, constants, threadgroup_memory)
    if plan.device != "cpu":
        raise UnsupportedKernelError(
            f"{function.name}: tensors are on {plan.device}; this build runs kernels on the CPU only "
            f"(the MPS backend needs macOS). Pass CPU tensors")
    mode, seed = current_schedule()
    parallel = mode == "parallel"
    # Permuted runs need every thread as a coroutine, whatever the kernel does.
    cooperative = state.cooperative or mode == "permuted"
    key = (plan.constants, cooperative)
    compiled = state.compiled.get(key)
    copies = torch.get_num_threads() if state.serial and parallel else 1
    if compiled is None or len(compiled.launchers) < copies:
        compiled = state.compiled[key] = compile_kernel(function, plan.constants, state.serial, cooperative, copies)
    if cooperative:
        _C.launch_cpu_cooperative(plan, compiled.launchers, compiled.serial, function.name,
                                  parallel, mode == "permuted", seed)
    else:
        _C.launch_cpu(plan, compiled.launchers, compiled.serial, parallel)

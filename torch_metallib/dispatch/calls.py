"""Calling a kernel: reflection -> binding plan (C++) -> backend.

``KernelFunction.__call__`` lands here for a function's first call, and later calls come
here with their plan when no native launcher accepts it (``_C.call``: checked execution,
debug schedules, new constant values). The plan (``_C.KernelSpec.bind``) validates the
whole call before anything runs; the backend chosen by the tensors' device then prepares
the function for the plan's function-constant values, runs the plan, and may leave a
native launcher that later calls like it use without Python (dispatch/launcher.h).
"""

from .. import _C
from ..errors import UnsupportedKernelError
from .backend import backend_for
from .call_record import cached_call_record
from .checked_mode import block_storage_bounds, checked_requested, storage_bounds_requested

__all__ = ["DispatchState", "dispatch_state", "call"]


class DispatchState:
    """What calling a function needs, built once per KernelFunction."""

    __slots__ = ("spec", "problem", "serial", "cooperative", "prepared", "names", "launchers")

    def __init__(self, spec, problem: str, serial: bool, cooperative: bool, names=frozenset()):
        self.spec = spec                # _C.KernelSpec, None when the function cannot be called
        self.problem = problem          # why it cannot be called, or ""
        self.serial = serial            # it has threadgroup variables
        self.cooperative = cooperative  # barriers / SIMD-group functions / threadgroup arguments
        self.prepared = {}              # the backends' per-function caches, keyed as they choose
        self.names = names              # its bindable arguments' names (for checked(storage_bounds=))
        self.launchers = _C.Launchers() if spec is not None else None  # the backends' native launchers


def dispatch_state(function) -> DispatchState:
    if function.type != "kernel":
        return DispatchState(None, f"it is a {function.type} function; only kernel functions can be "
                                   f"called", False, False)
    record = cached_call_record(function)
    spec = None if record["problem"] else _C.KernelSpec(
        function.name, record["parameter_count"], record["arguments"],
        [tuple(c) for c in record["constants"]], record["max_threads"], record["static_threadgroup_bytes"],
        record["predicates"])
    return DispatchState(spec, record["problem"], record["serial"], record["cooperative"],
                         frozenset(a["name"] for a in record["arguments"]))


def call(function, args: tuple, kwargs: dict, threads, group_size, constants, threadgroup_memory,
         checked=None, storage_bounds=None) -> None:
    state = function._dispatch_state()
    if state.problem:
        raise UnsupportedKernelError(f"{function.name}: cannot be called: {state.problem}")
    if block_storage_bounds():
        storage_bounds = storage_bounds_requested(storage_bounds, state.names)
    plan = state.spec.bind(args, kwargs, threads, group_size, constants, threadgroup_memory, storage_bounds)
    run_plan(function, plan, plan.device, checked)


def run_plan(function, plan, device: str, checked=None) -> None:
    """Runs a bound plan on the backend for `device` (also how an operator defined with
    ops.define reaches a backend other than its native CPU path), and keeps the backend's
    native launcher for calls like it."""
    backend = backend_for(device, function.name)
    state = function._dispatch_state()
    checks = backend.checks and checked_requested(checked)
    prepared = backend.prepare(function, state, plan.constants, checks)
    backend.run(function, prepared, plan)
    state.launchers.forget_last()
    if not state.launchers.covers(plan):
        launcher = backend.launcher(function, prepared, plan, checks)
        if launcher is not None:
            state.launchers.add(launcher)

"""The CPU backend: AIR lowered to host code (see jit, lowering), run on torch's thread pool."""

import torch

from ... import _C
from ...dispatch.backend import Backend
from ...dispatch.checked_mode import initcheck_requested
from .jit import compile_kernel
from .schedule import current_schedule

__all__ = ["CpuBackend"]


class CpuBackend(Backend):
    device_type = "cpu"
    checks = True

    def prepare(self, function, state, constants: tuple, checked: bool = False):
        mode, seed = current_schedule()
        parallel = mode == "parallel"
        # Permuted runs need every thread as a coroutine, whatever the kernel does; other
        # cooperative runs take lane loops where the kernel allows.
        cooperative = state.cooperative or mode == "permuted"
        lanes = cooperative and mode != "permuted" and not checked
        initcheck = checked and initcheck_requested()
        key = ("cpu", constants, cooperative, checked, lanes, initcheck)
        compiled = state.prepared.get(key)
        # A kernel with threadgroup variables needs a loaded copy per worker thread.
        copies = torch.get_num_threads() if state.serial and parallel else 1
        if compiled is None or len(compiled.launchers) < copies:
            compiled = state.prepared[key] = compile_kernel(function, constants, state.serial, cooperative, copies,
                                                            checked=checked, lanes=lanes, initcheck=initcheck)
        state.prepared["scheme"] = compiled.scheme  # KernelFunction.cpu_scheme
        described = None
        if checked:  # built once per function, like the compiled code
            described = state.prepared.get("described") or state.prepared.setdefault(
                "described", _described_parameters(function))
        return compiled, mode, seed, described

    def run(self, function, prepared, plan) -> None:
        compiled, mode, seed, described = prepared
        parallel = mode == "parallel"
        if compiled.lanes:
            _C.launch_cpu_lanes(plan, compiled.launchers, compiled.serial, function.name, parallel)
        elif compiled.cooperative:
            _C.launch_cpu_cooperative(plan, compiled.launchers, compiled.serial, function.name,
                                      parallel, mode == "permuted", seed, described)
        else:
            _C.launch_cpu(plan, compiled.launchers, compiled.serial, parallel, described, function.name)


    def launcher(self, function, prepared, plan, checked: bool):
        compiled, mode, _, _ = prepared
        if checked or mode != "parallel":  # the full path decides these per call
            return None
        return _C.CpuLauncher(plan, compiled.launchers, compiled.serial, compiled.scheme, function.name)


_SPACES = {"device": 1, "constant": 2, "threadgroup": 3}


def _described_parameters(function) -> list:
    """(description, address space) per IR parameter, for checked execution's messages."""
    described = [("", 0)] * len(function.reflection.arguments)
    for a in function.reflection.arguments:
        if not a.is_builtin:
            kind = f"{a.kind}({a.binding})" if a.binding is not None else a.kind
            pointer = (f"{kind} holding a {a.pointee_address_space} {a.pointee_type or 'void'}*" if a.holds_pointer
                       else f"{kind}, {a.address_space} {a.type_name}*")
            described[a.position] = (f"argument {a.position} '{a.name}' ({pointer})", _SPACES.get(a.address_space, 0))
    return described

"""Calling a kernel: reflection -> binding plan (C++) -> backend.

``KernelFunction.__call__`` lands here. The plan (``_C.KernelSpec.bind``) validates the
whole call before anything runs; the CPU backend then compiles the kernel for the call's
function-constant values (once; see _cpu_jit) and runs it on torch's thread pool.
"""

from . import _C
from ._cpu_jit import compile_kernel
from ._errors import UnsupportedKernelError

__all__ = ["kernel_spec", "call"]


def kernel_spec(function) -> "_C.KernelSpec":
    """The native argument table of `function`, built from its reflection."""
    reflection = function.reflection
    arguments = [a._asdict() for a in reflection.arguments if not a.is_builtin]
    constants = [(c.name, c.type, c.index, c.required) for c in reflection.function_constants]
    return _C.KernelSpec(function.name, len(reflection.arguments), arguments, constants,
                         reflection.max_total_threads_per_threadgroup or 0)


def cpu_support_problem(function) -> str:
    """Why the CPU backend cannot run `function` yet ("" if it can)."""
    if function.type != "kernel":
        return f"it is a {function.type} function; only kernel functions can be called"
    reflection = function.reflection
    if reflection.uses_barriers or reflection.uses_simdgroup_ops:
        used = [name for name in reflection.intrinsics
                if name.startswith(("air.wg.barrier", "air.simdgroup", "air.simd_", "air.quad_"))]
        return (f"its threads cooperate ({', '.join(used)}); the CPU backend runs only kernels "
                f"without barriers and SIMD-group functions so far. Run it on a Mac with MPS tensors")
    kinds = sorted({a.kind for a in reflection.arguments if a.kind not in ("buffer", "builtin")})
    if kinds:
        return (f"it takes {', '.join(kinds)} arguments, which the CPU backend does not bind yet. "
                f"Run it on a Mac with MPS tensors")
    return ""


def call(function, args: tuple, kwargs: dict, threads, group_size, constants) -> None:
    spec, problem, compiled_by_constants = function._dispatch_state()
    if problem:
        raise UnsupportedKernelError(f"{function.name}: cannot run on the CPU: {problem}")
    plan = spec.bind(args, kwargs, threads, group_size, constants)
    if plan.device != "cpu":
        raise UnsupportedKernelError(
            f"{function.name}: tensors are on {plan.device}; this build runs kernels on the CPU only "
            f"(the MPS backend needs macOS). Pass CPU tensors")
    key = plan.constants
    compiled = compiled_by_constants.get(key)
    if compiled is None:
        compiled = compiled_by_constants[key] = compile_kernel(function, key)
    _C.launch_cpu(plan, compiled.launcher, compiled.serial)

"""Metal's builtin arguments (``[[thread_position_in_grid]]``...) as IR values, the same for
every target: the names the kernel's call reads each builtin from, and the lines that
compute the per-launch and per-thread ones from the grid, the group and the thread's
linear index (each backend's entry computes the rest).
"""

from typing import List

from .intrinsics import SIMD_WIDTH
from ..errors import UnsupportedKernelError

__all__ = ["BUILTIN_VALUES", "builtin_operand", "DISPATCH_LINES", "LANE_LINES"]

# IR value names (x, y, z) of each builtin where the kernel is called (values computed by
# DISPATCH_LINES, GROUP_LINES, LANE_LINES and the thread loop / thread entry).
BUILTIN_VALUES = {
        "thread_position_in_grid": ["%px", "%py", "%pz"],
        "threads_per_grid": ["%grid.x", "%grid.y", "%grid.z"],
        "grid_size": ["%grid.x", "%grid.y", "%grid.z"],
        "grid_origin": ["0", "0", "0"],
        "threadgroup_position_in_grid": ["%gx", "%gy", "%gz"],
        "threadgroups_per_grid": ["%groups.x", "%groups.y", "%groups.z"],
        "thread_position_in_threadgroup": ["%tx", "%ty", "%tz"],
        "threads_per_threadgroup": ["%ax", "%ay", "%az"],
        "dispatch_threads_per_threadgroup": ["%group.x", "%group.y", "%group.z"],
        "thread_index_in_threadgroup": ["%linear"] * 3,
        "thread_execution_width": [str(SIMD_WIDTH)] * 3,
        "threads_per_simdgroup": [str(SIMD_WIDTH)] * 3,
        "thread_index_in_simdgroup": ["%lane"] * 3,
        "simdgroup_index_in_threadgroup": ["%simd"] * 3,
        "simdgroups_per_threadgroup": ["%simds"] * 3,
        "dispatch_simdgroups_per_threadgroup": ["%dsimds"] * 3,
        "thread_index_in_quadgroup": ["%quadlane"] * 3,
        "quadgroup_index_in_threadgroup": ["%quad"] * 3,
        "quadgroups_per_threadgroup": ["%quads"] * 3,
        "dispatch_quadgroups_per_threadgroup": ["%dquads"] * 3,
}


def builtin_operand(argument, lines: List[str]) -> str:
    values = BUILTIN_VALUES.get(argument.builtin)
    if values is None or argument.components is None:
        raise UnsupportedKernelError(f"builtin [[{argument.builtin}]] of type {argument.ir_type} "
                                     f"(argument {argument.position} {argument.name!r}) is not supported (CPU and CUDA backends)")
    bits, count = argument.component_bits, argument.components
    scalars = []
    for axis, value in enumerate(values[:count]):
        if bits == 16 and not value.isdigit():
            lines.append(f"%b{argument.position}.{axis} = trunc i32 {value} to i16")
            value = f"%b{argument.position}.{axis}"
        scalars.append(value)
    element = f"i{bits}"
    if count == 1:
        return f"{element} {scalars[0]}"
    vector, previous = f"<{count} x {element}>", "poison"
    for axis, value in enumerate(scalars):
        name = f"%v{argument.position}.{axis}"
        lines.append(f"{name} = insertelement {vector} {previous}, {element} {value}, i32 {axis}")
        previous = name
    return f"{vector} {previous}"


# Per launch, from the dims: what dispatch_* builtins need.
DISPATCH_LINES = [
    "%gxy = mul i32 %groups.x, %groups.y",
    "%dgroup.xy = mul i32 %group.x, %group.y", "%dgroup.all = mul i32 %dgroup.xy, %group.z",
    f"%dsimds.n = add i32 %dgroup.all, {SIMD_WIDTH - 1}", f"%dsimds = udiv i32 %dsimds.n, {SIMD_WIDTH}",
    "%dquads.n = add i32 %dgroup.all, 3", "%dquads = udiv i32 %dquads.n, 4",
]

# Per thread, from its linear index in the threadgroup %linear.
LANE_LINES = [
    f"%lane = urem i32 %linear, {SIMD_WIDTH}", f"%simd = udiv i32 %linear, {SIMD_WIDTH}",
    "%quadlane = urem i32 %linear, 4", "%quad = udiv i32 %linear, 4",
]

"""AIR module -> host LLVM IR: what lets a Metal kernel run on the CPU.

The printed AIR module is edited as text (llvmlite has no IR-editing API, docs/formats.md):

* the triple and datalayout become the host's (AIR's address spaces 1-3 stay: on the
  host they are ordinary 64-bit pointers);
* every definition becomes internal, and the kernel ``alwaysinline``, so each compiled
  object exports only its launcher; ``"no-builtins"`` is dropped so loops can vectorize;
* function constants are specialized: each ``MTL_FC_INIT_<index>_<type>`` placeholder
  gets its value, and the ``air.static_init`` constructors that copy them are called by
  an exported ``__tm_init_<symbol>``, run once when the object is loaded;
* a variable index into a thread's private array is clamped to one spare element
  (air/private_arrays.py);
* in a cooperative kernel, loops around simdgroup-matrix products are unrolled and
  independent products become one exchange (_cpu_matrix_batches);
* ``air.*`` declarations get host definitions (air/: intrinsics.py, collectives.py...,
  their waits spelled by target.py); calls of SIMD-group collectives pass their call
  site's order (_cpu_reconvergence); what reaches a barrier or SIMD-group function is
  convergent (air/convergence.py);
* a launcher ``__tm_launch_<symbol>(ptr args, ptr dims, i64 first, i64 end)`` runs
  threadgroups [first, end): every thread of each, with the builtins the kernel declares,
  threadgroups at the grid edge cut short as ``dispatchThreads`` does; for a kernel whose
  threads cooperate, a per-thread entry ``__tm_thread_<symbol>`` instead, a coroutine
  with every function inlined into it (_cpu_coroutine).
"""

import functools
import re
from typing import Callable, Dict, List, Optional, Tuple

from ...air.async_copies import check_async_copy_calls, define_async_copy
from ...air.atomics import define_atomic
from ...air.bfloat_rounding import round_bfloat_exactly
from ...air.builtins import DISPATCH_LINES, LANE_LINES, builtin_operand
from ...air.collectives import define_collective
from ...air.constant_globals import check_constant_globals
from ...air.convergence import mark_convergent
from ...air.derived_forms import lanewise, via_wider
from ...air.float_exp import define_fast_exp_float
from ...air.function_constants import specialize_constants, take_constructors
from ...air.integer_division import guard_integer_division
from ...air.intrinsics import SIMD_WIDTH, define_intrinsic
from ...air.module import define_intrinsics, internalize, retarget
from ...air.private_arrays import clamp_private_array_indices
from ...air.private_tensors import define_private_tensor
from ...air.simdgroup_matrix import define_kept_accumulator, define_matrix, define_product_batch
from ...air.target import Target
from ...air.tensor_ops import check_tensor_op_calls, define_tensor_op
from ...reflection.ir_model import printed
from .coroutine import thread_entry
from .reconvergence import number_exchange_sites
from .target import COROUTINES, LaneLoops, VectorLanes

__all__ = ["lower", "cpu_definition", "cpu_implements"]

# Visible function tables are never bound (the binding plan refuses calls that keep one), so
# looking a function up in one cannot be reached.
_UNREACHABLE = {"air.get_function_pointer_visible_function_table"}


def _host_intrinsic(ret: str, name: str, params: List[str], symbol: Optional[str] = None,
                    branches: bool = True) -> Optional[Tuple[str, List[str]]]:
    """define_intrinsic, but ``fast_exp`` on floats (and its vector, half and bfloat forms)
    inline as glibc's expf computes it (air/float_exp.py): the same bits as the libm call,
    which LLVM can neither inline nor vectorize; without `branches`, its rare cases
    selected (for vector lanes)."""
    if name.startswith("air.fast_exp.") and len(params) == 1:
        symbol = symbol or name
        define = functools.partial(_host_intrinsic, branches=branches)
        if ret.startswith("<"):
            return lanewise(ret, name, params, symbol, define)
        if ret in ("half", "bfloat") and params == [ret]:
            return via_wider(ret, name, params, symbol, define)
        if ret == params[0] == "float":
            return define_fast_exp_float(symbol, branches)
    return define_intrinsic(ret, name, params, symbol)


def cpu_definition(ret: str, name: str, params: List[str],
                   target: Target = COROUTINES) -> Optional[Tuple[str, List[str]]]:
    """(the host definition of the declared intrinsic `name`, its waits as `target` spells
    them (target.py), declarations it needs), or None where the CPU backend has none (also
    what the intrinsic census asks)."""
    if name in _UNREACHABLE:
        signature = ", ".join(f"{t} %a{i}" for i, t in enumerate(params))
        return (f"define internal {ret} @{name}({signature}) {{\n  call void @llvm.trap()\n  unreachable\n}}",
                ["declare void @llvm.trap()"])
    branches = not getattr(target, "branch_free_math", False)
    return (_host_intrinsic(ret, name, params, branches=branches) or define_atomic(ret, name, params)
            or define_matrix(ret, name, params, target) or define_product_batch(ret, name, params, target)
            or define_kept_accumulator(ret, name, params, target)
            or define_collective(ret, name, params, target) or define_async_copy(ret, name, params, target)
            or define_tensor_op(ret, name, params, target) or define_private_tensor(ret, name, params))


def cpu_implements(ret: str, name: str, params: List[str]) -> bool:
    """Whether the CPU backend runs calls of this declaration (the intrinsic census)."""
    if name == "air.is_function_constant_defined":  # specialize_constants defines it
        return params == ["ptr addrspace(2)"] and ret == "i1"
    return cpu_definition(ret, name, params) is not None


# --- the launcher --------------------------------------------------------------------

# Per threadgroup, from its linear index %g32: its position, origin and actual size (cut
# short at the grid edge, as dispatchThreads does), and its SIMD- and quad-group counts.
GROUP_LINES = [
    "%gx = urem i32 %g32, %groups.x", "%gq = udiv i32 %g32, %groups.x", "%gy = urem i32 %gq, %groups.y",
    "%gz = udiv i32 %g32, %gxy",
    "%ox = mul i32 %gx, %group.x", "%oy = mul i32 %gy, %group.y", "%oz = mul i32 %gz, %group.z",
    "%rx = sub i32 %grid.x, %ox", "%ry = sub i32 %grid.y, %oy", "%rz = sub i32 %grid.z, %oz",
    "%ax = call i32 @llvm.umin.i32(i32 %group.x, i32 %rx)",
    "%ay = call i32 @llvm.umin.i32(i32 %group.y, i32 %ry)",
    "%az = call i32 @llvm.umin.i32(i32 %group.z, i32 %rz)",
    "%axy = mul i32 %ax, %ay", "%all = mul i32 %axy, %az",
    f"%simds.n = add i32 %all, {SIMD_WIDTH - 1}", f"%simds = udiv i32 %simds.n, {SIMD_WIDTH}",
    "%quads.n = add i32 %all, 3", "%quads = udiv i32 %quads.n, 4",
]


def _lines(lines) -> str:
    return "\n  ".join(lines)


def _operands(arguments, checked: bool = False):
    """(entry lines, per-thread lines, call operands): the entry lines load the dims
    (grid, group, groups) and each buffer's address from args[position]; the per-thread
    lines build the builtins. A `checked` kernel also takes the thread's position."""
    entry, body, operands = [], [], []
    for index, name in enumerate(["grid.x", "grid.y", "grid.z", "group.x", "group.y", "group.z",
                                  "groups.x", "groups.y", "groups.z"]):
        entry += [f"%dp{index} = getelementptr i32, ptr %dims, i64 {index}", f"%{name} = load i32, ptr %dp{index}"]
    for a in sorted(arguments, key=lambda a: a.position):
        if a.is_builtin:
            operands.append(builtin_operand(a, body))
        else:
            entry += [f"%slot{a.position} = getelementptr ptr, ptr %args, i64 {a.position}",
                      f"%raw{a.position} = load ptr, ptr %slot{a.position}",
                      f"%arg{a.position} = addrspacecast ptr %raw{a.position} to {a.ir_type}"]
            operands.append(f"{a.ir_type} %arg{a.position}")
    if checked:
        operands += ["i32 %px", "i32 %py", "i32 %pz"]
    return entry, body, operands


def _launcher(symbol: str, kernel: str, arguments, checked: bool = False, helpers_checked: bool = False) -> str:
    """`checked`: the kernel takes the thread's position (bounds_checks.THREAD_PARAMETERS);
    `helpers_checked`: checks outside the kernel read it from the check context, so each
    thread stores it there (slower: only where needed)."""
    entry, body, operands = _operands(arguments, checked)
    if helpers_checked:
        entry = entry + ["%tm.ctx = call ptr @tm_rt_check_context()"] + [
            f"%tm.ctx.{axis} = getelementptr inbounds i32, ptr %tm.ctx, i64 {index}" for index, axis in enumerate("xyz")]
        body = body + [f"store i32 %p{axis}, ptr %tm.ctx.{axis}" for axis in "xyz"]
    return f"""
define void @__tm_launch_{symbol}(ptr %args, ptr %dims, i64 %first, i64 %end) {{
entry:
  {_lines(entry + DISPATCH_LINES)}
  %any = icmp ult i64 %first, %end
  br i1 %any, label %group, label %done
group:
  %g = phi i64 [ %first, %entry ], [ %g.next, %group.end ]
  %g32 = trunc i64 %g to i32
  {_lines(GROUP_LINES)}
  br label %zloop
zloop:
  %tz = phi i32 [ 0, %group ], [ %tz.next, %zloop.end ]
  %pz = add i32 %oz, %tz
  br label %yloop
yloop:
  %ty = phi i32 [ 0, %zloop ], [ %ty.next, %yloop.end ]
  %py = add i32 %oy, %ty
  %rowz = mul i32 %tz, %ay
  %row = add i32 %rowz, %ty
  %rowbase = mul i32 %row, %ax
  br label %xloop
xloop:
  %tx = phi i32 [ 0, %yloop ], [ %tx.next, %xloop ]
  %px = add i32 %ox, %tx
  %linear = add i32 %rowbase, %tx
  {_lines(LANE_LINES + body)}
  call void @{printed(kernel)}({", ".join(operands)})
  %tx.next = add i32 %tx, 1
  %x.more = icmp ult i32 %tx.next, %ax
  br i1 %x.more, label %xloop, label %yloop.end
yloop.end:
  %ty.next = add i32 %ty, 1
  %y.more = icmp ult i32 %ty.next, %ay
  br i1 %y.more, label %yloop, label %zloop.end
zloop.end:
  %tz.next = add i32 %tz, 1
  %z.more = icmp ult i32 %tz.next, %az
  br i1 %z.more, label %zloop, label %group.end
group.end:
  %g.next = add i64 %g, 1
  %g.more = icmp ult i64 %g.next, %end
  br i1 %g.more, label %group, label %done
done:
  ret void
}}
"""


def _thread_entry(symbol: str, kernel: str, arguments, checked: bool = False, lanes: bool = False) -> str:
    """``__tm_thread_<symbol>(ptr args, ptr dims, i32 group, i32 thread)``: one thread of a
    cooperative kernel, a coroutine the runtime (csrc/cpu/cooperative.cpp) resumes (and,
    when `checked`, keeps the check context's thread current); with `lanes`, the plain
    function ``__tm_lanes_<symbol>`` that regions.py cuts into lane loops."""
    entry, body, operands = _operands(arguments, checked)
    lines = entry + DISPATCH_LINES + GROUP_LINES + [
        "%linear = add i32 %t32, 0",
        "%tx = urem i32 %t32, %ax", "%tq = udiv i32 %t32, %ax", "%ty = urem i32 %tq, %ay", "%tz = udiv i32 %t32, %axy",
        "%px = add i32 %ox, %tx", "%py = add i32 %oy, %ty", "%pz = add i32 %oz, %tz",
    ] + LANE_LINES + body + [f"call void @{printed(kernel)}({', '.join(operands)})"]
    if lanes:  # cut into lane loops by regions.py
        return (f"\ndefine void @__tm_lanes_{symbol}(ptr %args, ptr %dims, i32 %g32, i32 %t32) {{\nentry:\n  "
                + "\n  ".join(lines) + "\n  ret void\n}\n")
    return thread_entry(f"__tm_thread_{symbol}", lines)


def lower(text: str, kernel: str, arguments, constants: Dict[int, object], symbol: str,
          triple: str, datalayout: str, cooperative: bool = False,
          unroll: Callable[[str], str] = lambda text: text, checked: bool = False, lanes: bool = False,
          initcheck: bool = True, vector: bool = False) -> str:
    """Host LLVM IR for `kernel` (its printed AIR module `text`), exporting
    ``__tm_init_<symbol>`` and ``__tm_launch_<symbol>`` (all threads of a range of
    threadgroups, in a loop), or for a `cooperative` kernel ``__tm_thread_<symbol>`` (one
    thread). `unroll` optimizes a module with simdgroup-matrix products (names every
    value) before they are batched. `checked`: every access in address spaces 1-3 is
    bounds-checked (bounds_checks.py), and with `initcheck` threadgroup reads checked for
    bytes no thread wrote. `lanes`: a cooperative kernel's waits are markers
    for regions.py instead (target.LaneLoops); `vector`: for vector lanes
    (target.VectorLanes)."""
    text = retarget(text, triple, datalayout)
    statics, static_names, helpers_checked = [], "", False
    if checked:  # imported here: most kernels are never checked (a first compile's import time)
        from .bounds_checks import check_definitions, instrument_accesses, static_ranges_init

        statics, static_names = static_ranges_init(text)
        text, helpers_checked = instrument_accesses(text, kernel, initcheck)
        text += check_definitions() + static_names
    text = internalize(text, kernel, cooperative)
    text = guard_integer_division(clamp_private_array_indices(specialize_constants(text, constants)))
    check_async_copy_calls(text, kernel)
    check_tensor_op_calls(text, kernel, cooperative)
    text, constructors = take_constructors(text)
    check_constant_globals(text, kernel, constructors)
    if cooperative:
        from .matrix_batches import batch_matrix_products  # only cooperative kernels need it

        text = batch_matrix_products(text, unroll, keep_accumulators=lanes)
    target = (VectorLanes() if vector else LaneLoops()) if lanes else COROUTINES
    text = define_intrinsics(text, kernel, functools.partial(cpu_definition, target=target), "the CPU backend", target,
                             constructors)
    text = round_bfloat_exactly(number_exchange_sites(text))
    init_calls = "\n".join(statics + [f"  call void @{printed(name)}()" for name in constructors])
    declared = set(re.findall(r"^declare [^\n]*?@([-\w$.]+)\(", text, re.M))
    umin = "" if "llvm.umin.i32" in declared else "declare i32 @llvm.umin.i32(i32, i32)\n"
    entry = (_thread_entry(symbol, kernel, arguments, checked, lanes) if cooperative
             else _launcher(symbol, kernel, arguments, checked, helpers_checked))
    return mark_convergent(text + umin + entry
                           + f"\ndefine void @__tm_init_{symbol}() {{\nentry:\n{init_calls}\n  ret void\n}}\n")

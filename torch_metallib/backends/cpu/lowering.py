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
  (_cpu_private_arrays);
* in a cooperative kernel, loops around simdgroup-matrix products are unrolled and
  independent products become one exchange (_cpu_matrix_batches);
* ``air.*`` declarations get host definitions (_cpu_intrinsics); calls of SIMD-group
  collectives pass their call site's order (_cpu_reconvergence); what reaches a barrier or
  SIMD-group function is convergent (convergence.py);
* a launcher ``__tm_launch_<symbol>(ptr args, ptr dims, i64 first, i64 end)`` runs
  threadgroups [first, end): every thread of each, with the builtins the kernel declares,
  threadgroups at the grid edge cut short as ``dispatchThreads`` does; for a kernel whose
  threads cooperate, a per-thread entry ``__tm_thread_<symbol>`` instead, a coroutine
  with every function inlined into it (_cpu_coroutine).
"""

import re
import struct
from typing import Callable, Dict, List, Optional, Tuple

from .collectives import LANES, LANES_MARKERS, RUNTIME_DECLARATIONS, define_collective
from .constant_globals import check_constant_globals
from .convergence import mark_convergent
from .coroutine import thread_entry
from .async_copies import check_async_copy_calls, define_async_copy
from .atomics import define_atomic
from .bfloat_rounding import round_bfloat_exactly
from .bounds_checks import check_definitions, instrument_accesses, static_ranges_init
from .intrinsics import SIMD_WIDTH, define_intrinsic, parse_declaration
from .integer_division import guard_integer_division
from .private_arrays import clamp_private_array_indices
from .reconvergence import number_exchange_sites
from .matrix_batches import batch_matrix_products
from .simdgroup_matrix import define_matrix, define_product_batch
from .private_tensors import define_private_tensor
from .tensor_ops import TENSOR_OP_PREFIX, check_tensor_op_calls, define_tensor_op
from ...errors import UnsupportedKernelError

__all__ = ["lower", "constant_literal", "cpu_definition", "define_intrinsics", "retarget", "internalize",
           "specialize_constants", "take_constructors", "builtin_operand", "DISPATCH_LINES", "LANE_LINES"]

# A placeholder is internal in Apple's kernels; public AIR dumps also show it linkonce_odr
# hidden (local_unnamed_addr), and it must be specialized the same either way.
_FC_INIT = re.compile(r'^(@[-\w$.]+\.MTL_FC_INIT_(\d+)_\w+) = ((?:(?:internal|private|linkonce_odr|weak_odr|'
                      r'linkonce|weak|external|hidden|protected|dso_local|unnamed_addr|local_unnamed_addr) )*)'
                      r'addrspace\(2\) externally_initialized constant (\w+) undef, section "air.fc_initializer"(.*)$',
                      re.M)
_IS_DEFINED = re.compile(r"^declare i1 @air\.is_function_constant_defined\(ptr addrspace\(2\)[^\n]*$", re.M)
# Visible function tables are never bound (the binding plan refuses calls that keep one), so
# looking a function up in one cannot be reached.
_UNREACHABLE = {"air.get_function_pointer_visible_function_table"}
_CTORS = re.compile(r"^@llvm\.global_ctors = appending global \[\d+ x [^\]]*\] (.*)$", re.M)


def constant_literal(ir_type: str, value) -> str:
    """`value` as an LLVM constant of `ir_type` (bool is i8 in AIR's placeholders)."""
    if ir_type.startswith("i"):
        bits = int(ir_type[1:])
        wrapped = int(value) & ((1 << bits) - 1)  # two's complement, as the GPU stores it
        return str(wrapped - (1 << bits) if wrapped >> (bits - 1) and bits > 1 else wrapped)
    if ir_type == "float":
        return "0x%016X" % struct.unpack("<Q", struct.pack("<d", struct.unpack("<f", struct.pack("<f", value))[0]))[0]
    if ir_type == "double":
        return "0x%016X" % struct.unpack("<Q", struct.pack("<d", value))[0]
    if ir_type == "half":
        return "0xH%04X" % struct.unpack("<H", struct.pack("<e", value))[0]
    if ir_type == "bfloat":
        bits = struct.unpack("<I", struct.pack("<f", value))[0]
        return "0xR%04X" % ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16)
    raise UnsupportedKernelError(f"function constant of LLVM type {ir_type} is not supported on the CPU")


def retarget(text: str, triple: str, datalayout: str) -> str:
    text = re.sub(r"^target datalayout = .*$", f'target datalayout = "{datalayout}"', text, count=1, flags=re.M)
    return re.sub(r"^target triple = .*$", f'target triple = "{triple}"', text, count=1, flags=re.M)


def internalize(text: str, kernel: str, cooperative: bool) -> str:
    text = re.sub(r"^define (?:(?:weak_odr|linkonce_odr|weak|linkonce|external|dso_local|available_externally) )*"
                  r"(?!internal |private )", "define internal ", text, flags=re.M)
    text = text.replace(' "no-builtins"', "")
    # The kernel is inlined into the launcher's thread loop (so it can vectorize); a
    # cooperative kernel's thread entry needs every wait inlined into it (_cpu_coroutine).
    if cooperative:  # Metal has no recursion, so everything inlines once these are gone
        text = re.sub(r"^attributes #\d+ = \{.*\}$", lambda m: re.sub(r"\b(?:noinline|optnone) ", "", m.group(0)),
                      text, flags=re.M)
    name = r"[-\w$.]+" if cooperative else re.escape(kernel)
    return re.sub(rf"^(define internal [^\n]*@{name}\([^\n]*?)( #\d+)?( section \"[^\"]*\")? \{{$",
                  r"\1 alwaysinline\2\3 {", text, count=0 if cooperative else 1, flags=re.M)


def specialize_constants(text: str, values: Dict[int, object]) -> str:
    """Gives each constant's placeholder its value (an optional constant that was not set
    reads as 0) and defines air.is_function_constant_defined: the placeholders of the
    constants set. A placeholder whose address is compared keeps its own address (no
    unnamed_addr unless it had it); each becomes internal (a definition, not exported)."""
    defined = []
    def replace(match):
        index, ir_type = int(match.group(2)), match.group(4)
        if index in values:
            defined.append(match.group(1))
        unnamed = [word for word in match.group(3).split() if word.endswith("unnamed_addr")]
        return f"{match.group(1)} = {' '.join(['internal'] + unnamed)} addrspace(2) constant {ir_type} " \
               f"{constant_literal(ir_type, values.get(index, 0))}{match.group(5)}"
    text = _FC_INIT.sub(replace, text)
    tests = [f"%d{i} = icmp eq ptr addrspace(2) %p, {name}" for i, name in enumerate(defined)]
    result = "false"
    for i in range(len(defined)):
        tests.append(f"%any{i} = or i1 {result}, %d{i}")
        result = f"%any{i}"
    body = "\n  ".join(tests + [f"ret i1 {result}"])
    definition = f"define internal i1 @air.is_function_constant_defined(ptr addrspace(2) %p) alwaysinline {{\n  {body}\n}}"
    return _IS_DEFINED.sub(lambda _: definition, text)


def take_constructors(text: str):
    """Empties llvm.global_ctors; returns (text, constructor names)."""
    match = _CTORS.search(text)
    if match is None:
        return text, []
    names = re.findall(r"ptr @([-\w$.]+)", match.group(1))
    return text[:match.start()] + "@llvm.global_ctors = appending global [0 x { i32, ptr, ptr }] zeroinitializer" \
        + text[match.end():], names


def cpu_definition(ret: str, name: str, params: List[str]) -> Optional[Tuple[str, List[str]]]:
    """(the host definition of the declared intrinsic `name`, declarations it needs), or
    None where the CPU backend has none (also what the intrinsic census asks)."""
    if name in _UNREACHABLE:
        signature = ", ".join(f"{t} %a{i}" for i, t in enumerate(params))
        return (f"define internal {ret} @{name}({signature}) {{\n  call void @llvm.trap()\n  unreachable\n}}",
                ["declare void @llvm.trap()"])
    return (define_intrinsic(ret, name, params) or define_atomic(ret, name, params) or define_matrix(ret, name, params)
            or define_product_batch(ret, name, params) or define_collective(ret, name, params)
            or define_async_copy(ret, name, params) or define_tensor_op(ret, name, params)
            or define_private_tensor(ret, name, params))


# The section of a declaration whose body Metal's driver links in (MetalPerformancePrimitives'
# tensor operations): not an air.* intrinsic, but just as much a function the backend must supply.
EXTERNALLY_DEFINED = 'section "air.externally_defined"'


def cpu_implements(ret: str, name: str, params: List[str]) -> bool:
    """Whether the CPU backend runs calls of this declaration (the intrinsic census)."""
    if name == "air.is_function_constant_defined":  # specialize_constants defines it
        return params == ["ptr addrspace(2)"] and ret == "i1"
    return cpu_definition(ret, name, params) is not None


def define_intrinsics(text: str, kernel: str, define=cpu_definition, backend: str = "the CPU backend") -> str:
    """`text` with each ``air.*`` declaration replaced by `define`'s definition (default: the
    CPU's); UnsupportedKernelError naming what `backend` cannot run."""
    declared = set(re.findall(r"^declare [^\n]*?@([-\w$.]+)\(", text, re.M))
    extra, unsupported, external = [], [], []
    def replace(match):
        parsed = parse_declaration(match.group(0))
        if parsed is None or not parsed[1].startswith(("air.", "tm.", TENSOR_OP_PREFIX)):
            if parsed is not None and EXTERNALLY_DEFINED in match.group(0):
                external.append(parsed[1])
            return match.group(0)
        made = define(*parsed)
        if made is None:
            (external if EXTERNALLY_DEFINED in match.group(0) else unsupported).append(parsed[1])
            return match.group(0)
        definition, needs = made
        for line in needs:
            name = re.search(r"@([-\w$.]+)\(", line).group(1)
            if name not in declared:
                declared.add(name)
                extra.append(line)
        return definition
    text = re.sub(r"^declare [^\n]*$", replace, text, flags=re.M)
    if "@tm_rt_" in text:
        extra += RUNTIME_DECLARATIONS
    if "@tm.lanes." in text:
        extra += LANES_MARKERS + ([] if "llvm.cttz.i32" in declared else ["declare i32 @llvm.cttz.i32(i32, i1)"])
    if unsupported or external:
        missing = [f"{backend} has no implementation of {', '.join(sorted(set(unsupported)))}"] if unsupported else []
        if external:  # Metal 4's MetalPerformancePrimitives tensor operations (matmul2d...)
            missing.append(f"it calls functions that Metal's driver supplies (section air.externally_defined), "
                           f"which {backend} does not implement: {', '.join(sorted(set(external)))}")
        raise UnsupportedKernelError(f"{kernel}: {'; '.join(missing)}. "
                                     f"Run it on a Mac with MPS tensors, or report the intrinsic")
    return text + "\n" + "\n".join(extra) + "\n"


# --- the launcher --------------------------------------------------------------------

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
# Per thread, from its linear index in the threadgroup %linear.
LANE_LINES = [
    f"%lane = urem i32 %linear, {SIMD_WIDTH}", f"%simd = udiv i32 %linear, {SIMD_WIDTH}",
    "%quadlane = urem i32 %linear, 4", "%quad = udiv i32 %linear, 4",
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
  call void @{kernel}({", ".join(operands)})
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
    ] + LANE_LINES + body + [f"call void @{kernel}({', '.join(operands)})"]
    if lanes:  # cut into lane loops by regions.py
        return (f"\ndefine void @__tm_lanes_{symbol}(ptr %args, ptr %dims, i32 %g32, i32 %t32) {{\nentry:\n  "
                + "\n  ".join(lines) + "\n  ret void\n}\n")
    return thread_entry(f"__tm_thread_{symbol}", lines)


def lower(text: str, kernel: str, arguments, constants: Dict[int, object], symbol: str,
          triple: str, datalayout: str, cooperative: bool = False,
          unroll: Callable[[str], str] = lambda text: text, checked: bool = False, lanes: bool = False) -> str:
    """Host LLVM IR for `kernel` (its printed AIR module `text`), exporting
    ``__tm_init_<symbol>`` and ``__tm_launch_<symbol>`` (all threads of a range of
    threadgroups, in a loop), or for a `cooperative` kernel ``__tm_thread_<symbol>`` (one
    thread). `unroll` optimizes a module with simdgroup-matrix products (names every
    value) before they are batched. `checked`: every access in address spaces 1-3 is
    bounds-checked (bounds_checks.py). `lanes`: a cooperative kernel's waits are markers
    for regions.py instead (collectives.LANES)."""
    text = retarget(text, triple, datalayout)
    statics = static_ranges_init(text) if checked else []
    helpers_checked = False
    if checked:
        text, helpers_checked = instrument_accesses(text, kernel)
        text += check_definitions()
    text = internalize(text, kernel, cooperative)
    text = guard_integer_division(clamp_private_array_indices(specialize_constants(text, constants)))
    check_async_copy_calls(text, kernel)
    check_tensor_op_calls(text, kernel, cooperative)
    text, constructors = take_constructors(text)
    check_constant_globals(text, kernel, constructors)
    if cooperative:
        text = batch_matrix_products(text, unroll)
    scheme = LANES.set(lanes)
    try:
        text = round_bfloat_exactly(number_exchange_sites(define_intrinsics(text, kernel)))
    finally:
        LANES.reset(scheme)
    init_calls = "\n".join(statics + [f"  call void @{name}()" for name in constructors])
    declared = set(re.findall(r"^declare [^\n]*?@([-\w$.]+)\(", text, re.M))
    umin = "" if "llvm.umin.i32" in declared else "declare i32 @llvm.umin.i32(i32, i32)\n"
    entry = (_thread_entry(symbol, kernel, arguments, checked, lanes) if cooperative
             else _launcher(symbol, kernel, arguments, checked, helpers_checked))
    return mark_convergent(text + umin + entry
                           + f"\ndefine void @__tm_init_{symbol}() {{\nentry:\n{init_calls}\n  ret void\n}}\n")

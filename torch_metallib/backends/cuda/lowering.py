"""AIR module -> NVVM IR: a Metal kernel as a CUDA kernel.

The AIR meaning is air/'s, as on the CPU: its function-constant specialization
(function_constants.py), per-lane intrinsics (intrinsics.py), atomics (atomics.py) and
collectives (collectives.py, their target warp_spelling.py's warp shuffles) are used as
they are; this module only spells them for NVPTX:

* triple and datalayout become NVPTX's; Metal's ``device`` (1) and ``threadgroup`` (3)
  address spaces are CUDA's global and shared; ``constant`` (2) becomes generic (0), so a
  constant buffer may be device memory or a kernel parameter (LLVM's NVPTX passes move
  constant-space globals to global memory and infer global loads where they can);
* precise and fast math calls become libdevice's (libdevice.py), in float where the CPU
  computes in double (libdevice's float functions are within Metal's ulp bounds);
* ``__tm_cuda_<symbol>``, a ``ptx_kernel``, takes one global pointer per buffer binding,
  one byte offset into the dynamic shared memory per ``[[threadgroup(n)]]`` argument, and
  the grid, the nominal threadgroup size and the first threadgroup of this launch; it
  computes the builtins the kernel declares from ``%tid``/``%ntid``/``%ctaid`` and calls
  the kernel. A launch's block is the exact threadgroup: the runtime launches the
  threadgroups at the grid's edge (smaller, as ``dispatchThreads`` makes them) separately,
  so a barrier or shuffle never waits for a thread that does not exist. A grid-only kernel
  may instead export ``__tm_cuda_<symbol>_x4``, whose threads run 4 grid positions each
  (coarsening.py).
"""

import re
from typing import Dict, List, Optional, Tuple

from ...errors import UnsupportedKernelError
from ...air.atomics import define_atomic
from ...air.bfloat_rounding import round_bfloat_exactly
from ...air.builtins import DISPATCH_LINES, LANE_LINES, builtin_operand
from ...air.collectives import define_collective
from ...air.constant_globals import check_constant_globals
from ...air.convergence import mark_convergent
from ...air.function_constants import specialize_constants, take_constructors
from ...air.integer_division import guard_integer_division
from ...air.intrinsics import VIA_DOUBLE, define_intrinsic, parse_declaration
from ...air.module import define_intrinsics, internalize, retarget
from ...air.private_arrays import clamp_private_array_indices
from ...air.simdgroup_matrix import define_matrix
from ...reflection.ir_model import printed
from .converged_masks import CONVERGED_SUFFIX, MASK_PARAMETER, converge_top_level_collectives
from .coarsening import COARSENING, coarsenable, coarsened_entry, no_alias_buffers
from .lane_relabeling import RELABELED, relabel_safe, relabeled_definition, relabeled_thread_lines
from .libdevice import use_libdevice
from .matrix_products import PLACEHOLDER, define_matrix_product
from .tensor_core_products import exact_products
from .warp_spelling import DECLARATIONS, WarpSpelling

__all__ = ["lower", "entry_name", "cuda_definition", "TRIPLE", "LAUNCH_PARAMETERS"]

TRIPLE = "nvptx64-nvidia-cuda"
# The launch's own parameters, after the kernel's: grid, nominal group, first group (x, y, z).
LAUNCH_PARAMETERS = ["grid.x", "grid.y", "grid.z", "group.x", "group.y", "group.z", "base.x", "base.y", "base.z"]
DYNAMIC_SHARED = "@__tm_dynamic_shared"
_SREG = "llvm.nvvm.read.ptx.sreg"
# The running thread's index in its threadgroup, where the collectives ask the runtime.
_THREAD_IN_GROUP = f"""define internal i32 @tm_rt_thread_in_group() alwaysinline {{
  %x = call i32 @{_SREG}.tid.x()
  %y = call i32 @{_SREG}.tid.y()
  %z = call i32 @{_SREG}.tid.z()
  %nx = call i32 @{_SREG}.ntid.x()
  %ny = call i32 @{_SREG}.ntid.y()
  %zy = mul i32 %z, %ny
  %row = add i32 %zy, %y
  %base = mul i32 %row, %nx
  %r = add i32 %base, %x
  ret i32 %r
}}"""
_REGISTERS = [f"declare i32 @{_SREG}.{register}.{axis}()" for register in ("tid", "ntid", "ctaid") for axis in "xyz"]


def entry_name(symbol: str, coarsening: int = 1) -> str:
    """The exported kernel's name: ``_x<n>`` where each CUDA thread runs n grid positions."""
    return f"__tm_cuda_{symbol}" + (f"_x{coarsening}" if coarsening > 1 else "")


def cuda_definition(ret: str, name: str, params: List[str]):
    """(the NVVM definition of the declared intrinsic `name`, declarations), or None where
    the CUDA backend has none: air/'s meaning, collectives as warp shuffles."""
    parts = name.split(".")
    if len(parts) >= 3 and parts[0] == "air" and parts[1] in VIA_DOUBLE:
        # The CPU computes these in double (correctly rounded); libdevice's float functions
        # are within Metal's ulp bounds already, and double is slow on most GPUs.
        return define_intrinsic(ret, ".".join(["air", "fast_" + parts[1]] + parts[2:]), params, name)
    if name.endswith(CONVERGED_SUFFIX):  # its last operand names the lanes (converged_masks.py)
        return _converged_collective(ret, name, params)
    warp = WarpSpelling()
    return (define_intrinsic(ret, name, params) or define_atomic(ret, name, params)
            or define_collective(ret, name, params, warp) or define_matrix_product(ret, name, params)
            or define_matrix(ret, name, params, warp))


def _converged_collective(ret: str, name: str, params: List[str]):
    """The definition of collective `name` (CONVERGED_SUFFIX) among the lanes its last
    operand names."""
    base = name[:-len(CONVERGED_SUFFIX)]
    made = define_collective(ret, base, params[:-1], WarpSpelling(mask=MASK_PARAMETER))
    if made is None:
        return None
    definition, declarations = made
    header, rest = definition.split("\n", 1)
    close = header.rindex(") alwaysinline")
    opened = header[:close].endswith("(")
    header = header[:close] + ("" if opened else ", ") + f"i32 {MASK_PARAMETER}" + header[close:]
    return header.replace(f"@{base}(", f"@{name}(", 1) + "\n" + rest, declarations


def _is_collective(ret: str, name: str, params: List[str]) -> bool:
    """Whether `name` is a SIMD-group exchange the warp spelling defines."""
    made = define_collective(ret, name, params, WarpSpelling())
    return made is not None and "%mask = " in made[0]


def _names_lanes(ret: str, name: str, params: List[str]) -> bool:
    """Whether AIR function `name` exchanges between lanes or places a lane's elements."""
    return define_collective(ret, name, params, WarpSpelling()) is not None \
        or define_matrix(ret, name, params, WarpSpelling()) is not None


def _generic_constant_space(text: str) -> str:
    """Metal's constant address space (2) as generic (0); casts that became no-ops dropped."""
    text = re.sub(r" addrspace\(2\)", "", text)
    # %v = addrspacecast ptr %x to ptr  ->  a no-op GEP (a cast within one space is invalid)
    text = re.sub(r"= addrspacecast ptr ([^,\n]+?) to ptr(?! addrspace)", r"= getelementptr i8, ptr \1, i64 0", text)
    return re.sub(r"addrspacecast \(ptr (@[-\w$.]+) to ptr\)", r"\1", text)


_PRODUCT = "air.simdgroup_matrix_8x8_multiply_accumulate"


def _aligned_threadgroup_arrays(text: str) -> str:
    """Threadgroup arrays aligned to 16 bytes. Metal's compiler aligns them to their element
    (a half tile: 2), which keeps LLVM from proving that a lane's neighbouring halves share
    one 4-byte word (steel GEMM's fragments) and from merging their loads; a definition's
    alignment is ours to raise, at the cost of a few bytes of padding."""
    return re.sub(r"^(@[-\w$.]+ = (?:internal |private )?(?:unnamed_addr )?addrspace\(3\) global [^\n]*, align )(\d+)$",
                  lambda m: m.group(1) + str(max(16, int(m.group(2)))), text, flags=re.M)


def _parameter(argument) -> str:
    if argument.kind == "threadgroup":
        return f"i32 %tg{argument.position}"
    if argument.kind not in ("buffer", "indirect_buffer") or not (argument.ir_type or "").startswith("ptr"):
        raise UnsupportedKernelError(f"argument {argument.position} {argument.name!r} is a {argument.kind} "
                                     f"({argument.ir_type}): the CUDA backend binds buffers and threadgroup memory only")
    return f"ptr addrspace(1) %p{argument.position}"


def _operand(argument, lines: List[str]) -> str:
    """The kernel's operand for a non-builtin argument, from the entry's parameter."""
    position = argument.position
    if argument.kind == "threadgroup":
        lines.append(f"%a{position} = getelementptr i8, ptr addrspace(3) {DYNAMIC_SHARED}, i32 %tg{position}")
        return f"ptr addrspace(3) %a{position}"
    if argument.ir_type == "ptr addrspace(1)":
        return f"ptr addrspace(1) %p{position}"
    lines.append(f"%a{position} = addrspacecast ptr addrspace(1) %p{position} to ptr")
    return f"ptr %a{position}"


def _thread(kernel: str, arguments, constructors: List[str], position_given: bool, relabel: bool = False):
    """(parameters, lines) of one Metal thread: its builtins from the special registers and
    the launch parameters (its x position given as ``%px`` where `position_given`; the
    Metal thread it plays relabelled where `relabel`: lane_relabeling.py), the
    constructors, the kernel's call."""
    lines: List[str] = []
    hardware = ".hw" if relabel else ""
    for axis in "xyz":
        lines += [f"%t{axis}{hardware} = call i32 @{_SREG}.tid.{axis}()", f"%a{axis} = call i32 @{_SREG}.ntid.{axis}()",
                  f"%c{axis} = call i32 @{_SREG}.ctaid.{axis}()", f"%g{axis} = add i32 %c{axis}, %base.{axis}",
                  f"%groups.{axis}.n = add i32 %grid.{axis}, %group.{axis}",
                  f"%groups.{axis}.m = sub i32 %groups.{axis}.n, 1",
                  f"%groups.{axis} = udiv i32 %groups.{axis}.m, %group.{axis}",
                  f"%o{axis} = mul i32 %g{axis}, %group.{axis}"]
    if relabel:
        lines += relabeled_thread_lines()
    for axis in "xyz":
        if not (position_given and axis == "x"):
            lines.append(f"%p{axis} = add i32 %o{axis}, %t{axis}")
    lines += ["%axy = mul i32 %ax, %ay", "%all = mul i32 %axy, %az",
              "%simds.n = add i32 %all, 31", "%simds = udiv i32 %simds.n, 32",
              "%quads.n = add i32 %all, 3", "%quads = udiv i32 %quads.n, 4",
              "%rowz = mul i32 %tz, %ay", "%row = add i32 %rowz, %ty", "%rowbase = mul i32 %row, %ax",
              "%linear = add i32 %rowbase, %tx"] + DISPATCH_LINES + LANE_LINES
    parameters, operands = [], []
    for a in sorted(arguments, key=lambda a: a.position):
        if a.is_builtin:
            operands.append(builtin_operand(a, lines))
        else:
            parameters.append(_parameter(a))
            operands.append(_operand(a, lines))
    parameters += [f"i32 %{name}" for name in LAUNCH_PARAMETERS]
    lines += [f"call void @{printed(name)}()" for name in constructors]
    lines.append(f"call void @{printed(kernel)}({', '.join(operands)})")
    return parameters, lines


def _entry(symbol: str, kernel: str, arguments, constructors: List[str], relabel: bool = False) -> str:
    parameters, lines = _thread(kernel, arguments, constructors, position_given=False, relabel=relabel)
    return (f"\ndefine ptx_kernel void @{entry_name(symbol)}({', '.join(parameters)}) {{\nentry:\n  "
            + "\n  ".join(lines) + "\n  ret void\n}\n")


def _coarsened_entry(symbol: str, kernel: str, arguments, constructors: List[str], text: str) -> str:
    parameters, lines = _thread(kernel, arguments, constructors, position_given=True)
    thread, listed = f"__tm_thread_{symbol}", ", ".join(parameters)
    return (f"\ndefine internal void @{thread}({listed}, i32 %px) alwaysinline {{\nentry:\n  "
            + "\n  ".join(lines) + "\n  ret void\n}\n"
            + coarsened_entry(entry_name(symbol, COARSENING), thread, listed, no_alias_buffers(text, kernel), text))


def lower(text: str, kernel: str, arguments, constants: Dict[int, object], symbol: str, datalayout: str,
          grid_only: bool = False) -> Tuple[str, Optional[str]]:
    """NVVM IR for `kernel` (its printed AIR module `text`) with these function-constant
    values, exporting the ``ptx_kernel`` ``__tm_cuda_<symbol>``; and where the kernel is
    `grid_only` (backend.py) and coarsenable, the same module exporting
    ``__tm_cuda_<symbol>_x4`` instead (coarsening.py), else None. libdevice's functions
    declared, to be linked (ptx.py)."""
    text = retarget(specialize_constants(text, constants), TRIPLE, datalayout)
    text = internalize(text, kernel, cooperative=True)  # every function inlines into the entry
    text = guard_integer_division(clamp_private_array_indices(text))
    text, constructors = take_constructors(text)
    check_constant_globals(text, kernel, constructors)
    text = _generic_constant_space(text)
    declared = {parsed[1]: parsed for parsed in map(parse_declaration, re.findall(r"^declare [^\n]*$", text, re.M)) if parsed}
    if any(name.startswith(_PRODUCT) for name in declared):  # tiles of matrix products (steel GEMM)
        text = _aligned_threadgroup_arrays(text)
    text = converge_top_level_collectives(text, kernel, lambda name: name in declared and _is_collective(*declared[name]))
    # Relabelled lanes serve tensor-core products alone, which need half or bfloat fragments;
    # elsewhere they only make the exact products' lane arithmetic longer.
    relabel = re.search(r"\b(half|bfloat)\b", text) is not None and relabel_safe(
        {name: parsed for name, parsed in declared.items() if name.startswith("air.")}, _names_lanes)
    text = round_bfloat_exactly(define_intrinsics(text, kernel, cuda_definition, "the CUDA backend", WarpSpelling(),
                                                   constructors))
    if f"@{PLACEHOLDER}(" in text and not relabel and "addrspace(3)" not in text:
        # No product can reach tensor cores nor read its operands from a tile
        # (tensor_core_products.py, tile_reads.py): no second optimization.
        text = exact_products(text)
    # What the CPU's runtime answers, answered by the GPU.
    text = text.replace("declare i32 @tm_rt_thread_in_group()", _THREAD_IN_GROUP)
    called = set(re.findall(r"call [^\n]*?@(tm_rt_\w+)\(", text))
    if called - {"tm_rt_thread_in_group"}:
        raise UnsupportedKernelError(f"{kernel}: the CUDA backend has no implementation of what "
                                     f"{', '.join(sorted(called))} provide on the CPU. Run it on the CPU backend")
    text = re.sub(r"^declare [^\n]*@tm_rt_\w+\([^\n]*\n", "", text, flags=re.M)
    declared = set(re.findall(r"^declare [^\n]*?@([-\w$.]+)\(", text, re.M))
    needed = [line for line in DECLARATIONS + _REGISTERS if re.search(r"@([-\w$.]+)\(", line).group(1) not in declared]
    text = use_libdevice(text)
    shared = f"{DYNAMIC_SHARED} = external addrspace(3) global [0 x i8], align 16\n"
    text += shared + "\n".join(needed) + "\n"
    coarse = None
    if f"@{RELABELED}(" in text:  # the products' lanes (matrix_products.py)
        text += relabeled_definition(relabel)
    elif grid_only and coarsenable(text, constructors, arguments):
        coarse = mark_convergent(text + _coarsened_entry(symbol, kernel, arguments, constructors, text), nounwind=True)
    return mark_convergent(text + _entry(symbol, kernel, arguments, constructors, relabel), nounwind=True), coarse

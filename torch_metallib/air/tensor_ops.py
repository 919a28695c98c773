"""Host definitions of Metal 4's matmul2d (MetalPerformancePrimitives:
``__tensorops_impl_matmul2d_op_*``, functions Metal's driver supplies, declared in section
``air.externally_defined``).

Each call carries the descriptor's constants (operand 0 left, 1 right, 2 destination; M, N,
K, K -1 for the tensor operands' extent; transpose left and right; relaxed precision; mode
0 multiply, 1 multiply_accumulate), the element types (the low byte is the width in bits,
the high nibble the kind: 0x10000010 half, 0x10000020 float, 0x90000010 bfloat, 0x20000008
char, 0x20000020 int) and the execution scope's thread count. A cooperative tensor is the
lane's share of one operand in thread memory: ``data_size`` bytes, ``num_elements``
elements, element i at ``get_element_pointer(i)`` (index 0xFFFF: the storage itself, which
``run`` is given) and at ``get_coordinate(i)`` (column, row) of the operand; ``init``
clears it; ``load_dv``/``load_tg`` and ``store_dv``/``store_tg`` move it from or to a
tensor in device or threadgroup memory (private_tensors.py), reading zeros outside the
tensor's extents and writing nothing there.

``run_cooperative_<left>_<right>_<destination>`` (``dv_`` before an operand: a tensor, not
a cooperative tensor) is one SIMD-group exchange (csrc/cpu/tensor_ops.cpp): every lane
stages its cooperative elements, the first lane to read the completed exchange reads the
tensor operands (zeros outside their extents, as Metal masks them), computes C = A*B (+ C)
with one fused multiply-add in float per k in k order (relaxed precision allows any order;
integer results exactly), and every lane reads its share of C.

Which element a lane holds is the layout MLX's NAX kernels rely on (steel/gemm/nax.h,
``BaseNAXFrag::get_coord``): the operand as stored (left M x K, or K x M transposed; right
K x N, or N x K transposed; destination M x N) in 16 x 16 blocks, in row-major block order,
each lane holding rows r and r + 8 of four adjacent columns of each block. Supported:
execution on one SIMD-group (32 threads), M and N multiples of 16, K a multiple of 16 or
dynamic where no cooperative tensor depends on it, tensors of rank 2. Other descriptors
and scopes are refused, naming them.
"""

import re
from typing import List, Optional, Tuple

from .collectives import MASK_OFFSET, WAIT_ALLOCA, _definition, _staged_exchange, simd_position
from .target import Target
from ..errors import UnsupportedKernelError

__all__ = ["define_tensor_op", "check_tensor_op_calls", "TENSOR_OP_PREFIX"]

TENSOR_OP_PREFIX = "__tensorops_impl_matmul2d_op_"
_DESCRIPTOR = ["i32", "i32", "i32", "i32", "i8", "i8", "i8", "i32"]
_TYPES = {"f16": 0x10000010, "f32": 0x10000020, "b16": 0x90000010, "i8": 0x20000008, "i32": 0x20000020}
_TYPE = "(f16|f32|b16|i8|i32)"
_DECLARATIONS = {
    "stage": "declare void @tm_rt_matmul2d_stage(ptr, i32, ptr, ptr, ptr, i32, i32, i32, ptr)",
    "multiply": "declare void @tm_rt_matmul2d_multiply(ptr, ptr, i32, ptr, ptr, i32, i32, i32)",
    "read": "declare void @tm_rt_matmul2d_read(ptr, i32, ptr, i32, ptr)",
    "resolve": "declare void @tm_rt_matmul2d_resolve(ptr, ptr, ptr, ptr)",
    "load": "declare void @tm_rt_matmul2d_load(ptr, i32, i32, ptr, i32, ptr, i32)",
    "store": "declare void @tm_rt_matmul2d_store(ptr, i32, i32, ptr, i32, ptr, i32)",
    "coordinate": "declare void @tm_rt_matmul2d_coordinate(ptr, i32, i32, i32, ptr, i32)",
    "memset": "declare void @llvm.memset.p0.i64(ptr, i8, i64, i1)",
}
# Functions whose result depends on the calling lane: only a cooperating SIMD-group runs them.
_LANE_OPERATIONS = ("run_cooperative_", "cooperative_tensor_load_", "cooperative_tensor_store_",
                    "cooperative_tensor_get_coordinate")


def _which(operand: str) -> List[str]:
    """%is0, %is1: whether operand `operand` is the left or the right one."""
    return [f"%is0 = icmp eq i32 {operand}, 0", f"%is1 = icmp eq i32 {operand}, 1"]


def _type_of(types: List[str]) -> List[str]:
    """%type: the element type of the operand _which tested, among `types`."""
    return [f"%t01 = select i1 %is1, i32 {types[1]}, i32 {types[2]}", f"%type = select i1 %is0, i32 {types[0]}, i32 %t01"]


def _count(operand: str, threads: str) -> List[str]:
    """%share (i32): the lane's number of elements of operand `operand` (0, 1, 2), given
    the descriptor in %a0..%a7 and the scope's thread count `threads` (0 taken as 1)."""
    return _which(operand) + ["%mk = mul i32 %a1, %a3", "%kn = mul i32 %a3, %a2", "%mn = mul i32 %a1, %a2",
            "%n01 = select i1 %is1, i32 %kn, i32 %mn", "%count = select i1 %is0, i32 %mk, i32 %n01",
            f"%threads.ok = icmp ne i32 {threads}, 0", f"%threads = select i1 %threads.ok, i32 {threads}, i32 1",
            "%share = udiv i32 %count, %threads"]


def _share_bytes(operand: str, types: List[str], threads: str) -> List[str]:
    """%bytes (i64): the lane's share of operand `operand` in bytes, its element types
    `types` (three i32 operands)."""
    return _count(operand, threads) + _type_of(types) + [
            "%bits = and i32 %type, 255", "%width = lshr i32 %bits, 3",
            "%share.w = zext i32 %share to i64", "%width.w = zext i32 %width to i64", "%bytes = mul i64 %share.w, %width.w"]


def _descriptor_struct() -> List[str]:
    """%desc: the descriptor passed as %a1..%a7, laid out as AIR's struct (20 bytes)."""
    lines = ["%desc = alloca [20 x i8], align 4"]
    for index, (offset, type_name) in enumerate(((0, "i32"), (4, "i32"), (8, "i32"), (12, "i8"), (13, "i8"),
                                                 (14, "i8"), (16, "i32")), start=1):
        lines += [f"%desc{offset} = getelementptr i8, ptr %desc, i32 {offset}", f"store {type_name} %a{index}, ptr %desc{offset}"]
    return lines


_LANE = simd_position("urem", "%lane")


def define_tensor_op(ret: str, name: str, params: List[str], target: Target) -> Optional[Tuple[str, List[str]]]:
    """(definition, declarations) of a matmul2d tensor operation, or None."""
    if not name.startswith(TENSOR_OP_PREFIX):
        return None
    op = name[len(TENSOR_OP_PREFIX):]
    types = ["%a10", "%a11", "%a12"]  # where most forms pass the element types
    if op == "cooperative_tensor_data_size" and params == _DESCRIPTOR + ["i32"] * 4 and ret == "i64":
        lines = _share_bytes("%a0", ["%a8", "%a9", "%a10"], "%a11") + ["%r = add i64 %bytes, 0"]
        return _definition(ret, name, params, lines), []
    if op == "cooperative_tensor_init" and params == _DESCRIPTOR + ["ptr"] + ["i32"] * 4 and ret == "void":
        lines = _share_bytes("%a0", ["%a9", "%a10", "%a11"], "%a12")
        lines += ["call void @llvm.memset.p0.i64(ptr %a8, i8 0, i64 %bytes, i1 false)"]
        return _definition(ret, name, params, lines), [_DECLARATIONS["memset"]]
    if op == "cooperative_tensor_num_elements" and params == _DESCRIPTOR + ["ptr"] + ["i32"] * 3 and ret == "i16":
        lines = _count("%a0", "%a11") + ["%r = trunc i32 %share to i16"]
        return _definition(ret, name, params, lines), []
    if op == "cooperative_tensor_is_valid_element" and params == _DESCRIPTOR + ["ptr", "i16"] + ["i32"] * 4 \
            and ret == "i1":
        lines = _count("%a0", "%a13") + ["%index = zext i16 %a9 to i32", "%r = icmp ult i32 %index, %share"]
        return _definition(ret, name, params, lines), []
    if op == "cooperative_tensor_get_element_pointer" and params == _DESCRIPTOR + ["ptr", "i16"] + ["i32"] * 3 \
            and ret == "ptr":
        lines = _which("%a0") + _type_of(types) + [
                 "%bits = and i32 %type, 255", "%width = lshr i32 %bits, 3", "%width.w = zext i32 %width to i64",
                 "%whole = icmp eq i16 %a9, -1", "%index = zext i16 %a9 to i64",
                 "%offset.e = mul i64 %index, %width.w", "%offset = select i1 %whole, i64 0, i64 %offset.e",
                 "%r = getelementptr i8, ptr %a8, i64 %offset"]
        return _definition(ret, name, params, lines), []
    if op == "cooperative_tensor_get_coordinate" and params == _DESCRIPTOR + ["ptr", "i16", "ptr"] + ["i32"] * 5 \
            and ret == "void":
        lines = _descriptor_struct() + _LANE + [
            "%index = zext i16 %a9 to i32",
            "call void @tm_rt_matmul2d_coordinate(ptr %desc, i32 %a0, i32 %lane, i32 %index, ptr %a10, i32 %a11)"]
        return _definition(ret, name, params, lines), [_DECLARATIONS["coordinate"]]
    move = re.fullmatch(r"cooperative_tensor_(load|store)_(dv|tg)_" + _TYPE, op)
    if move and ret == "void" and params == _DESCRIPTOR + ["ptr", "ptr"] + ["i32"] * (6 if move.group(1) == "load" else 5):
        direction, tensor_type = move.group(1), _TYPES[move.group(3)]
        types = ["%a12", "%a13", "%a14"] if direction == "load" else ["%a11", "%a12", "%a13"]
        lines = _descriptor_struct() + _LANE + _which("%a0") + _type_of(types) + [
            f"call void @tm_rt_matmul2d_{direction}(ptr %desc, i32 %a0, i32 %lane, ptr %a8, i32 %type, ptr %a9, "
            f"i32 {tensor_type})"]
        return _definition(ret, name, params, lines), [_DECLARATIONS[direction]]
    run = re.fullmatch(r"run_cooperative_(dv_)?{0}_(dv_)?{0}_{0}".format(_TYPE), op)
    if run and ret == "void":
        left_tensor, right_tensor = bool(run.group(1)), bool(run.group(3))
        expected = ["ptr"] + ["ptr", "i32"][:1 + left_tensor] + ["ptr", "i32"][:1 + right_tensor] + ["ptr", "i32"]
        if params == expected:
            element_types = [_TYPES[run.group(2)], _TYPES[run.group(4)], _TYPES[run.group(5)]]
            right_at = 2 + left_tensor
            destination_at = right_at + 1 + right_tensor
            return _definition(ret, name, params, _run(element_types, left_tensor, right_tensor, right_at,
                                                       destination_at, target)), \
                [_DECLARATIONS[k] for k in ("resolve", "stage", "multiply", "read")]
    return None


def _run(types: List[int], left_tensor: bool, right_tensor: bool, right_at: int, destination_at: int,
         target: Target) -> List[str]:
    """The product as one exchange, staged like simdgroup_matrix's (simdgroup_matrix.py).
    Parameters: %a0 the descriptor, then the left operand at %a1, the right at
    %a<right_at> and the destination at %a<destination_at>; a tensor operand is followed
    by its rank."""
    left, right, destination = types
    cooperative = [f"ptr {'null' if is_tensor else f'%a{at}'}" for is_tensor, at in ((left_tensor, 1),
                                                                                     (right_tensor, right_at))]
    tensors = [f"ptr {f'%a{at}' if is_tensor else 'null'}" for is_tensor, at in ((left_tensor, 1),
                                                                                 (right_tensor, right_at))]
    return [WAIT_ALLOCA, "%resolved = alloca [20 x i8], align 4",
            f"call void @tm_rt_matmul2d_resolve(ptr %a0, ptr %resolved, {', '.join(tensors)})",
            "%m.p = getelementptr i8, ptr %resolved, i32 0", "%m = load i32, ptr %m.p",
            "%n.p = getelementptr i8, ptr %resolved, i32 4", "%n = load i32, ptr %n.p",
            "%k.p = getelementptr i8, ptr %resolved, i32 8", "%k = load i32, ptr %k.p",
            "%m.w = zext i32 %m to i64", "%n.w = zext i32 %n to i64", "%k.w = zext i32 %k to i64",
            "%mk = mul i64 %m.w, %k.w", "%kn = mul i64 %k.w, %n.w", "%mn = mul i64 %m.w, %n.w",
            "%values0 = add i64 %mk, %kn", "%values = add i64 %values0, %mn", "%staged.bytes = mul i64 %values, 8",
            ] + _staged_exchange("%staged.bytes", [
                f"call void @tm_rt_matmul2d_stage(ptr %resolved, i32 %lane, {', '.join(cooperative)}, "
                f"ptr %a{destination_at}, i32 {left}, i32 {right}, i32 {destination}, ptr %staged)"], target) + [
            "br i1 %leads, label %compute, label %read", "compute:",
            f"%mask.p = getelementptr i8, ptr %slots, i32 {MASK_OFFSET}", "%mask = load i32, ptr %mask.p",
            f"call void @tm_rt_matmul2d_multiply(ptr %resolved, ptr %staged, i32 %mask, {', '.join(tensors)}, "
            f"i32 {left}, i32 {right}, i32 {destination})", "br label %read",
            "read:", f"call void @tm_rt_matmul2d_read(ptr %resolved, i32 %lane, ptr %a{destination_at}, "
                     f"i32 {destination}, ptr %staged)"]


# A call on one line, its arguments up to the line's last parenthesis (they hold some:
# dereferenceable(20)), past the return type's attributes (zeroext i16).
_CALL = re.compile(r"call [^@\n]*@" + TENSOR_OP_PREFIX + r"(\w+)\((.*)\)")
_SCOPE = re.compile(r"execution_simdgroupsILm(\d+)E")


def _arguments(text: str) -> List[str]:
    return [a.strip().split()[-1] for a in text.split(",")]


def check_tensor_op_calls(text: str, kernel: str, cooperative: bool) -> None:
    """Refuses a kernel whose matmul2d the CPU backend cannot run: M or N not a constant
    multiple of 16, K neither that nor dynamic (-1) where no cooperative tensor depends on
    it, tensors of a rank other than 2, an execution scope of several SIMD-groups, or a
    kernel not run as a cooperating SIMD-group."""
    for scope in sorted(set(_SCOPE.findall(text))):
        if scope != "1":
            raise UnsupportedKernelError(
                f"{kernel}: runs matmul2d on {scope} SIMD-groups together (execution_simdgroups<{scope}>); the CPU "
                f"backend runs it on one SIMD-group (execution_simdgroup). Run it on a Mac with MPS tensors")
    for match in _CALL.finditer(text):
        op, arguments = match.group(1), _arguments(match.group(2))
        if op.startswith(_LANE_OPERATIONS) and not cooperative:
            raise UnsupportedKernelError(f"{kernel}: calls {TENSOR_OP_PREFIX}{op} but was not compiled as a "
                                         f"cooperating SIMD-group. Please report the kernel")
        if op.startswith("run_"):
            left_tensor = op.startswith("run_cooperative_dv_")
            right_tensor = op.count("dv_") > left_tensor
            ranks = [arguments[2]] * left_tensor + [arguments[-3]] * right_tensor  # each follows its tensor
        else:
            ranks = arguments[10:12] if op.startswith("cooperative_tensor_load_") else \
                arguments[10:11] if op.startswith("cooperative_tensor_store_") else []
            operand, (m, n, k) = arguments[0], arguments[1:4]
            k_ok = k == "-1" and operand == "2" or _multiple_of_16(k)
            if not (_multiple_of_16(m) and _multiple_of_16(n) and k_ok):
                raise UnsupportedKernelError(
                    f"{kernel}: a matmul2d descriptor with M, N, K = {m}, {n}, {k} (operand {operand}); the CPU "
                    f"backend runs constant multiples of 16 (up to 4096), K also dynamic (-1) when only the "
                    f"destination is a cooperative tensor. Run it on a Mac with MPS tensors")
        if any(rank != "2" for rank in ranks):
            raise UnsupportedKernelError(f"{kernel}: {TENSOR_OP_PREFIX}{op} on a tensor of rank "
                                         f"{', '.join(ranks)}; the CPU backend runs rank 2. Run it on a Mac "
                                         f"with MPS tensors")


def _multiple_of_16(value: str) -> bool:
    return value.isdigit() and int(value) % 16 == 0 and 0 < int(value) <= 4096

"""Host definitions of Metal 4's matmul2d on cooperative tensors (MetalPerformancePrimitives:
``__tensorops_impl_matmul2d_op_*``, functions Metal's driver supplies, declared in section
``air.externally_defined``).

Each call carries the descriptor's constants (operand 0 left, 1 right, 2 destination; M, N,
K; transpose left and right; relaxed precision; mode 0 multiply, 1 multiply_accumulate),
the three element types (the low byte is the width in bits: 0x10000010 half, 0x10000020
float, 0x90000010 bfloat) and the execution scope's thread count. A cooperative tensor is
the lane's share of one operand in thread memory: ``data_size`` bytes, element i at
``get_element_pointer(i)`` (index 0xFFFF: the storage itself, which ``run`` is given),
``init`` clears it. ``run_cooperative_<left>_<right>_<destination>`` is one SIMD-group
exchange (csrc/cpu/tensor_ops.cpp): every lane stages its elements as float, the first lane
to read the completed exchange computes C = A*B (+ C) with one fused multiply-add per k in
k order (relaxed precision allows any order), every lane reads its share of C.

Which element a lane holds is the layout MLX's NAX kernels rely on (steel/gemm/nax.h,
``BaseNAXFrag::get_coord``): the operand as stored (left M x K, or K x M transposed; right
K x N, or N x K transposed; destination M x N) in 16 x 16 blocks, in row-major block order,
each lane holding rows r and r + 8 of four adjacent columns of each block. Supported:
execution on one SIMD-group (32 threads), M, N and K multiples of 16, half, bfloat and
float operands held in cooperative tensors. Forms that take a tensor in device or
threadgroup memory (``_dv_``, ``load_tg``, ``store_dv``...) and the ``air.*_private_tensor``
intrinsics are not implemented: kernels calling them are refused, naming them.
"""

import re
from typing import List, Optional, Tuple

from .collectives import MASK_OFFSET, WAIT_ALLOCA, _definition, _staged_exchange
from ...errors import UnsupportedKernelError

__all__ = ["define_tensor_op", "check_tensor_op_calls", "TENSOR_OP_PREFIX"]

TENSOR_OP_PREFIX = "__tensorops_impl_matmul2d_op_"
_DESCRIPTOR = ["i32", "i32", "i32", "i32", "i8", "i8", "i8", "i32"]
_TYPES = {"f16": 0x10000010, "f32": 0x10000020, "b16": 0x90000010}
_HELPERS = ["declare void @tm_rt_matmul2d_stage(ptr, i32, ptr, ptr, ptr, i32, i32, i32, ptr)",
            "declare void @tm_rt_matmul2d_multiply(ptr, ptr, i32)",
            "declare void @tm_rt_matmul2d_read(ptr, i32, ptr, i32, ptr)"]
_MEMSET = "declare void @llvm.memset.p0.i64(ptr, i8, i64, i1)"


def _share_bytes(operand: str, types: List[str], threads: str) -> List[str]:
    """%bytes (i64): the lane's share of operand `operand` (0, 1, 2), given the descriptor
    in %a0..%a7 and the element types `types` (three i32 operands)."""
    return ["%mk = mul i32 %a1, %a3", "%kn = mul i32 %a3, %a2", "%mn = mul i32 %a1, %a2",
            f"%is0 = icmp eq i32 {operand}, 0", f"%is1 = icmp eq i32 {operand}, 1",
            "%n01 = select i1 %is1, i32 %kn, i32 %mn", "%count = select i1 %is0, i32 %mk, i32 %n01",
            f"%t01 = select i1 %is1, i32 {types[1]}, i32 {types[2]}", f"%type = select i1 %is0, i32 {types[0]}, i32 %t01",
            "%bits = and i32 %type, 255", "%width = lshr i32 %bits, 3",
            f"%share = udiv i32 %count, {threads}", "%share.w = zext i32 %share to i64",
            "%width.w = zext i32 %width to i64", "%bytes = mul i64 %share.w, %width.w"]


def define_tensor_op(ret: str, name: str, params: List[str]) -> Optional[Tuple[str, List[str]]]:
    """(definition, declarations) of a matmul2d tensor operation, or None."""
    if not name.startswith(TENSOR_OP_PREFIX):
        return None
    op = name[len(TENSOR_OP_PREFIX):]
    if op == "cooperative_tensor_data_size" and params == _DESCRIPTOR + ["i32"] * 4 and ret == "i64":
        lines = _share_bytes("%a0", ["%a8", "%a9", "%a10"], "%threads") + ["%r = add i64 %bytes, 0"]
        lines = ["%threads.ok = icmp ne i32 %a11, 0", "%threads = select i1 %threads.ok, i32 %a11, i32 1"] + lines
        return _definition(ret, name, params, lines), []
    if op == "cooperative_tensor_init" and params == _DESCRIPTOR + ["ptr"] + ["i32"] * 4 and ret == "void":
        lines = ["%threads.ok = icmp ne i32 %a12, 0", "%threads = select i1 %threads.ok, i32 %a12, i32 1"]
        lines += _share_bytes("%a0", ["%a9", "%a10", "%a11"], "%threads")
        lines += ["call void @llvm.memset.p0.i64(ptr %a8, i8 0, i64 %bytes, i1 false)"]
        return _definition(ret, name, params, lines), [_MEMSET]
    if op == "cooperative_tensor_get_element_pointer" and params == _DESCRIPTOR + ["ptr", "i16"] + ["i32"] * 3 \
            and ret == "ptr":
        lines = ["%is0 = icmp eq i32 %a0, 0", "%is1 = icmp eq i32 %a0, 1",
                 "%t01 = select i1 %is1, i32 %a11, i32 %a12", "%type = select i1 %is0, i32 %a10, i32 %t01",
                 "%bits = and i32 %type, 255", "%width = lshr i32 %bits, 3", "%width.w = zext i32 %width to i64",
                 "%whole = icmp eq i16 %a9, -1", "%index = zext i16 %a9 to i64",
                 "%offset.e = mul i64 %index, %width.w", "%offset = select i1 %whole, i64 0, i64 %offset.e",
                 "%r = getelementptr i8, ptr %a8, i64 %offset"]
        return _definition(ret, name, params, lines), []
    run = re.fullmatch(r"run_cooperative_(f16|f32|b16)_(f16|f32|b16)_(f16|f32|b16)", op)
    if run and params == ["ptr", "ptr", "ptr", "ptr", "i32"] and ret == "void":
        return _definition(ret, name, params, _run([_TYPES[t] for t in run.groups()])), list(_HELPERS)
    return None


def _run(types: List[int]) -> List[str]:
    """The product as one exchange, staged like simdgroup_matrix's (simdgroup_matrix.py)."""
    left, right, destination = types
    return [WAIT_ALLOCA,
            "%m.p = getelementptr i8, ptr %a0, i32 0", "%m = load i32, ptr %m.p",
            "%n.p = getelementptr i8, ptr %a0, i32 4", "%n = load i32, ptr %n.p",
            "%k.p = getelementptr i8, ptr %a0, i32 8", "%k = load i32, ptr %k.p",
            "%mk = mul i32 %m, %k", "%kn = mul i32 %k, %n", "%mn = mul i32 %m, %n",
            "%floats0 = add i32 %mk, %kn", "%floats = add i32 %floats0, %mn",
            "%floats.w = zext i32 %floats to i64", "%staged.bytes = mul i64 %floats.w, 4",
            ] + _staged_exchange("%staged.bytes", [
                f"call void @tm_rt_matmul2d_stage(ptr %a0, i32 %lane, ptr %a1, ptr %a2, ptr %a3, i32 {left}, "
                f"i32 {right}, i32 {destination}, ptr %staged)"]) + [
            "br i1 %leads, label %compute, label %read", "compute:",
            f"%mask.p = getelementptr i8, ptr %slots, i32 {MASK_OFFSET}", "%mask = load i32, ptr %mask.p",
            "call void @tm_rt_matmul2d_multiply(ptr %a0, ptr %staged, i32 %mask)", "br label %read",
            "read:", f"call void @tm_rt_matmul2d_read(ptr %a0, i32 %lane, ptr %a3, i32 {destination}, ptr %staged)"]


_CALL = re.compile(r"call \w+ @" + TENSOR_OP_PREFIX + r"(\w+)\(([^)]*)\)")


def check_tensor_op_calls(text: str, kernel: str, cooperative: bool) -> None:
    """Refuses a kernel whose matmul2d descriptors the CPU backend cannot run: M, N or K
    not a constant multiple of 16, or a kernel not run as a cooperating SIMD-group."""
    for match in _CALL.finditer(text):
        if match.group(1).startswith("run_"):
            if not cooperative:
                raise UnsupportedKernelError(f"{kernel}: calls {TENSOR_OP_PREFIX}{match.group(1)} but was not "
                                             f"compiled as a cooperating SIMD-group. Please report the kernel")
            continue
        values = [a.strip().split()[-1] for a in match.group(2).split(",")[1:4]]
        if not all(v.isdigit() and int(v) % 16 == 0 and 0 < int(v) <= 4096 for v in values):
            raise UnsupportedKernelError(
                f"{kernel}: a matmul2d descriptor with M, N, K = {', '.join(values)}; the CPU backend runs "
                f"constant multiples of 16 (up to 4096). Run it on a Mac with MPS tensors")

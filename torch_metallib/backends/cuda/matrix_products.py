"""``simdgroup_matrix_8x8_multiply_accumulate`` on a warp: D = A*B + C.

The meaning is the CPU backend's (backends/cpu/simdgroup_matrix.py, whose load, store and
init definitions the CUDA backend reuses): lane l holds M[r][c] and M[r][c+1] of each 8x8
matrix, r = ((l>>4)<<2)|((l>>1)&3), c = ((l>>3)&1)*4 + (l&1)*2; each element of D is C plus
the eight products of a row of A and a column of B, in k order, each step one fused
multiply-add in float; a lane that does not take part counts as zeros.

Two spellings, chosen per product:

* **Tensor cores** where A and B hold half (or bfloat) values and all 32 lanes take part:
  one ``mma.sync.m16n8k8`` (rows 8-15 of its A zero) with float accumulation, the operands
  moved between Metal's lane layout and the instruction's by 7 shuffles. Products of half
  or bfloat values are exact in float, so this keeps Metal's precision; the eight sums are
  the tensor core's, which need not round as a chain of FMAs does (results may differ from
  the CPU backend's in the last bits of float). The values are half where the operands'
  type says so, or where each float operand is, after optimization, a conversion from half
  (MLX's steel GEMMs load half tiles into float fragments): ``@tm.cuda.exact.f16(float)``
  marks the question, answered by exact_halves.py once O3 has run.
* **FMAs** otherwise: each lane gathers its row of A (8 values from 4 lanes) and its two
  columns of B (16 values from 8 lanes) with 24 shuffles and does 16 FMAs, bit for bit what
  the CPU computes.
"""

import re
from typing import FrozenSet, List, Optional, Tuple

from ..cpu.collectives import _definition
from ..cpu.intrinsics import element_type
from ..cpu.simdgroup_matrix import _lane_position, _to_float
from .warp_spelling import shuffle

__all__ = ["define_matrix_product", "converted_types", "EXACT_MARKER", "TENSOR_CORE_TYPES"]

_NAME = "air.simdgroup_matrix_8x8_multiply_accumulate"
_FMA = "declare float @llvm.fma.f32(float, float, float)"
EXACT_MARKER = "tm.cuda.exact"  # @tm.cuda.exact.<kind>(float): is this float a <kind> value converted?
TENSOR_CORE_TYPES = {"half": "f16", "bfloat": "bf16"}  # operand element type -> mma's spelling
_MMA = ('asm "mma.sync.aligned.m16n8k8.row.col.f32.{kind}.{kind}.f32 {{$0, $1, $2, $3}}, {{$4, $5}}, {{$6}}, '
        '{{$7, $8, $9, $10}};", "=f,=f,=f,=f,r,r,r,f,f,f,f"')


def _lane_of(row: str, column: str, name: str) -> List[str]:
    """%`name` = the lane holding (row, column) and (row, column + 1), column even:
    ((row>>2)<<4) | ((column>>2)<<3) | ((row&3)<<1) | ((column>>1)&1)."""
    return [f"%{name}.r2 = lshr i32 {row}, 2", f"%{name}.r4 = shl i32 %{name}.r2, 4",
            f"%{name}.c2 = lshr i32 {column}, 2", f"%{name}.c3 = shl i32 %{name}.c2, 3",
            f"%{name}.r3 = and i32 {row}, 3", f"%{name}.r1 = shl i32 %{name}.r3, 1",
            f"%{name}.c1 = lshr i32 {column}, 1", f"%{name}.c0 = and i32 %{name}.c1, 1",
            f"%{name}.hi = or i32 %{name}.r4, %{name}.c3", f"%{name}.lo = or i32 %{name}.r1, %{name}.c0",
            f"%{name} = or i32 %{name}.hi, %{name}.lo"]


def _gathered(value: str, lane: str, name: str) -> List[str]:
    """%`name` = float `value` of lane `lane`, 0.0 if that lane does not take part."""
    return shuffle("float", value, lane, f"{name}.s") + [
        f"%{name}.bit = lshr i32 %mask, {lane}", f"%{name}.b = and i32 %{name}.bit, 1",
        f"%{name}.in = icmp ne i32 %{name}.b, 0", f"%{name} = select i1 %{name}.in, float %{name}.s, float 0.0"]


def _fma_product() -> List[str]:
    """Lines leaving %d0.7 and %d1.7, the lane's two elements of D, from FMAs."""
    lines = []
    for k in range(0, 8, 2):  # A[row][k], A[row][k + 1]: slots 0 and 1 of the lane holding them
        lines += _lane_of("%row", str(k), f"la{k}")
        lines += _gathered("%fa0", f"%la{k}", f"ar{k}") + _gathered("%fa1", f"%la{k}", f"ar{k + 1}")
    for k in range(8):  # B[k][col], B[k][col + 1]
        lines += _lane_of(str(k), "%col", f"lb{k}")
        lines += _gathered("%fb0", f"%lb{k}", f"bc{k}.0") + _gathered("%fb1", f"%lb{k}", f"bc{k}.1")
    for j in (0, 1):
        acc = f"%fc{j}"
        for k in range(8):
            lines.append(f"%d{j}.{k} = call float @llvm.fma.f32(float %ar{k}, float %bc{k}.{j}, float {acc})")
            acc = f"%d{j}.{k}"
    return lines


def _packed(kind: str, operand: str, half: str) -> List[str]:
    """%`kind`.p`operand`: this lane's two `half` elements of `operand` ("a" or "b") as one
    i32, the first in the low bits (a bfloat is a float's high half: its bits, not a rounding)."""
    p = f"%{kind}.{operand}"
    if half == "bfloat":
        return [f"{p}0 = bitcast float %f{operand}0 to i32", f"{p}1 = bitcast float %f{operand}1 to i32",
                f"{p}lo = lshr i32 {p}0, 16", f"{p}hi = and i32 {p}1, -65536", f"%{kind}.p{operand} = or i32 {p}lo, {p}hi"]
    return [f"{p}0 = fptrunc float %f{operand}0 to {half}", f"{p}1 = fptrunc float %f{operand}1 to {half}",
            f"{p}v0 = insertelement <2 x {half}> poison, {half} {p}0, i32 0",
            f"{p}v = insertelement <2 x {half}> {p}v0, {half} {p}1, i32 1",
            f"%{kind}.p{operand} = bitcast <2 x {half}> {p}v to i32"]


def _tensor_core_product(half: str) -> List[str]:
    """Lines leaving %<kind>.D0 and %<kind>.D1, the lane's two elements of D, from one
    mma.sync.m16n8k8 (all 32 lanes): lane m of the instruction holds A[m>>2][2(m&3)..+1],
    B[2(m&3)..+1][m>>2] and C/D[m>>2][2(m&3)..+1]."""
    kind = TENSOR_CORE_TYPES[half]
    k = f"%{kind}"
    lines = _packed(kind, "a", half) + _packed(kind, "b", half)
    lines += [f"{k}.mr = lshr i32 %lane, 2", f"{k}.mq = and i32 %lane, 3", f"{k}.mc = shl i32 {k}.mq, 1"]
    lines += _lane_of(f"{k}.mr", f"{k}.mc", f"{kind}.la")  # the Metal lane holding this lane's A and C pairs
    lines += shuffle("i32", f"{k}.pa", f"{k}.la", f"{kind}.A", mask="-1")
    lines += shuffle("float", "%fc0", f"{k}.la", f"{kind}.C0", mask="-1")
    lines += shuffle("float", "%fc1", f"{k}.la", f"{kind}.C1", mask="-1")
    # B[k][n] (k = mc, mc + 1; n = mr) is element n & 1 of the pair of the lane holding (k, n & ~1).
    lines += [f"{k}.ne = and i32 {k}.mr, 6", f"{k}.k1 = or i32 {k}.mc, 1"]
    lines += _lane_of(f"{k}.mc", f"{k}.ne", f"{kind}.lb0") + _lane_of(f"{k}.k1", f"{k}.ne", f"{kind}.lb1")
    lines += shuffle("i32", f"{k}.pb", f"{k}.lb0", f"{kind}.B0", mask="-1")
    lines += shuffle("i32", f"{k}.pb", f"{k}.lb1", f"{kind}.B1", mask="-1")
    lines += [f"{k}.odd = and i32 {k}.mr, 1", f"{k}.sh = shl i32 {k}.odd, 4",
              f"{k}.b0s = lshr i32 {k}.B0, {k}.sh", f"{k}.b0l = and i32 {k}.b0s, 65535",
              f"{k}.b1s = lshr i32 {k}.B1, {k}.sh", f"{k}.b1h = shl i32 {k}.b1s, 16", f"{k}.B = or i32 {k}.b0l, {k}.b1h",
              f"{k}.d = call {{ float, float, float, float }} {_MMA.format(kind=kind)}(i32 {k}.A, i32 0, i32 {k}.B, "
              f"float {k}.C0, float {k}.C1, float 0.0, float 0.0) convergent nounwind",
              f"{k}.d0 = extractvalue {{ float, float, float, float }} {k}.d, 0",
              f"{k}.d1 = extractvalue {{ float, float, float, float }} {k}.d, 1",
              # This Metal lane's D[row][col..col+1] is in instruction lane row*4 + col/2.
              f"{k}.sr = shl i32 %row, 2", f"{k}.sc = lshr i32 %col, 1", f"{k}.src = or i32 {k}.sr, {k}.sc"]
    lines += shuffle("float", f"{k}.d0", f"{k}.src", f"{kind}.D0", mask="-1")
    lines += shuffle("float", f"{k}.d1", f"{k}.src", f"{kind}.D1", mask="-1")
    return lines


def converted_types(text: str) -> FrozenSet[str]:
    """The tensor-core element types that module `text` converts to float anywhere: only
    their paths can be taken by products of float operands (a float GEMM asks nothing, and
    its optimization does not pay for paths it cannot take)."""
    return frozenset(t for t in TENSOR_CORE_TYPES if re.search(rf"= fpext (?:<\d+ x )?{t}>? ", text))


def _tensor_core_kinds(a: str, b: str, converted: FrozenSet[str]) -> List[str]:
    """The element types (half, bfloat) whose tensor-core path a product with A of type `a`
    and B of type `b` may take: the operands' own, or, for float operands, each type the
    module converts (`converted`), as a question to exact_halves.py."""
    if a == b and a in TENSOR_CORE_TYPES:
        return [a]
    return [t for t in TENSOR_CORE_TYPES if t in converted] if a == b == "float" else []


def _exact_test(half: str, static: bool) -> List[str]:
    """%<kind>.use: this product takes the tensor-core path for `half` values."""
    kind = TENSOR_CORE_TYPES[half]
    if static:
        return [f"%{kind}.use = and i1 %full, true"]
    lines = [f"%{kind}.e{v} = call i1 @{EXACT_MARKER}.{kind}(float %f{v})" for v in ("a0", "a1", "b0", "b1")]
    return lines + [f"%{kind}.ea = and i1 %{kind}.ea0, %{kind}.ea1", f"%{kind}.eb = and i1 %{kind}.eb0, %{kind}.eb1",
                    f"%{kind}.e = and i1 %{kind}.ea, %{kind}.eb", f"%{kind}.use = and i1 %{kind}.e, %full"]


def define_matrix_product(ret: str, name: str, params: List[str],
                          converted: FrozenSet[str] = frozenset()) -> Optional[Tuple[str, List[str]]]:
    """(definition, declarations) of a multiply_accumulate, None if not one; `converted`:
    the module's converted_types."""
    if not name.startswith(_NAME + ".") or len(params) != 3 or not all(t.startswith("<64 x ") for t in params + [ret]):
        return None
    lines = ["%mask = call i32 @llvm.nvvm.activemask()", "%lane = call i32 @llvm.nvvm.read.ptx.sreg.laneid()"]
    lines += _lane_position()
    for index, operand in enumerate("abc"):
        for k in (0, 1):
            lines.append(f"%f{operand}{k}.e = extractelement {params[index]} %a{index}, i32 {k}")
            lines += _to_float(element_type(params[index]), f"%f{operand}{k}.e", f"%f{operand}{k}")
    a, b = element_type(params[0]), element_type(params[1])
    kinds = _tensor_core_kinds(a, b, converted)
    declarations = [_FMA]
    results = []  # (block, D0, D1) of each path
    if kinds:
        lines.append("%full = icmp eq i32 %mask, -1")
        for index, half in enumerate(kinds):
            kind = TENSOR_CORE_TYPES[half]
            lines += _exact_test(half, static=a == half)
            following = TENSOR_CORE_TYPES[kinds[index + 1]] + ".test" if index + 1 < len(kinds) else "fma"
            lines += [f"br i1 %{kind}.use, label %{kind}.mma, label %{following}", f"{kind}.mma:"]
            lines += _tensor_core_product(half) + ["br label %done"]
            results.append((f"%{kind}.mma", f"%{kind}.D0", f"%{kind}.D1"))
            lines.append(f"{following}:")
            if a == "float":
                declarations.append(f"declare i1 @{EXACT_MARKER}.{kind}(float) nounwind willreturn memory(none)")
    lines += _fma_product()
    if kinds:
        lines += ["br label %done", "done:"]
        results.append(("%fma", "%d0.7", "%d1.7"))
        for j in (0, 1):
            incoming = ", ".join(f"[ {r[1 + j]}, {r[0]} ]" for r in results)
            lines.append(f"%d{j}.out = phi float {incoming}")
        d = ("%d0.out", "%d1.out")
    else:
        d = ("%d0.7", "%d1.7")
    out = element_type(ret)
    for j in (0, 1):
        lines.append(f"%o{j} = fptrunc float {d[j]} to {out}" if out != "float" else f"%o{j} = fadd float {d[j]}, -0.0")
    lines += [f"%v0 = insertelement {ret} poison, {out} %o0, i32 0", f"%r = insertelement {ret} %v0, {out} %o1, i32 1"]
    return _definition(ret, name, params, lines), declarations

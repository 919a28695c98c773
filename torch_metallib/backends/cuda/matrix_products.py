"""``simdgroup_matrix_8x8_multiply_accumulate`` on a warp: D = A*B + C with warp shuffles.

The meaning is air/simdgroup_matrix.py's (the CPU backend's too; its load, store and
init definitions the CUDA backend reuses): lane l holds M[r][c] and M[r][c+1] of each 8x8
matrix, r = ((l>>4)<<2)|((l>>1)&3), c = ((l>>3)&1)*4 + (l&1)*2; each element of D is C plus
the eight products of a row of A and a column of B, in k order, each step one fused
multiply-add in float; a lane that does not take part counts as zeros. Here each lane
gathers its row of A (8 values from 4 lanes) and its two columns of B (16 values from 8
lanes) with 24 shuffles and does 16 FMAs, bit for bit what the CPU computes.
"""

from typing import List, Optional, Tuple

from ...air.collectives import _definition
from ...air.intrinsics import element_type
from ...air.simdgroup_matrix import _lane_position, _to_float
from .lane_relabeling import RELABELED, physical_lane, virtual_lane
from .warp_spelling import shuffle

__all__ = ["define_matrix_product", "exact_product_lines", "PLACEHOLDER"]

_NAME = "air.simdgroup_matrix_8x8_multiply_accumulate"
_FMA = "declare float @llvm.fma.f32(float, float, float)"
# A float product's lane elements (a, b, c, whether the lanes are relabelled) -> D's: defined
# after LLVM's optimizer has run, where its operands' origins are plain (tensor_core_products.py).
PLACEHOLDER = "tm.cuda.product8x8"
PLACEHOLDER_DECLARATION = (f"declare <2 x float> @{PLACEHOLDER}(<2 x float>, <2 x float>, <2 x float>, i1) "
                           "convergent nounwind willreturn memory(inaccessiblemem: readwrite)")


def _lane_of(row: str, column: str, name: str) -> List[str]:
    """%`name` = the CUDA lane holding (row, column) and (row, column + 1), column even: the
    Metal lane ((row>>2)<<4) | ((column>>2)<<3) | ((row&3)<<1) | ((column>>1)&1), relabelled
    where %relabel (lane_relabeling.py)."""
    return [f"%{name}.r2 = lshr i32 {row}, 2", f"%{name}.r4 = shl i32 %{name}.r2, 4",
            f"%{name}.c2 = lshr i32 {column}, 2", f"%{name}.c3 = shl i32 %{name}.c2, 3",
            f"%{name}.r3 = and i32 {row}, 3", f"%{name}.r1 = shl i32 %{name}.r3, 1",
            f"%{name}.c1 = lshr i32 {column}, 1", f"%{name}.c0 = and i32 %{name}.c1, 1",
            f"%{name}.hi = or i32 %{name}.r4, %{name}.c3", f"%{name}.lo = or i32 %{name}.r1, %{name}.c0",
            f"%{name}.v = or i32 %{name}.hi, %{name}.lo"] + physical_lane(f"%{name}.v", "%relabel", name)


def _gathered(value: str, lane: str, name: str) -> List[str]:
    """%`name` = float `value` of lane `lane`, 0.0 if that lane does not take part."""
    return shuffle("float", value, lane, f"{name}.s") + [
        f"%{name}.bit = lshr i32 %mask, {lane}", f"%{name}.b = and i32 %{name}.bit, 1",
        f"%{name}.in = icmp ne i32 %{name}.b, 0", f"%{name} = select i1 %{name}.in, float %{name}.s, float 0.0"]


def exact_product_lines() -> List[str]:
    """Lines leaving %d0.7 and %d1.7: the lane's two elements of D = A*B + C from its float
    elements %fa0, %fa1, %fb0, %fb1, %fc0, %fc1, the lanes relabelled where i1 %relabel."""
    lines = ["%mask = call i32 @llvm.nvvm.activemask()", "%lane.hw = call i32 @llvm.nvvm.read.ptx.sreg.laneid()"]
    lines += virtual_lane("%lane.hw", "%relabel", "lane")
    lines += _lane_position()
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


def define_matrix_product(ret: str, name: str, params: List[str]) -> Optional[Tuple[str, List[str]]]:
    """(definition, declarations) of a multiply_accumulate, None if not one. Float products
    call PLACEHOLDER, which tensor_core_products.py defines once LLVM has optimized the kernel."""
    if not name.startswith(_NAME + ".") or len(params) != 3 or not all(t.startswith("<64 x ") for t in params + [ret]):
        return None
    lines = [f"%relabel = call i1 @{RELABELED}()"]
    for index, operand in enumerate("abc"):
        for k in (0, 1):
            lines.append(f"%f{operand}{k}.e = extractelement {params[index]} %a{index}, i32 {k}")
            lines += _to_float(element_type(params[index]), f"%f{operand}{k}.e", f"%f{operand}{k}")
    out = element_type(ret)
    if all(element_type(t) == "float" for t in params + [ret]):
        for operand in "abc":
            lines += [f"%v{operand}.0 = insertelement <2 x float> poison, float %f{operand}0, i32 0",
                      f"%v{operand} = insertelement <2 x float> %v{operand}.0, float %f{operand}1, i32 1"]
        lines += [f"%d = call <2 x float> @{PLACEHOLDER}(<2 x float> %va, <2 x float> %vb, <2 x float> %vc, "
                  "i1 %relabel)", "%d0.7 = extractelement <2 x float> %d, i32 0",
                  "%d1.7 = extractelement <2 x float> %d, i32 1"]
        declarations = [PLACEHOLDER_DECLARATION]
    else:
        lines += exact_product_lines()
        declarations = [_FMA]
    for j in (0, 1):
        lines.append(f"%o{j} = fptrunc float %d{j}.7 to {out}" if out != "float" else f"%o{j} = fadd float %d{j}.7, -0.0")
    lines += [f"%v0 = insertelement {ret} poison, {out} %o0, i32 0", f"%r = insertelement {ret} %v0, {out} %o1, i32 1"]
    return _definition(ret, name, params, lines), declarations

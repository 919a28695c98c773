"""Host definitions of AIR's ``simdgroup_matrix_8x8`` intrinsics (DESIGN.md §4.2).

A SIMD-group holds an 8x8 matrix as ``<64 x T>`` values of which only slots 0 and 1 are
the lane's: lane l holds M[r][c] and M[r][c+1] with r = ((l>>4)<<2)|((l>>1)&3) and
c = ((l>>3)&1)*4 + (l&1)*2. ``multiply_accumulate`` (D = A*B + C) exchanges the lanes'
fragments (as float, the accumulator type MLX uses) through ``tm_rt_simd_exchange``; the
first lane to read the exchange computes all of D (``@tm.simdgroup_matrix_8x8.multiply_all``,
with 8-wide vectors) into the slots, and each lane reads its two elements. Each element is
C plus the eight products of a row of A and a column of B, in k order, each step one fused
multiply-add. ``load`` / ``store`` move a lane's two elements between its fragment and
memory with ``elements_per_row`` and ``matrix_origin`` (x = column, y = row);
``transpose`` reads or writes the transposed matrix [ASSUMED: origin stays in the memory's
(column, row) coordinates].
"""

from typing import List, Optional, Tuple

from ._cpu_collectives import _definition, _exchange, _load_lane
from ._cpu_intrinsics import element_type

__all__ = ["define_matrix"]

_PREFIX = "air.simdgroup_matrix_8x8_"


def _lane_position() -> List[str]:
    """%row and %col (the first of the lane's two columns) from %lane."""
    return ["%r.hi = lshr i32 %lane, 4", "%r.hi2 = shl i32 %r.hi, 2", "%r.lo0 = lshr i32 %lane, 1",
            "%r.lo = and i32 %r.lo0, 3", "%row = or i32 %r.hi2, %r.lo",
            "%c.hi0 = lshr i32 %lane, 3", "%c.hi1 = and i32 %c.hi0, 1", "%c.hi = shl i32 %c.hi1, 2",
            "%c.lo0 = and i32 %lane, 1", "%c.lo = shl i32 %c.lo0, 1", "%col = or i32 %c.hi, %c.lo"]


def _to_float(type_name: str, value: str, out: str) -> List[str]:
    return [f"{out} = fpext {type_name} {value} to float" if type_name != "float" else f"{out} = fadd float {value}, -0.0"]


def _memory_element_lines(params: List[str], k: int) -> List[str]:
    """%p{k}: the address of the lane's element k (at row %row, column %col + k)."""
    element = "%elem"
    return [f"%cc{k} = add i32 %col, {k}",
            f"%i{k} = select i1 %a3, i32 %cc{k}, i32 %row",   # memory row
            f"%j{k} = select i1 %a3, i32 %row, i32 %cc{k}",   # memory column
            f"%i{k}.w = zext i32 %i{k} to i64", f"%j{k}.w = zext i32 %j{k} to i64",
            f"%mi{k} = add i64 %oy, %i{k}.w", f"%mj{k} = add i64 %ox, %j{k}.w",
            f"%ro{k} = mul i64 %mi{k}, %a1", f"%at{k}.i = add i64 %ro{k}, %mj{k}",
            f"%p{k} = getelementptr {element}, {params[0]} %a0, i64 %at{k}.i"]


def define_matrix(ret: str, name: str, params: List[str]) -> Optional[Tuple[str, List[str]]]:
    """(definition, declarations) of a simdgroup_matrix_8x8 intrinsic, or None."""
    if not name.startswith(_PREFIX):
        return None
    op = name[len(_PREFIX):].split(".")[0]
    if op == "init_filled" and len(params) == 1 and ret == f"<64 x {params[0]}>":
        lines = [f"%one = insertelement {ret} poison, {params[0]} %a0, i32 0",
                 f"%r = insertelement {ret} %one, {params[0]} %a0, i32 1"]
        return _definition(ret, name, params, lines), []
    if op in ("load", "store"):
        matrix = ret if op == "load" else (params[0] if params else "")
        memory = params if op == "load" else params[1:]
        if not matrix.startswith("<64 x ") or len(memory) != 4 or not memory[0].startswith("ptr") \
                or memory[1:] != ["i64", "<2 x i64>", "i1"]:
            return None
        element = element_type(matrix)
        lines = _exchange([]) + _lane_position() + [
            "%ox = extractelement <2 x i64> %a2, i32 0", "%oy = extractelement <2 x i64> %a2, i32 1"]
        for k in (0, 1):
            lines += [line.replace("%elem", element) for line in _memory_element_lines(memory, k)]
        if op == "load":
            lines += [f"%v0 = load {element}, {memory[0]} %p0", f"%v1 = load {element}, {memory[0]} %p1",
                      f"%r0 = insertelement {matrix} poison, {element} %v0, i32 0",
                      f"%r = insertelement {matrix} %r0, {element} %v1, i32 1"]
            return _definition(ret, name, params, lines), []
        lines += [f"%v0 = extractelement {matrix} %m, i32 0", f"%v1 = extractelement {matrix} %m, i32 1",
                  f"store {element} %v0, {memory[0]} %p0", f"store {element} %v1, {memory[0]} %p1"]
        # The memory operands keep load's names (%a0 pointer ... %a3 transpose).
        return _definition("void", name, params, lines, ["%m", "%a0", "%a1", "%a2", "%a3"]), []
    if op == "multiply_accumulate" and len(params) == 3 and all(p.startswith("<64 x ") for p in params + [ret]):
        lines: List[str] = []
        values = []
        for operand, type_name in zip("abc", params):
            element = element_type(type_name)
            for k in (0, 1):
                lines += [f"%f{operand}{k}.e = extractelement {type_name} %a{'abc'.index(operand)}, i32 {k}"]
                lines += _to_float(element, f"%f{operand}{k}.e", f"%f{operand}{k}")
                values.append(("float", f"%f{operand}{k}"))
        lines += _exchange(values)  # slot bytes: a0 a1 b0 b1 c0 c1, 4 each
        lines += ["br i1 %leads, label %compute, label %read", "compute:",
                  f"call void @{_MULTIPLY_ALL}(ptr %slots)", "br label %read", "read:"]
        out = element_type(ret)
        for k in (0, 1):
            lines += _load_lane("float", "%lane", f"d{k}", _D_OFFSET + 4 * k)
            lines.append(f"%o{k} = fptrunc float %d{k} to {out}" if out != "float" else f"%o{k} = fadd float %d{k}, -0.0")
        lines += [f"%r0 = insertelement {ret} poison, {out} %o0, i32 0",
                  f"%r = insertelement {ret} %r0, {out} %o1, i32 1"]
        return _definition(ret, name, params, lines), [
            _multiply_all(), "declare <8 x float> @llvm.fma.v8f32(<8 x float>, <8 x float>, <8 x float>)"]
    return None


_MULTIPLY_ALL = "tm.simdgroup_matrix_8x8.multiply_all"
_D_OFFSET = 24  # in each lane's slot, after its a0 a1 b0 b1 c0 c1


# (row, column) -> (lane, slot) holding M[row][column]: the layout in the docstring, inverted.
_HOLDERS = {(((lane >> 4) << 2) | ((lane >> 1) & 3), ((lane >> 3) & 1) * 4 + (lane & 1) * 2 + slot): (lane, slot)
            for lane in range(32) for slot in (0, 1)}


def _multiply_all() -> str:
    """``void @tm.simdgroup_matrix_8x8.multiply_all(ptr slots)``: D = A*B + C from the 32
    lanes' deposited fragments, written into each lane's slot at _D_OFFSET. Rows of B, C
    and D are <8 x float>; D[r] = fma(A[r][7], B[7], ... fma(A[r][0], B[0], C[r])), the
    same operations, in the same order, as one lane computing its elements."""
    lines: List[str] = []

    def element(name: str, row: int, column: int, base: int) -> str:
        lane, slot = _HOLDERS[row, column]
        lines.extend([f"%{name}.p = getelementptr i8, ptr %slots, i32 {lane * 64 + base + 4 * slot}",
                      f"%{name} = load float, ptr %{name}.p"])
        return f"%{name}"

    def row_vector(matrix: str, row: int, base: int) -> str:
        previous = "poison"
        for column in range(8):
            value = element(f"{matrix}{row}.{column}", row, column, base)
            lines.append(f"%{matrix}{row}.v{column} = insertelement <8 x float> {previous}, float {value}, i32 {column}")
            previous = f"%{matrix}{row}.v{column}"
        return previous

    rows_b = [row_vector("B", t, 8) for t in range(8)]
    for r in range(8):
        acc = row_vector("C", r, 16)
        for t in range(8):
            a = element(f"A{r}.{t}", r, t, 0)
            lines += [f"%A{r}.{t}.i = insertelement <8 x float> poison, float {a}, i32 0",
                      f"%A{r}.{t}.s = shufflevector <8 x float> %A{r}.{t}.i, <8 x float> poison, <8 x i32> zeroinitializer",
                      f"%D{r}.{t} = call <8 x float> @llvm.fma.v8f32(<8 x float> %A{r}.{t}.s, <8 x float> {rows_b[t]}, <8 x float> {acc})"]
            acc = f"%D{r}.{t}"
        for column in range(8):
            lane, slot = _HOLDERS[r, column]
            lines += [f"%D{r}.e{column} = extractelement <8 x float> {acc}, i32 {column}",
                      f"%D{r}.p{column} = getelementptr i8, ptr %slots, i32 {lane * 64 + _D_OFFSET + 4 * slot}",
                      f"store float %D{r}.e{column}, ptr %D{r}.p{column}"]
    body = "\n  ".join(lines + ["ret void"])
    return f"define internal void @{_MULTIPLY_ALL}(ptr %slots) noinline {{\n  {body}\n}}"

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

import re
from typing import List, Optional, Tuple

from ._cpu_collectives import MASK_OFFSET, SLOT_BYTES, _definition, _exchange
from ._cpu_intrinsics import SIMD_WIDTH, element_type
from ._cpu_matrix_batches import BATCH_PREFIX

__all__ = ["define_matrix", "define_product_batch"]

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
        return _definition(ret, name, params, _products(params, [ret], [None])), [_multiply_batch(), _FMA]
    return None


def define_product_batch(ret: str, name: str, params: List[str]) -> Optional[Tuple[str, List[str]]]:
    """(definition, declarations) of ``tm.simdgroup_matrix_8x8.multiply_accumulate_batch.
    <sources>.<overload>`` (_cpu_matrix_batches): N products at once, returned as a struct;
    `sources` says, per product, ``c`` (its C operand) or which earlier product's D is its
    C. None if malformed."""
    if not name.startswith(BATCH_PREFIX + "."):
        return None
    results = re.findall(r"<64 x \w+>", ret)
    words = name[len(BATCH_PREFIX) + 1:].split(".")[0].split("_")
    sources = [None if word == "c" else int(word) for word in words if word == "c" or word.isdigit()]
    if not results or len(sources) != len(words) or len(words) != len(results) \
            or any(j is not None and j >= m for m, j in enumerate(sources)) \
            or len(params) != 3 * len(results) or not all(p.startswith("<64 x ") for p in params):
        return None
    return _definition(ret, name, params, _products(params, results, sources)), [_multiply_batch(), _FMA]


def _products(params: List[str], results: List[str], sources: List[Optional[int]]) -> List[str]:
    """Lines leaving %r: D = A*B + C for each (A, B, C) of `params` in turn (a struct of
    them if more than one), C being product j's D where sources[m] = j. The lane writes its
    fragments, as float, to %frags (a record of _RECORD_BYTES per product: a0 a1 b0 b1 c0 c1
    d0 d1) and deposits the record's address; the first lane to read the exchange computes
    every product of every lane (@tm.simdgroup_matrix_8x8.multiply_batch) into the records'
    d0 d1, in order."""
    count = len(results)
    lines = [f"%frags = alloca [{count * _RECORD_BYTES} x i8], align 16", f"%sources = alloca [{count} x i32], align 4"]
    for m in range(count):
        for index, operand in enumerate("abc" if sources[m] is None else "ab"):
            type_name = params[3 * m + index]
            for k in (0, 1):
                value = f"%f{m}{operand}{k}"
                lines += [f"{value}.e = extractelement {type_name} %a{3 * m + index}, i32 {k}"]
                lines += _to_float(element_type(type_name), f"{value}.e", value)
                lines += [f"{value}.p = getelementptr i8, ptr %frags, i32 {m * _RECORD_BYTES + 8 * index + 4 * k}",
                          f"store float {value}, ptr {value}.p"]
    lines += _exchange([("ptr", "%frags")])
    lines += ["br i1 %leads, label %compute, label %read", "compute:"]
    for m, j in enumerate(sources):  # where in a lane's records product m finds its C
        offset = m * _RECORD_BYTES + _C_OFFSET if j is None else j * _RECORD_BYTES + _D_OFFSET
        lines += [f"%source{m} = getelementptr i32, ptr %sources, i32 {m}", f"store i32 {offset}, ptr %source{m}"]
    lines += [f"call void @{_MULTIPLY_BATCH}(ptr %slots, i32 {count}, ptr %sources)", "br label %read", "read:"]
    for m, ret in enumerate(results):
        out = element_type(ret)
        for k in (0, 1):
            value = f"%d{m}.{k}"
            lines += [f"{value}.p = getelementptr i8, ptr %frags, i32 {m * _RECORD_BYTES + _D_OFFSET + 4 * k}",
                      f"{value} = load float, ptr {value}.p",
                      f"%o{m}.{k} = fptrunc float {value} to {out}" if out != "float" else f"%o{m}.{k} = fadd float {value}, -0.0"]
        lines += [f"%v{m}.0 = insertelement {ret} poison, {out} %o{m}.0, i32 0",
                  f"%v{m} = insertelement {ret} %v{m}.0, {out} %o{m}.1, i32 1"]
    if count == 1:
        return lines + [f"%r = bitcast {results[0]} %v0 to {results[0]}"]
    struct = "{ " + ", ".join(results) + " }"
    previous = "poison"
    for m in range(count):
        made = "%r" if m == count - 1 else f"%s{m}"
        lines.append(f"{made} = insertvalue {struct} {previous}, {results[m]} %v{m}, {m}")
        previous = made
    return lines


_MULTIPLY_BATCH = "tm.simdgroup_matrix_8x8.multiply_batch"
_FMA = "declare <8 x float> @llvm.fma.v8f32(<8 x float>, <8 x float>, <8 x float>)"
_RECORD_BYTES = 32
_C_OFFSET = 16  # in a product's record: a0 a1 b0 b1 c0 c1 d0 d1
_D_OFFSET = 24


# (row, column) -> (lane, slot) holding M[row][column]: the layout in the docstring, inverted.
_HOLDERS = {(((lane >> 4) << 2) | ((lane >> 1) & 3), ((lane >> 3) & 1) * 4 + (lane & 1) * 2 + slot): (lane, slot)
            for lane in range(32) for slot in (0, 1)}


def _multiply_batch() -> str:
    """``void @tm.simdgroup_matrix_8x8.multiply_batch(ptr slots, i32 count, ptr sources)``:
    for each of `count` products m in order, D = A*B + C from the records the 32 lanes
    deposited, C at byte sources[m] of the lane's records (a lane that did not take part
    reads zeros), written into each lane's record at _D_OFFSET. Rows of B, C
    and D are <8 x float>; D[r] = fma(A[r][7], B[7], ... fma(A[r][0], B[0], C[r])), the
    same operations, in the same order, as one lane computing its elements."""
    lines = [f"%mask.p = getelementptr i8, ptr %slots, i32 {MASK_OFFSET}", "%mask = load i32, ptr %mask.p",
             "%scratch = alloca [32 x i8], align 16", "store <8 x float> zeroinitializer, ptr %scratch, align 16"]
    for lane in range(SIMD_WIDTH):
        lines += [f"%bit{lane} = and i32 %mask, {1 << lane}", f"%on{lane} = icmp ne i32 %bit{lane}, 0",
                  f"%slot{lane} = getelementptr i8, ptr %slots, i32 {lane * SLOT_BYTES}",
                  f"%record{lane} = load ptr, ptr %slot{lane}",
                  f"%base{lane} = select i1 %on{lane}, ptr %record{lane}, ptr %scratch",
                  f"%step{lane} = select i1 %on{lane}, i64 {_RECORD_BYTES}, i64 0"]
    lines += ["br label %product", "product:", "%m = phi i32 [ 0, %entry ], [ %m.next, %product ]",
              "%m.wide = zext i32 %m to i64", "%c.at = getelementptr i32, ptr %sources, i64 %m.wide",
              "%c.off32 = load i32, ptr %c.at", "%c.off = zext i32 %c.off32 to i64"]
    for lane in range(SIMD_WIDTH):
        lines += [f"%at{lane} = mul i64 %m.wide, %step{lane}",
                  f"%p{lane} = getelementptr i8, ptr %base{lane}, i64 %at{lane}",
                  f"%coff{lane} = select i1 %on{lane}, i64 %c.off, i64 {_C_OFFSET}",
                  f"%c{lane} = getelementptr i8, ptr %base{lane}, i64 %coff{lane}"]

    def pair(name: str, row: int, column: int, offset: int, records: str) -> str:
        """<2 x float> M[row][column], M[row][column + 1]: one lane's two elements, at
        `offset` from its `records` pointer (%p: this product's record, %c: its C)."""
        lane, _ = _HOLDERS[row, column]
        lines.extend([f"%{name}.p = getelementptr i8, ptr {records}{lane}, i32 {offset}",
                       f"%{name} = load <2 x float>, ptr %{name}.p, align 4"])
        return f"%{name}"

    def row_vector(matrix: str, row: int, offset: int, records: str = "%p") -> str:
        pairs = [pair(f"{matrix}{row}.{column}", row, column, offset, records) for column in range(0, 8, 2)]
        lines.extend([f"%{matrix}{row}.lo = shufflevector <2 x float> {pairs[0]}, <2 x float> {pairs[1]}, <4 x i32> <i32 0, i32 1, i32 2, i32 3>",
                      f"%{matrix}{row}.hi = shufflevector <2 x float> {pairs[2]}, <2 x float> {pairs[3]}, <4 x i32> <i32 0, i32 1, i32 2, i32 3>",
                      f"%{matrix}{row} = shufflevector <4 x float> %{matrix}{row}.lo, <4 x float> %{matrix}{row}.hi, <8 x i32> <i32 0, i32 1, i32 2, i32 3, i32 4, i32 5, i32 6, i32 7>"])
        return f"%{matrix}{row}"

    rows_b = [row_vector("B", t, 8) for t in range(8)]
    for r in range(8):
        acc = row_vector("C", r, 0, "%c")
        for t in range(8):
            lane, slot = _HOLDERS[r, t]
            lines += [f"%A{r}.{t}.p = getelementptr i8, ptr %p{lane}, i32 {4 * slot}",
                      f"%A{r}.{t} = load float, ptr %A{r}.{t}.p",
                      f"%A{r}.{t}.i = insertelement <8 x float> poison, float %A{r}.{t}, i32 0",
                      f"%A{r}.{t}.s = shufflevector <8 x float> %A{r}.{t}.i, <8 x float> poison, <8 x i32> zeroinitializer",
                      f"%D{r}.{t} = call <8 x float> @llvm.fma.v8f32(<8 x float> %A{r}.{t}.s, <8 x float> {rows_b[t]}, <8 x float> {acc})"]
            acc = f"%D{r}.{t}"
        for column in range(0, 8, 2):
            lane, _ = _HOLDERS[r, column]
            lines += [f"%D{r}.e{column} = shufflevector <8 x float> {acc}, <8 x float> poison, <2 x i32> <i32 {column}, i32 {column + 1}>",
                      f"%D{r}.p{column} = getelementptr i8, ptr %p{lane}, i32 {_D_OFFSET}",
                      f"store <2 x float> %D{r}.e{column}, ptr %D{r}.p{column}, align 4"]
    lines += ["%m.next = add i32 %m, 1", "%more = icmp ult i32 %m.next, %count",
              "br i1 %more, label %product, label %done", "done:", "ret void"]
    body = "\n  ".join(lines)
    return f"define internal void @{_MULTIPLY_BATCH}(ptr %slots, i32 %count, ptr %sources) noinline {{\nentry:\n  {body}\n}}"

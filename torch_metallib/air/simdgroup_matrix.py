"""Host definitions of AIR's ``simdgroup_matrix_8x8`` intrinsics (docs/formats.md, AIR).

A SIMD-group holds an 8x8 matrix as ``<64 x T>`` values of which only slots 0 and 1 are
the lane's: lane l holds M[r][c] and M[r][c+1] with r = ((l>>4)<<2)|((l>>1)&3) and
c = ((l>>3)&1)*4 + (l&1)*2. ``multiply_accumulate`` (D = A*B + C), alone or in a batch
(``tm.simdgroup_matrix_8x8.multiply_accumulate_batch``, _cpu_matrix_batches), is one
exchange: each lane writes its elements (as float, the accumulator type MLX uses) into
row-major matrices in memory the runtime hands its SIMD-group (``tm_rt_simd_stage``; in
lane loops, its staging area in the threadgroup's context, regions.py), the
first lane to read the completed exchange computes every D with 16-wide vectors
(``@tm.simdgroup_matrix_8x8.multiply_batch.<places>``), and each lane reads its two
elements. Each element is C plus the eight products of a row of A and a column of B, in k order, each step
one fused multiply-add. Lanes that do not exist (a SIMD-group cut short by the grid) count
as zeros; Metal leaves that undefined. ``load`` / ``store`` move a lane's two elements
between its fragment and memory with ``elements_per_row`` and ``matrix_origin`` (x =
column, y = row); ``transpose`` reads or writes the transposed matrix [ASSUMED: origin
stays in the memory's (column, row) coordinates].
"""

import functools
import re
from typing import Dict, List, Optional, Tuple

from .collectives import MASK_OFFSET, WAIT_ALLOCA, _definition, _exchange, _staged_exchange, simd_position
from .target import Target
from .intrinsics import SIMD_WIDTH, element_type, is_float_type
from ..reflection.ir_model import substitute

__all__ = ["define_matrix", "define_product_batch", "define_kept_accumulator", "BATCH_PREFIX", "KEEP_PREFIX"]

# Products that backends/cpu/matrix_batches.py gathers into one exchange, as one call of
# ``<BATCH_PREFIX>.<sources>.<overload>`` (define_product_batch).
BATCH_PREFIX = "tm.simdgroup_matrix_8x8.multiply_accumulate_batch"
# A float accumulator that a loop's batch keeps in memory between its runs (lane loops only):
# ``<KEEP_PREFIX>.<area>.<slot>.<slots>(value)`` writes the lane's elements of the loop's
# first C there (define_kept_accumulator); the batch's product word ``k<j>`` reads C there and
# leaves product j's D there for the next run, in area ``kept<area>`` of its name.
KEEP_PREFIX = "tm.simdgroup_matrix_8x8.keep"

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


def define_matrix(ret: str, name: str, params: List[str], target: Target) -> Optional[Tuple[str, List[str]]]:
    """(definition, declarations) of a simdgroup_matrix_8x8 intrinsic, or None."""
    if not name.startswith(_PREFIX):
        return None
    op = name[len(_PREFIX):].split(".")[0]
    if op == "init_filled" and len(params) == 1 and ret == f"<64 x {params[0]}>":
        lines = [f"%one = insertelement {ret} poison, {params[0]} %a0, i32 0",
                 f"%r = insertelement {ret} %one, {params[0]} %a0, i32 1"]
        return _definition(ret, name, params, lines), []
    if op == "init_diag" and len(params) == 1 and ret == f"<64 x {params[0]}>":
        # The diagonal holds the value, every other element zero: the lane's two elements
        # are at (row, col) and (row, col + 1).
        element = params[0]
        zero = "0.0" if is_float_type(element) else "0"
        lines = _exchange([], target) + _lane_position() + [
            "%on0 = icmp eq i32 %row, %col", "%col1 = add i32 %col, 1", "%on1 = icmp eq i32 %row, %col1",
            f"%e0 = select i1 %on0, {element} %a0, {element} {zero}", f"%e1 = select i1 %on1, {element} %a0, {element} {zero}",
            f"%one = insertelement {ret} poison, {element} %e0, i32 0",
            f"%r = insertelement {ret} %one, {element} %e1, i32 1"]
        return _definition(ret, name, params, lines), []
    if op in ("load", "store"):
        matrix = ret if op == "load" else (params[0] if params else "")
        memory = params if op == "load" else params[1:]
        if not matrix.startswith("<64 x ") or len(memory) != 4 or not memory[0].startswith("ptr"):
            return None
        if memory[1:] == ["<2 x i64>"] * 3:
            return _define_strided(op, ret, name, params, matrix, memory[0], target), []
        if memory[1:] != ["i64", "<2 x i64>", "i1"]:
            return None
        element = element_type(matrix)
        lines = _exchange([], target) + _lane_position() + [
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
        lines, multiply = _products(params, [ret], [None], target)
        return _definition(ret, name, params, lines), [multiply, _FMA]
    return None


def _define_strided(op: str, ret: str, name: str, params: List[str], matrix: str, pointer: str, target: Target) -> str:
    """The form Xcode 26's compiler emits for ``simdgroup_load`` / ``simdgroup_store``:
    (pointer, extents, strides, origin), each ``<2 x i64>`` over the memory's two dimensions.
    Element (row r, column c) of the matrix is dimension 0's index origin[0] + c and
    dimension 1's origin[1] + r, at pointer[index0 * strides[0] + index1 * strides[1]]: a
    row-major load is strides (1, elements_per_row), a transposed one (elements_per_row, 1).
    An element whose index is not below its dimension's extent is read as zero and not
    written [ASSUMED: Apple's compiler gives extents that cover the 8x8 window, so only
    hand-written AIR reaches this]."""
    element = element_type(matrix)
    zero = "0.0" if is_float_type(element) else "0"
    lines = _exchange([], target) + _lane_position() + ["%row.w = zext i32 %row to i64"]
    for operand, label in ((1, "e"), (2, "s"), (3, "o")):
        lines += [f"%{label}{d} = extractelement <2 x i64> %a{operand}, i32 {d}" for d in (0, 1)]
    lines += ["%i1 = add i64 %o1, %row.w", "%row.in = icmp ult i64 %i1, %e1", "%row.at = mul i64 %i1, %s1"]
    for k in (0, 1):
        lines += [f"%c{k} = add i32 %col, {k}", f"%c{k}.w = zext i32 %c{k} to i64",
                  f"%i0.{k} = add i64 %o0, %c{k}.w", f"%in0.{k} = icmp ult i64 %i0.{k}, %e0",
                  f"%in{k} = and i1 %in0.{k}, %row.in",
                  f"%at0.{k} = mul i64 %i0.{k}, %s0", f"%at{k}.raw = add i64 %at0.{k}, %row.at",
                  # Outside the extents nothing is touched: the base element stands in.
                  f"%at{k} = select i1 %in{k}, i64 %at{k}.raw, i64 0",
                  f"%p{k} = getelementptr {element}, {pointer} %a0, i64 %at{k}"]
    if op == "load":
        for k in (0, 1):
            lines += [f"%v{k}.m = load {element}, {pointer} %p{k}",
                      f"%v{k} = select i1 %in{k}, {element} %v{k}.m, {element} {zero}"]
        lines += [f"%r0 = insertelement {matrix} poison, {element} %v0, i32 0",
                  f"%r = insertelement {matrix} %r0, {element} %v1, i32 1"]
        return _definition(ret, name, params, lines)
    for k in (0, 1):
        lines += [f"%v{k} = extractelement {matrix} %m, i32 {k}", f"br i1 %in{k}, label %put{k}, label %next{k}",
                  f"put{k}:", f"store {element} %v{k}, {pointer} %p{k}", f"br label %next{k}", f"next{k}:"]
    return _definition("void", name, params, lines, ["%m", "%a0", "%a1", "%a2", "%a3"])


def define_product_batch(ret: str, name: str, params: List[str], target: Target) -> Optional[Tuple[str, List[str]]]:
    """(definition, declarations) of ``tm.simdgroup_matrix_8x8.multiply_accumulate_batch.
    <sources>.<overload>`` (_cpu_matrix_batches): N products at once, returned as a struct;
    `sources` says, per product, ``c`` (its C operand) or which earlier product's D is its
    C, then ``a<k>`` / ``b<k>`` where its A / B is factor k (3 * product + 0 or 1) of an
    earlier product, staged there. None if malformed."""
    if not name.startswith(BATCH_PREFIX + "."):
        return None
    results = re.findall(r"<64 x \w+>", ret)
    parts = name[len(BATCH_PREFIX) + 1:].split(".")
    words = [_WORD.fullmatch(word) for word in parts[0].split("_")]
    area = int(parts[1][4:]) if len(parts) > 1 and re.fullmatch(r"kept\d+", parts[1]) else None
    if not results or not all(words) or len(words) != len(results) \
            or len(params) != 3 * len(results) or not all(p.startswith("<64 x ") for p in params):
        return None
    sources = [None if word.group(1)[0] in "ck" else int(word.group(1)) for word in words]
    # Kept accumulators: product m -> the product j whose D is m's C in the next run.
    kept = {m: int(word.group(1)[1:]) for m, word in enumerate(words) if word.group(1)[0] == "k"}
    # Where each product's A and B are staged: its own factor unless it names an earlier one.
    factors = [[int(word.group(2 + i)) if word.group(2 + i) else 3 * m + i for i in (0, 1)]
               for m, word in enumerate(words)]
    if any(j is not None and j >= m for m, j in enumerate(sources)) or any(
            k != 3 * m + i and (k >= 3 * m + i or k % 3 == 2 or factors[k // 3][k % 3] != k)  # B may be its own A
            for m, pair in enumerate(factors) for i, k in enumerate(pair)):
        return None
    if kept and (area is None or any(r != "<64 x float>" for r in results)
                 or any(j >= len(results) or _chain_start(sources, j) != m for m, j in kept.items())):
        return None  # a kept D goes back unrounded: float accumulators only
    lines, multiply = _products(params, results, sources, target, factors, kept, area)
    return _definition(ret, name, params, lines), [multiply, _FMA]


_WORD = re.compile(r"(c|k\d+|\d+)(?:a(\d+))?(?:b(\d+))?")


def _chain_start(sources: List[Optional[int]], j: int) -> int:
    """The product whose own C starts the chain of accumulations that ends in product j."""
    while j < len(sources) and sources[j] is not None:
        j = sources[j]
    return j


def define_kept_accumulator(ret: str, name: str, params: List[str], target: Target) -> Optional[Tuple[str, List[str]]]:
    """(definition, declarations) of ``<KEEP_PREFIX>.<area>.<slot>.<slots>(<2 x float> or <64 x
    float>)``: the lane's two elements written into slot `slot` (a row-major 8x8 float
    matrix) of the SIMD-group's kept area `area` of `slots` matrices. None if malformed."""
    match = re.fullmatch(re.escape(KEEP_PREFIX) + r"\.(\d+)\.(\d+)\.(\d+)", name)
    if not match or ret != "void" or params not in (["<2 x float>"], ["<64 x float>"]):
        return None
    area, slot, slots = (int(g) for g in match.groups())
    pair = ["%v.e = shufflevector <64 x float> %a0, <64 x float> poison, <2 x i32> <i32 0, i32 1>"] \
        if params[0] == "<64 x float>" else ["%v.e = bitcast <2 x float> %a0 to <2 x float>"]
    pair += ["%v = fadd <2 x float> %v.e, <float -0.0, float -0.0>"]  # as a staged C is (_to_float)
    lines = (target.kept_matrices(area, slots * _MATRIX_BYTES) + simd_position("urem", "%lane") + _element_offset("")
             + pair + [f"%o = add i32 %at, {slot * _MATRIX_BYTES}", "%p = getelementptr i8, ptr %kept, i32 %o",
                       "store <2 x float> %v, ptr %p, align 4"])
    return _definition("void", name, params, lines), []


def _products(params: List[str], results: List[str], sources: List[Optional[int]], target: Target,
              factors: Optional[List[List[int]]] = None, kept: Optional[Dict[int, int]] = None,
              area: Optional[int] = None) -> Tuple[List[str], str]:
    """(lines leaving %r, the definition of the multiply_batch they call): D = A*B + C for
    each (A, B, C) of `params` in turn (a struct of them if more than one), C being product
    j's D where sources[m] = j, A and B staged as factors[m] (3 * product + 0 or 1: its
    own, or an earlier product's). Each lane writes its element pairs, as float, into the
    SIMD-group's staging memory (tm_rt_simd_stage): per product, A, B and C as row-major
    8x8 matrices (the A and B only where its own); the first lane to read the completed
    exchange computes every product (_multiply_batch), each D in place of its C, and every
    lane reads its pair of each D. A kept product m (`kept`: m -> j) stages no C: it is in
    slot (m's rank in `kept`) of the SIMD-group's kept area `area` (Target.kept_matrices),
    where the multiply leaves product j's D for the next run."""
    count = len(results)
    kept = kept or {}
    factors = factors or [[3 * m, 3 * m + 1] for m in range(count)]
    slot = {m: i for i, m in enumerate(sorted(kept))}
    fill = _element_offset("")
    for m in range(count):
        for index, operand in enumerate("abc" if sources[m] is None and m not in kept else "ab"):
            if index < 2 and factors[m][index] != 3 * m + index:
                continue  # staged as an earlier product's factor
            type_name = params[3 * m + index]
            value = f"%f{m}{operand}"
            for k in (0, 1):
                fill += [f"{value}{k}.e = extractelement {type_name} %a{3 * m + index}, i32 {k}"]
                fill += _to_float(element_type(type_name), f"{value}{k}.e", f"{value}{k}")
            fill += [f"{value}.v0 = insertelement <2 x float> poison, float {value}0, i32 0",
                      f"{value}.v = insertelement <2 x float> {value}.v0, float {value}1, i32 1",
                      f"{value}.o = add i32 %at, {m * _PRODUCT_BYTES + index * _MATRIX_BYTES}",
                      f"{value}.p = getelementptr i8, ptr %staged, i32 {value}.o",
                      f"store <2 x float> {value}.v, ptr {value}.p, align 4"]
    # Where each product's A, B and C are staged (C: its own, or an earlier product's D).
    places = tuple(tuple(_factor_at(k) for k in factors[m]) + (
        _KEPT + slot[m] * _MATRIX_BYTES if m in kept else (m if j is None else j) * _PRODUCT_BYTES + 2 * _MATRIX_BYTES,)
                   for m, j in enumerate(sources))
    keeps = tuple((j * _PRODUCT_BYTES + 2 * _MATRIX_BYTES, slot[m] * _MATRIX_BYTES) for m, j in sorted(kept.items()))
    multiply, multiply_name = _multiply_batch(places, keeps)
    lines = [WAIT_ALLOCA] + _staged_exchange(str(count * _PRODUCT_BYTES), fill, target)
    lines += ["br i1 %leads, label %compute, label %read", "compute:"]
    if kept:
        lines += target.kept_matrices(area, len(kept) * _MATRIX_BYTES)
    lines += [f"call void @{multiply_name}(ptr %staged, ptr %slots{', ptr %kept' if kept else ''})",
              "br label %read", "read:"]
    lines += _element_offset(".read")
    for m, ret in enumerate(results):
        out = element_type(ret)
        lines += [f"%d{m}.o = add i32 %at.read, {m * _PRODUCT_BYTES + 2 * _MATRIX_BYTES}",
                  f"%d{m}.p = getelementptr i8, ptr %staged, i32 %d{m}.o",
                  f"%d{m} = load <2 x float>, ptr %d{m}.p, align 4"]
        for k in (0, 1):
            lines += [f"%d{m}.{k} = extractelement <2 x float> %d{m}, i32 {k}",
                      f"%o{m}.{k} = fptrunc float %d{m}.{k} to {out}" if out != "float" else f"%o{m}.{k} = fadd float %d{m}.{k}, -0.0"]
        lines += [f"%v{m}.0 = insertelement {ret} poison, {out} %o{m}.0, i32 0",
                  f"%v{m} = insertelement {ret} %v{m}.0, {out} %o{m}.1, i32 1"]
    if count == 1:
        return lines + [f"%r = bitcast {results[0]} %v0 to {results[0]}"], multiply
    struct = "{ " + ", ".join(results) + " }"
    previous = "poison"
    for m in range(count):
        made = "%r" if m == count - 1 else f"%s{m}"
        lines.append(f"{made} = insertvalue {struct} {previous}, {results[m]} %v{m}, {m}")
        previous = made
    return lines, multiply


def _element_offset(suffix: str) -> List[str]:
    """%at<suffix>: the byte offset of the lane's first element in a staged row-major 8x8
    float matrix, from %lane. Computed again after the exchange (suffix ".read"): where the
    exchange cuts a lane loop, the lane's %lane is new there and %at would otherwise be kept
    per thread across the wait."""
    names = ["%r.hi", "%r.hi2", "%r.lo0", "%r.lo", "%row", "%c.hi0", "%c.hi1", "%c.hi", "%c.lo0", "%c.lo", "%col"]
    position = [substitute(line, {name: name + suffix for name in names}) for line in _lane_position()]
    return position + [f"%row8{suffix} = mul i32 %row{suffix}, 8", f"%elem{suffix} = add i32 %row8{suffix}, %col{suffix}",
                       f"%at{suffix} = mul i32 %elem{suffix}, 4"]


def _factor_at(k: int) -> int:
    """The byte offset in the staging memory of factor k (3 * product + 0 for A, 1 for B)."""
    return k // 3 * _PRODUCT_BYTES + k % 3 * _MATRIX_BYTES


_MULTIPLY_BATCH = "tm.simdgroup_matrix_8x8.multiply_batch"
_FMA = "declare <16 x float> @llvm.fma.v16f32(<16 x float>, <16 x float>, <16 x float>)"
_MATRIX_BYTES = 8 * 8 * 4
_PRODUCT_BYTES = 3 * _MATRIX_BYTES  # A, B, then C (D once computed)
_KEPT = 1 << 20  # places at or past this are in the kept area (at the place minus this), not staged


def _address(place: int) -> Tuple[str, int]:
    """(base pointer, byte offset) of a place of _multiply_batch."""
    return ("%kept", place - _KEPT) if place >= _KEPT else ("%staged", place)

# lane -> (row, column) of the first of the two elements it holds (the docstring's layout).
_POSITIONS = {lane: (((lane >> 4) << 2) | ((lane >> 1) & 3), ((lane >> 3) & 1) * 4 + (lane & 1) * 2)
              for lane in range(SIMD_WIDTH)}


@functools.lru_cache(maxsize=None)  # the same text for every batch of the same products
def _multiply_batch(places: Tuple[Tuple[int, int, int], ...],
                    keeps: Tuple[Tuple[int, int], ...] = ()) -> Tuple[str, str]:
    """(definition, name) of ``void @tm.simdgroup_matrix_8x8.multiply_batch.<places>(ptr
    staged, ptr slots)``: for each product m in order, D = A*B + C from the staged matrices at
    byte offsets places[m] (C: product m's own third matrix or an earlier product's D), D
    into product m's third matrix. Straight-line code: LLVM interleaves the FMA chains of
    products that need none of each other's results. Lanes that did not take part (not in
    the exchange's mask) count as zeros. Each 16-wide FMA takes two rows of a product
    (_multiply) or a row of two products of one A (_multiply_pair); D[r] = fma(A[r][7], B[7],
    ... fma(A[r][0], B[0], C[r])), the same operations, in the same order, as one lane
    computing its elements. A C place at or past _KEPT is in the kept area (ptr kept); then
    `keeps` lists (staged D, kept offset) pairs copied there once every D is computed. The
    kept elements of lanes that did not take part are not cleared: an element of C reaches
    only the same element of D, which only its own lane reads."""
    lines = ["%ignored = alloca <2 x float>, align 8",
             f"%mask.p = getelementptr i8, ptr %slots, i32 {MASK_OFFSET}", "%mask = load i32, ptr %mask.p",
             "%all = icmp eq i32 %mask, -1", "br i1 %all, label %product, label %clear",
             # Zeros where absent lanes' elements go: stores to %ignored for the lanes present.
             "clear:", "%k = phi i32 [ 0, %entry ], [ %k.next, %clear ]", "%k.wide = zext i32 %k to i64",
             f"%k.at = mul i64 %k.wide, {_PRODUCT_BYTES}", "%k.p = getelementptr i8, ptr %staged, i64 %k.at"]
    for lane, (row, column) in _POSITIONS.items():
        lines += [f"%bit{lane} = and i32 %mask, {1 << lane}", f"%absent{lane} = icmp eq i32 %bit{lane}, 0"]
        for matrix in range(3):
            at = f"%z{lane}.{matrix}"
            lines += [f"{at}.p = getelementptr i8, ptr %k.p, i32 {matrix * _MATRIX_BYTES + (row * 8 + column) * 4}",
                      f"{at} = select i1 %absent{lane}, ptr {at}.p, ptr %ignored",
                      f"store <2 x float> zeroinitializer, ptr {at}, align 4"]
    count = len(places)
    lines += ["%k.next = add i32 %k, 1", f"%k.more = icmp ult i32 %k.next, {count}",
              "br i1 %k.more, label %clear, label %product", "product:"]
    m = 0
    while m < count:
        (a, b, c), d = places[m], m * _PRODUCT_BYTES + 2 * _MATRIX_BYTES
        # The next product with the same A and not this one's D as its C goes with it.
        if m + 1 < count and places[m + 1][0] == a and places[m + 1][2] != d:
            lines += _multiply_pair(f"p{m}.", a, (b, places[m + 1][1]), (c, places[m + 1][2]), (d, d + _PRODUCT_BYTES))
            m += 2
        else:
            lines += _multiply(f"p{m}.", a, b, c, d)
            m += 1
    for d, at in keeps:
        for part in range(4):
            value = f"%keep{at}.{part}"
            lines += [f"{value}.s = getelementptr i8, ptr %staged, i32 {d + part * 64}",
                      f"{value} = load <16 x float>, ptr {value}.s, align 4",
                      f"{value}.k = getelementptr i8, ptr %kept, i32 {at + part * 64}",
                      f"store <16 x float> {value}, ptr {value}.k, align 4"]
    lines += ["ret void"]
    name = f"{_MULTIPLY_BATCH}." + "_".join(".".join(str(at // _MATRIX_BYTES) for at in place) for place in places)
    name += "".join(f".k{d // _MATRIX_BYTES}.{at // _MATRIX_BYTES}" for d, at in keeps)
    parameters = "ptr %staged, ptr %slots" + (", ptr %kept" if keeps else "")
    body = "\n  ".join(lines)
    return f"define internal void @{name}({parameters}) noinline {{\nentry:\n  {body}\n}}", name


def _multiply_pair(p: str, a: int, bs: Tuple[int, int], cs: Tuple[int, int], ds: Tuple[int, int]) -> List[str]:
    """Lines computing two products of one A at once, as _multiply: a row of both D is one
    <16 x float> (B rows and C rows of the two side by side), A[r][t] broadcast to it."""
    lines = []

    def side_by_side(name: str, offsets: Tuple[int, int], row: int) -> List[str]:
        halves = [f"%{p}{name}{row}.{i}" for i in (0, 1)]
        return [line for i, (base, at) in enumerate(map(_address, offsets))
                for line in (f"{halves[i]}.p = getelementptr i8, ptr {base}, i32 {at + row * 32}",
                             f"{halves[i]} = load <8 x float>, ptr {halves[i]}.p, align 4")] + [
            f"%{p}{name}{row} = shufflevector <8 x float> {halves[0]}, <8 x float> {halves[1]}, "
            f"<16 x i32> <{', '.join(f'i32 {i}' for i in range(16))}>"]

    for t in range(8):
        lines += side_by_side("B", bs, t)
    for r in range(8):
        lines += side_by_side("C", cs, r)
        acc = f"%{p}C{r}"
        for t in range(8):
            lines += [f"%{p}A{r}.{t}.p = getelementptr i8, ptr %staged, i32 {a + (r * 8 + t) * 4}",
                      f"%{p}A{r}.{t} = load float, ptr %{p}A{r}.{t}.p",
                      f"%{p}A{r}.{t}.i = insertelement <16 x float> poison, float %{p}A{r}.{t}, i32 0",
                      f"%{p}A{r}.{t}.s = shufflevector <16 x float> %{p}A{r}.{t}.i, <16 x float> poison, "
                      f"<16 x i32> zeroinitializer",
                      f"%{p}D{r}.{t} = call <16 x float> @llvm.fma.v16f32(<16 x float> %{p}A{r}.{t}.s, "
                      f"<16 x float> %{p}B{t}, <16 x float> {acc})"]
            acc = f"%{p}D{r}.{t}"
        for i, at in enumerate(ds):
            lines += [f"%{p}E{r}.{i} = shufflevector <16 x float> {acc}, <16 x float> poison, "
                      f"<8 x i32> <{', '.join(f'i32 {8 * i + j}' for j in range(8))}>",
                      f"%{p}E{r}.{i}.p = getelementptr i8, ptr %staged, i32 {at + r * 32}",
                      f"store <8 x float> %{p}E{r}.{i}, ptr %{p}E{r}.{i}.p, align 4"]
    return lines


def _multiply(p: str, a: int, b: int, c: int, d: int) -> List[str]:
    """Lines computing D = A*B + C of the staged matrices at byte offsets a, b, c, d of
    %staged, names prefixed with `p`. Two rows of D at once (16-wide: one AVX-512 FMA): rows
    r and r + 1 of A are 16 consecutive floats, and A[r][t], A[r + 1][t] spread over the
    halves are one shuffle."""
    lines = []
    for t in range(8):
        lines += [f"%{p}B{t}.p = getelementptr i8, ptr %staged, i32 {b + t * 32}",
                  f"%{p}B{t}.h = load <8 x float>, ptr %{p}B{t}.p, align 4",
                  f"%{p}B{t} = shufflevector <8 x float> %{p}B{t}.h, <8 x float> poison, <16 x i32> <{', '.join(f'i32 {i % 8}' for i in range(16))}>"]
    c_base, c = _address(c)
    for r in range(0, 8, 2):
        lines += [f"%{p}C{r}.p = getelementptr i8, ptr {c_base}, i32 {c + r * 32}",
                  f"%{p}C{r} = load <16 x float>, ptr %{p}C{r}.p, align 4",
                  f"%{p}A{r}.p = getelementptr i8, ptr %staged, i32 {a + r * 32}",
                  f"%{p}A{r} = load <16 x float>, ptr %{p}A{r}.p, align 4"]
        acc = f"%{p}C{r}"
        for t in range(8):
            lines += [f"%{p}A{r}.{t} = shufflevector <16 x float> %{p}A{r}, <16 x float> poison, "
                      f"<16 x i32> <{', '.join(f'i32 {i}' for i in [t] * 8 + [8 + t] * 8)}>",
                      f"%{p}D{r}.{t} = call <16 x float> @llvm.fma.v16f32(<16 x float> %{p}A{r}.{t}, "
                      f"<16 x float> %{p}B{t}, <16 x float> {acc})"]
            acc = f"%{p}D{r}.{t}"
        lines += [f"%{p}D{r}.p = getelementptr i8, ptr %staged, i32 {d + r * 32}",
                  f"store <16 x float> {acc}, ptr %{p}D{r}.p, align 4"]
    return lines

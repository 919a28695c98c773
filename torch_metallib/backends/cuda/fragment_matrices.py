"""Tensor-core fragments read from threadgroup memory with ``ldmatrix``.

MLX's steel GEMM reads each lane's two halves of an 8x8 fragment from a threadgroup tile:
with the lanes relabelled (lane_relabeling.py), lane l = 4g + t reads row g, columns 2t and
2t+1, at ``base + offset`` where ``base`` is the same register for every fragment of one
operand and ``offset`` a constant. Where each lane's ``base - 4t`` is lane 4g's ``base`` and a
multiple of 16 (the fragment's rows are 16-byte runs), one ``ldmatrix`` reads up to four such
fragments: as they are (A, mma.sync's row fragments) or transposed (B, its column
fragments: what took two shuffles per fragment). Which loads have that form is read from
the optimized module (fragment_source); whether the rows are what they seem is checked at
run time, once where ``base`` is defined (check_lines); a warp that fails the check, or is not
whole, takes the exact product (tensor_core_products.py).
"""

import re
from typing import Dict, List, Optional, Tuple

__all__ = ["address", "fragment_source", "movable", "check_lines", "chunks", "ldmatrix_lines", "reload_lines", "DECLARATIONS"]

_GEP = re.compile(r"getelementptr (?:inbounds )?(?:nuw )?(i8|i16|half|bfloat|float), ptr addrspace\(3\) (%[-\w.$]+), "
                  r"i64 (-?\d+)$")
_LOAD = re.compile(r"load (half|bfloat), ptr addrspace\(3\) (%[-\w.$]+), align \d+$")
_VECTOR_LOAD = re.compile(r"load <2 x (half|bfloat)>, ptr addrspace\(3\) (%[-\w.$]+), align \d+$")
_BYTES = {"i8": 1, "i16": 2, "half": 2, "bfloat": 2, "float": 4}
# What may stand between a fragment's loads and its product: nothing that writes memory.
_INERT = re.compile(r"^  %[-\w.$]+ = (?:load |fpext |insertelement |extractelement |getelementptr |bitcast |"
                    r"(?:tail )?call <2 x float> @tm\.cuda\.product8x8\()")


def _returned(count: int) -> str:
    """What ldmatrix of `count` fragments returns: an i32 each (one: no struct)."""
    return "i32" if count == 1 else "{ " + ", ".join(["i32"] * count) + " }"


DECLARATIONS = ["declare i1 @llvm.nvvm.vote.all.sync(i32, i1)"] + [
    f"declare {_returned(n)} @llvm.nvvm.ldmatrix.sync.aligned.m8n8.x{n}{trans}.b16(ptr addrspace(3))"
    for n in (1, 2, 4) for trans in ("", ".trans")]


def address(pointer: str, defined: Dict[str, str]) -> Tuple[str, int]:
    """(base, byte offset): `pointer` as constant steps from a register."""
    offset = 0
    while True:
        step = _GEP.match(defined.get(pointer, ""))
        if not step:
            return pointer, offset
        offset += int(step.group(3)) * _BYTES[step.group(1)]
        pointer = step.group(2)


def fragment_source(source, kind: str, defined: Dict[str, str]) -> Optional[Tuple[str, int, List[str]]]:
    """(base, offset, loaded values) where `source` (tensor_core_products._halves: a <2 x kind>
    value or its two scalars) is loaded from threadgroup memory at base + offset and the next
    element, base a register defined by an instruction (not a phi) and offset a multiple of 16."""
    if isinstance(source, str):
        loaded = _VECTOR_LOAD.match(defined.get(source, ""))
        if not loaded or loaded.group(1) != kind:
            return None
        base, offset = address(loaded.group(2), defined)
        values = [source]
    else:
        loads = [_LOAD.match(defined.get(value, "")) for value in source]
        if not all(loads) or {m.group(1) for m in loads} != {kind}:
            return None
        (base, offset), (second, after) = (address(m.group(2), defined) for m in loads)
        if second != base or after != offset + 2:
            return None
        values = list(source)
    definition = defined.get(base)
    if not base.startswith("%") or definition is None or definition.startswith("phi ") or offset % 16:
        return None
    return base, offset, values


def movable(values: List[str], lines: List[str], at: int, positions: Dict[str, int]) -> bool:
    """Whether the loads of `values` may be read again at line `at`: same block, and nothing
    between them and it that writes memory."""
    first = min(positions.get(v, -1) for v in values)
    return 0 <= first < at and all(_INERT.match(line) for line in lines[first:at])


def check_lines(base: str, name: str) -> List[str]:
    """Lines, placed after `base`'s definition, leaving i1 %`name`.ok (the whole warp is
    here and every lane's rows are 16-byte runs as above) and i32 %`name`.row (the address
    of row l&7 of the fragment at `base`: what lane l gives ldmatrix, before the offset)."""
    n = f"%{name}"
    return [f"{n}.mask = call i32 @llvm.nvvm.activemask()", f"{n}.lane = call i32 @llvm.nvvm.read.ptx.sreg.laneid()",
            f"{n}.at = ptrtoint ptr addrspace(3) {base} to i32", f"{n}.t = and i32 {n}.lane, 3",
            f"{n}.t4 = shl i32 {n}.t, 2", f"{n}.mine = sub i32 {n}.at, {n}.t4", f"{n}.lead = and i32 {n}.lane, 28",
            f"{n}.led = call i32 @llvm.nvvm.shfl.sync.idx.i32(i32 {n}.mask, i32 {n}.mine, i32 {n}.lead, i32 31)",
            f"{n}.same = icmp eq i32 {n}.led, {n}.mine", f"{n}.low = and i32 {n}.mine, 15",
            f"{n}.aligned = icmp eq i32 {n}.low, 0", f"{n}.good = and i1 {n}.same, {n}.aligned",
            f"{n}.all = call i1 @llvm.nvvm.vote.all.sync(i32 {n}.mask, i1 {n}.good)",
            f"{n}.whole = icmp eq i32 {n}.mask, -1", f"{n}.ok = and i1 {n}.whole, {n}.all",
            f"{n}.r = and i32 {n}.lane, 7", f"{n}.src = shl i32 {n}.r, 2",
            f"{n}.row = call i32 @llvm.nvvm.shfl.sync.idx.i32(i32 {n}.mask, i32 {n}.at, i32 {n}.src, i32 31)"]


def chunks(fragments: List[Tuple[str, int]]) -> List[List[int]]:
    """Indices of `fragments` ((base, offset) each) grouped for one ldmatrix each: same
    base, four, two or one at a time."""
    by_base: Dict[str, List[int]] = {}
    for index, (base, _) in enumerate(fragments):
        by_base.setdefault(base, []).append(index)
    grouped = []
    for indices in by_base.values():
        while indices:
            size = 4 if len(indices) >= 4 else 2 if len(indices) >= 2 else 1
            grouped.append(indices[:size])
            indices = indices[size:]
    return grouped


def ldmatrix_lines(row: str, offsets: List[int], trans: bool, name: str) -> List[str]:
    """Lines leaving i32 %`name`.0 .. : the fragments at row address `row` (check_lines) plus
    each offset, lane groups of 8 giving one fragment's rows each."""
    count = len(offsets)
    lines = [f"%{name}.lane = call i32 @llvm.nvvm.read.ptx.sreg.laneid()",
             f"%{name}.q0 = lshr i32 %{name}.lane, 3", f"%{name}.q = and i32 %{name}.q0, {count - 1}"]
    chosen = str(offsets[-1])
    for q in range(count - 2, -1, -1):
        lines += [f"%{name}.is{q} = icmp eq i32 %{name}.q, {q}",
                  f"%{name}.o{q} = select i1 %{name}.is{q}, i32 {offsets[q]}, i32 {chosen}"]
        chosen = f"%{name}.o{q}"
    returned = _returned(count)
    lines += [f"%{name}.a = add i32 {row}, {chosen}", f"%{name}.w = zext i32 %{name}.a to i64",
              f"%{name}.p = inttoptr i64 %{name}.w to ptr addrspace(3)",
              f"%{name}{'.0' if count == 1 else ''} = call {returned} "
              f"@llvm.nvvm.ldmatrix.sync.aligned.m8n8.x{count}{'.trans' if trans else ''}.b16(ptr addrspace(3) %{name}.p)"]
    return lines + [f"%{name}.{q} = extractvalue {returned} %{name}, {q}" for q in range(count) if count > 1]


def reload_lines(base: str, offset: int, kind: str, name: str) -> List[str]:
    """Lines leaving <2 x float> %`name`: the lane's two elements at `base` + `offset`, read
    again (for the exact product, where the fragment's loads were not kept)."""
    return [f"%{name}.p0 = getelementptr inbounds i8, ptr addrspace(3) {base}, i64 {offset}",
            f"%{name}.p1 = getelementptr inbounds i8, ptr addrspace(3) {base}, i64 {offset + 2}",
            f"%{name}.h0 = load {kind}, ptr addrspace(3) %{name}.p0, align 2",
            f"%{name}.h1 = load {kind}, ptr addrspace(3) %{name}.p1, align 2",
            f"%{name}.f0 = fpext {kind} %{name}.h0 to float", f"%{name}.f1 = fpext {kind} %{name}.h1 to float",
            f"%{name}.v0 = insertelement <2 x float> poison, float %{name}.f0, i32 0",
            f"%{name} = insertelement <2 x float> %{name}.v0, float %{name}.f1, i32 1"]

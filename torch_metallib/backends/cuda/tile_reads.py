"""Float 8x8 products whose operands each lane reads from their threadgroup tile.

A float product without tensor cores (matrix_products.py's exact path) gathers the row of A
and the two columns of B a lane needs from the lanes that hold them: 24 shuffles per product,
which bound MLX's f32 steel GEMM. Where every fragment of a run of products was loaded from
a tile (each lane's two elements at ``base + offset`` and ``base + offset + 4``, ``base`` one
register per operand, ``offset`` a constant, nothing written in between), the elements another
lane loaded are at that lane's ``base`` plus the same offset, so a lane reads them itself:
the addresses are exchanged once, where ``base`` is defined (check_lines), not per product.

* A: lane (r, c) needs A[r][0..7]. Where each lane's ``base - 4c`` is the ``base`` of lane
  (r, 0) and 16-byte aligned (checked), the row is 32 contiguous bytes: two 16-byte loads.
* B: lane (r, c) needs B[k][c], B[k][c+1] for each k: at the ``base`` of lane (k, c), eight
  addresses shuffled once; an 8-byte load each where every ``base`` is 8-byte aligned (checked).

Each element of D is then the same chain of fused multiply-adds, same operands, same order,
as the exact product computes (bit for bit). A warp that is not whole, here or where ``base``
was defined, or whose check fails, takes the exact product. Lanes relabelled for tensor cores
(lane_relabeling.py) are left to the exact path.
"""

import re
from typing import Dict, List, Optional, Tuple

from .fragment_matrices import address

__all__ = ["float_fragment", "check_lines", "arguments", "run_definition", "struct_lines", "ROLES"]

_LOAD = re.compile(r"load float, ptr addrspace\(3\) (%[-\w.$]+), align \d+$")
_VECTOR_LOAD = re.compile(r"load <2 x float>, ptr addrspace\(3\) (%[-\w.$]+), align \d+$")
_INSERTED = re.compile(r"insertelement <2 x float> (\S+), float (\S+), i(?:32|64) (\d)$")
# Which operand a tile serves -> the byte alignment its offsets need (the loads' widths).
ROLES = {"a": 16, "b": 8}


def float_fragment(value: str, defined: Dict[str, str]) -> Optional[Tuple[str, int, List[str]]]:
    """(base, offset, loaded values) where <2 x float> `value` is loaded from threadgroup
    memory at base + offset and base + offset + 4, base a register defined by an instruction
    (not a phi); else None."""
    vector = _VECTOR_LOAD.match(defined.get(value, ""))
    if vector:
        base, offset = address(vector.group(1), defined)
        values = [value]
    else:
        scalars, line = [], defined.get(value, "")
        for slot in (1, 0):
            inserted = _INSERTED.match(line)
            if not inserted or int(inserted.group(3)) != slot:
                return None
            scalars.insert(0, inserted.group(2))
            line = defined.get(inserted.group(1), "")
        loads = [_LOAD.match(defined.get(scalar, "")) for scalar in scalars]
        if not all(loads):
            return None
        (base, offset), (second, after) = (address(m.group(1), defined) for m in loads)
        if second != base or after != offset + 4:
            return None
        values = scalars
    definition = defined.get(base)
    if not base.startswith("%") or definition is None or definition.startswith("phi "):
        return None
    return base, offset, values


def _lanes(lane: str, n: str) -> List[str]:
    """%`n`.r4c: 4c for the Metal lane `lane` (column c = ((l>>3)&1)*4 + (l&1)*2)."""
    return [f"{n}.c16 = and i32 {lane}, 8", f"{n}.c16s = shl i32 {n}.c16, 1", f"{n}.c1 = and i32 {lane}, 1",
            f"{n}.c8 = shl i32 {n}.c1, 3", f"{n}.r4c = or i32 {n}.c16s, {n}.c8"]


def check_lines(base: str, role: str, name: str) -> List[str]:
    """Lines, placed after `base`'s definition, leaving i1 %`name`.ok (the whole warp is here
    and its addresses have the role's form, module docstring) and the addresses: for "a"
    i32 %`name`.row (the lane's row of A), for "b" i32 %`name`.k0 .. k7 (the lane's pair of
    row k of B)."""
    n = f"%{name}"
    lines = [f"{n}.mask = call i32 @llvm.nvvm.activemask()", f"{n}.lane = call i32 @llvm.nvvm.read.ptx.sreg.laneid()",
             f"{n}.at = ptrtoint ptr addrspace(3) {base} to i32"]
    if role == "a":
        # Lane (r, 0) is lane l with its column bits (8 and 1) cleared.
        lines += _lanes(f"{n}.lane", n) + [
            f"{n}.lead = and i32 {n}.lane, 22",
            f"{n}.row = call i32 @llvm.nvvm.shfl.sync.idx.i32(i32 {n}.mask, i32 {n}.at, i32 {n}.lead, i32 31)",
            f"{n}.mine = add i32 {n}.row, {n}.r4c", f"{n}.same = icmp eq i32 {n}.mine, {n}.at",
            f"{n}.low = and i32 {n}.row, 15", f"{n}.aligned = icmp eq i32 {n}.low, 0",
            f"{n}.good = and i1 {n}.same, {n}.aligned"]
    else:
        # Lane (k, c): ((k>>2)<<4) | ((k&3)<<1) with lane l's column bits (8 and 1).
        lines += [f"{n}.cbits = and i32 {n}.lane, 9"]
        for k in range(8):
            lines += [f"{n}.src{k} = or i32 {n}.cbits, {((k >> 2) << 4) | ((k & 3) << 1)}",
                      f"{n}.k{k} = call i32 @llvm.nvvm.shfl.sync.idx.i32(i32 {n}.mask, i32 {n}.at, i32 {n}.src{k}, "
                      "i32 31)"]
        lines += [f"{n}.low = and i32 {n}.at, 7", f"{n}.good = icmp eq i32 {n}.low, 0"]
    return lines + [f"{n}.all = call i1 @llvm.nvvm.vote.all.sync(i32 {n}.mask, i1 {n}.good)",
                    f"{n}.whole = icmp eq i32 {n}.mask, -1", f"{n}.ok = and i1 {n}.whole, {n}.all"]


def arguments(role: str, check: str, base: str) -> List[str]:
    """The run function's arguments for one tile (run_definition's parameters)."""
    addresses = ["row"] if role == "a" else [f"k{k}" for k in range(8)]
    return [f"i32 %{check}.{a}" for a in addresses] + [f"i1 %{check}.ok", f"ptr addrspace(3) {base}"]


def _load(address: str, offset: int, type_: str, align: int, name: str) -> List[str]:
    return [f"{name}.a = add i32 {address}, {offset}", f"{name}.w = zext i32 {name}.a to i64",
            f"{name}.p = inttoptr i64 {name}.w to ptr addrspace(3)",
            f"{name} = load {type_}, ptr addrspace(3) {name}.p, align {align}"]


def _reload(base: str, offset: int, name: str) -> List[str]:
    """<2 x float> %`name`: the lane's own pair at `base` + `offset`, for the exact product."""
    return [f"%{name}.p0 = getelementptr inbounds i8, ptr addrspace(3) {base}, i64 {offset}",
            f"%{name}.p1 = getelementptr inbounds i8, ptr addrspace(3) {base}, i64 {offset + 4}",
            f"%{name}.f0 = load float, ptr addrspace(3) %{name}.p0, align 4",
            f"%{name}.f1 = load float, ptr addrspace(3) %{name}.p1, align 4",
            f"%{name}.v0 = insertelement <2 x float> poison, float %{name}.f0, i32 0",
            f"%{name} = insertelement <2 x float> %{name}.v0, float %{name}.f1, i32 1"]


def run_definition(name: str, tiles, fragments, shape, struct: str, exact_run: str) -> str:
    """The function of one run of products. `tiles`: (role, tile index within the role) of
    each parameter group, in arguments' order; `fragments`: for "a" and "b", the (tile
    index, offset) of each fragment; shape[n] = (A index, B index) of product n, its C the
    n-th <2 x float> parameter; `exact_run`: the function of the run's exact products
    (tensor_core_products._exact_run)."""
    parameters, oks = [], []
    for role, t in tiles:
        addresses = ["row"] if role == "a" else [f"k{k}" for k in range(8)]
        parameters += [f"i32 %{role}{t}.{a}" for a in addresses]
        parameters += [f"i1 %{role}{t}.ok", f"ptr addrspace(3) %{role}{t}.base"]
        oks.append(f"%{role}{t}.ok")
    parameters += [f"<2 x float> %c{n}" for n in range(len(shape))]
    lines = ["%all = call i32 @llvm.nvvm.activemask()", "%go0 = icmp eq i32 %all, -1"]
    for g, ok in enumerate(oks):
        lines.append(f"%go{g + 1} = and i1 %go{g}, {ok}")
    lines += [f"br i1 %go{len(oks)}, label %read, label %exact", "read:"]
    for i, (t, offset) in enumerate(fragments["a"]):  # A[r][0..7]
        for half in (0, 1):
            lines += _load(f"%a{t}.row", offset + 16 * half, "<4 x float>", 16, f"%aq{i}.{half}")
            lines += [f"%ar{i}.{4 * half + e} = extractelement <4 x float> %aq{i}.{half}, i32 {e}" for e in range(4)]
    for j, (t, offset) in enumerate(fragments["b"]):  # B[k][c], B[k][c+1]
        for k in range(8):
            lines += _load(f"%b{t}.k{k}", offset, "<2 x float>", 8, f"%bc{j}.{k}")
            lines += [f"%bc{j}.{k}.{e} = extractelement <2 x float> %bc{j}.{k}, i32 {e}" for e in (0, 1)]
    made = []
    for n, (i, j) in enumerate(shape):  # matrix_products.exact_product_lines' chain, k in order
        for e in (0, 1):
            acc = f"%c{n}.{e}"
            lines.append(f"{acc} = extractelement <2 x float> %c{n}, i32 {e}")
            for k in range(8):
                lines.append(f"%d{n}.{e}.{k} = call float @llvm.fma.f32(float %ar{i}.{k}, float %bc{j}.{k}.{e}, "
                             f"float {acc})")
                acc = f"%d{n}.{e}.{k}"
        lines += [f"%r{n}.0 = insertelement <2 x float> poison, float %d{n}.0.7, i32 0",
                  f"%r{n} = insertelement <2 x float> %r{n}.0, float %d{n}.1.7, i32 1"]
        made.append(f"%r{n}")
    lines += struct_lines(struct, made, "sm") + ["br label %done", "exact:"]
    for role in ("a", "b"):
        for i, (t, offset) in enumerate(fragments[role]):
            lines += _reload(f"%{role}{t}.base", offset, f"{role}{i}")
    operands = ([f"<2 x float> %c{n}" for n in range(len(shape))]
                + [f"<2 x float> %a{i}" for i in range(len(fragments["a"]))]
                + [f"<2 x float> %b{j}" for j in range(len(fragments["b"]))])
    lines += [f"%se = call {struct} @{exact_run}({', '.join(operands)}, i1 false)", "br label %done", "done:",
              f"%r = phi {struct} [ %sm, %read ], [ %se, %exact ]", f"ret {struct} %r"]
    body = "\n  ".join(lines)
    return (f"define internal {struct} @{name}({', '.join(parameters)}) alwaysinline convergent nounwind "
            f"{{\nentry:\n  {body}\n}}")


def struct_lines(struct: str, values: List[str], name: str) -> List[str]:
    """Lines leaving %`name`: the <2 x float> `values` as a `struct`."""
    lines, previous = [], "poison"
    for n, value in enumerate(values):
        made = f"%{name}" if n == len(values) - 1 else f"%{name}.{n}"
        lines.append(f"{made} = insertvalue {struct} {previous}, <2 x float> {value}, {n}")
        previous = made
    return lines

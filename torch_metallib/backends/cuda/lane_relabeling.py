"""Which CUDA lane plays which Metal lane, chosen so that an 8x8 simdgroup matrix already
sits in the layout of NVIDIA's ``mma.sync`` fragments.

Metal's lane v holds M[r][c], M[r][c+1] with r = ((v>>4)<<2)|((v>>1)&3) and
c = ((v>>3)&1)*4 + (v&1)*2 (air/simdgroup_matrix.py); mma.sync's A, C and D fragments
(the top 8 rows of m16n8k8) give lane l the row l>>2, columns 2(l&3) and 2(l&3)+1. Both
give each lane two neighbouring elements of one row, so they differ by a permutation of
the lanes: CUDA lane l runs Metal lane ``relabel(l) = (l&16) | ((l&2)<<2) | (((l>>2)&3)<<1)
| (l&1)``. The kernel is the same Metal kernel with its threads assigned to the GPU's in
another order (SIMD-groups keep their members), so everything a thread computes for itself
is unchanged; only what names lanes (the products, matrix_products.py) spells the
permutation. A kernel is relabelled where its only SIMD-group functions are products,
barriers and filled matrices (decided when lowering), and a threadgroup holds whole warps
(decided per launch: ``@tm_cuda_lanes_relabeled``), since a partial warp's lanes would
otherwise play Metal lanes past the threadgroup's end.
"""

from typing import Callable, List

__all__ = ["RELABELED", "relabeled_definition", "relabeled_thread_lines", "virtual_lane", "physical_lane",
           "relabel_safe"]

RELABELED = "tm_cuda_lanes_relabeled"
_SREG = "llvm.nvvm.read.ptx.sreg"
# SIMD-group functions whose meaning names no lane.
_LANE_FREE = ("air.simdgroup.barrier", "air.wg.barrier", "air.simdgroup_matrix_8x8_init_filled",
              "air.simdgroup_matrix_8x8_multiply_accumulate")


def relabeled_definition(enabled: bool) -> str:
    """``i1 @tm_cuda_lanes_relabeled()``: whether this launch's lanes are relabelled (never
    where not `enabled`)."""
    if not enabled:
        return f"define internal i1 @{RELABELED}() alwaysinline {{\n  ret i1 false\n}}\n"
    return (f"define internal i1 @{RELABELED}() alwaysinline {{\n"
            f"  %x = call i32 @{_SREG}.ntid.x()\n  %y = call i32 @{_SREG}.ntid.y()\n"
            f"  %z = call i32 @{_SREG}.ntid.z()\n  %xy = mul i32 %x, %y\n  %n = mul i32 %xy, %z\n"
            f"  %part = and i32 %n, 31\n  %whole = icmp eq i32 %part, 0\n  ret i1 %whole\n}}\n")


def _permuted(value: str, name: str, inverse: bool) -> List[str]:
    """%`name` = relabel(`value`) (or its inverse) for a lane index."""
    if inverse:  # Metal lane v -> CUDA lane: (v&16) | (((v>>3)&1)<<1) | (((v>>1)&3)<<2) | (v&1)
        parts = [("and", 16, None), ("lshr", 3, (1, "shl", 1)), ("lshr", 1, (3, "shl", 2)), ("and", 1, None)]
    else:  # CUDA lane l -> Metal lane: (l&16) | (((l>>1)&1)<<3) | (((l>>2)&3)<<1) | (l&1)
        parts = [("and", 16, None), ("lshr", 1, (1, "shl", 3)), ("lshr", 2, (3, "shl", 1)), ("and", 1, None)]
    lines, pieces = [], []
    for k, (op, amount, then) in enumerate(parts):
        piece = f"%{name}.q{k}"
        if then is None:
            lines.append(f"{piece} = {op} i32 {value}, {amount}")
        else:
            field, shift_op, shift = then
            lines += [f"{piece}.s = {op} i32 {value}, {amount}", f"{piece}.m = and i32 {piece}.s, {field}",
                      f"{piece} = {shift_op} i32 {piece}.m, {shift}"]
        pieces.append(piece)
    lines += [f"%{name}.o1 = or i32 {pieces[0]}, {pieces[1]}", f"%{name}.o2 = or i32 {pieces[2]}, {pieces[3]}",
              f"%{name} = or i32 %{name}.o1, %{name}.o2"]
    return lines


def virtual_lane(lane: str, flag: str, name: str) -> List[str]:
    """%`name` = the Metal lane CUDA lane `lane` plays (where i1 `flag`, else `lane`)."""
    return _permuted(lane, f"{name}.p", False) + [f"%{name} = select i1 {flag}, i32 %{name}.p, i32 {lane}"]


def physical_lane(lane: str, flag: str, name: str) -> List[str]:
    """%`name` = the CUDA lane playing Metal lane `lane` (where i1 `flag`, else `lane`)."""
    return _permuted(lane, f"{name}.p", True) + [f"%{name} = select i1 {flag}, i32 %{name}.p, i32 {lane}"]


def relabeled_thread_lines() -> List[str]:
    """Lines turning the hardware's %tx.hw, %ty.hw, %tz.hw (and %ax, %ay) into the Metal
    thread %tx, %ty, %tz this thread plays: its linear index with the low five bits relabelled."""
    return (["%hrowz = mul i32 %tz.hw, %ay", "%hrow = add i32 %hrowz, %ty.hw", "%hbase = mul i32 %hrow, %ax",
             "%hlinear = add i32 %hbase, %tx.hw", f"%relabel = call i1 @{RELABELED}()",
             "%hlane = and i32 %hlinear, 31", "%hwarp = and i32 %hlinear, -32"]
            + virtual_lane("%hlane", "%relabel", "vlane")
            + ["%vlinear = or i32 %hwarp, %vlane", "%tx = urem i32 %vlinear, %ax", "%vyz = udiv i32 %vlinear, %ax",
               "%ty = urem i32 %vyz, %ay", "%tz = udiv i32 %vyz, %ay"])


def relabel_safe(declared: dict, names_lanes: Callable[[str, str, list], bool]) -> bool:
    """Whether a kernel declaring these AIR functions (name -> (ret, name, params)) may run
    relabelled: it has a product, and every SIMD-group function it calls names no lane
    (`names_lanes` says which functions exchange between lanes or place a lane's elements)."""
    names = list(declared)
    if not any(name.startswith("air.simdgroup_matrix_8x8_multiply_accumulate") for name in names):
        return False
    return all(name.startswith(_LANE_FREE) or not names_lanes(*declared[name]) for name in names)

"""The SIMD-group exchange as warp shuffles: the CUDA backend's Target (air/target.py), how
it spells the collectives that air/collectives.py defines (their meaning, lane order
included, lives there once).

An Apple SIMD-group is 32 threads, like a warp, and thread l of a threadgroup is lane
l % 32 of warp l / 32 on both. Where the CPU deposits each lane's value in memory and
reads lane j's slot, a warp reads lane j's value with ``shfl.sync.idx``; the lanes that
take part are the warp's active lanes (``activemask``), or where the warp may not have
reconverged, the lanes a vote found (converged_masks.py). Values of any width travel as
32-bit pieces. A lane that did not take part gives an undefined value, which the
collectives never use (they test the mask first, as on the CPU).
"""

import re
from typing import Dict, List, Set, Tuple

from ...air.collectives import THREAD_IN_GROUP
from ...air.target import Target

__all__ = ["WarpSpelling", "DECLARATIONS", "value_bits"]

DECLARATIONS = ["declare i32 @llvm.nvvm.activemask()", "declare i32 @llvm.nvvm.read.ptx.sreg.laneid()",
                "declare i32 @llvm.nvvm.shfl.sync.idx.i32(i32, i32, i32, i32)",
                "declare i32 @llvm.nvvm.shfl.sync.bfly.i32(i32, i32, i32, i32)",
                "declare void @llvm.nvvm.bar.warp.sync(i32)", "declare void @llvm.nvvm.barrier0()",
                "declare i32 @llvm.cttz.i32(i32, i1)"]
_SCALAR_BITS = {"half": 16, "bfloat": 16, "float": 32, "double": 64}


def value_bits(type_name: str) -> int:
    """The exact bit width of a scalar or vector value type."""
    vector = re.fullmatch(r"<(\d+) x (.+)>", type_name)
    if vector:
        return int(vector.group(1)) * value_bits(vector.group(2))
    if re.fullmatch(r"i\d+", type_name):
        return int(type_name[1:])
    if type_name in _SCALAR_BITS:
        return _SCALAR_BITS[type_name]
    raise ValueError(f"no warp shuffle for values of type {type_name}")


class WarpSpelling(Target):
    """The target of one intrinsic definition at a time (it remembers what was exchanged)."""

    every_lane_computes = True  # no lane reads what another computed
    blended_folds = True  # ptxas: no branch or select per lane (collectives._fold_blended)

    def __init__(self, mask: str = ""):
        self._deposited: Dict[int, Tuple[str, str]] = {}  # byte offset -> (type, operand)
        self._mask = mask  # an operand naming the lanes that take part, else activemask()

    def exchange(self, values: List[Tuple[str, str]]) -> List[str]:
        """Lines leaving %mask (the active lanes) and %lane; remembers `values` for read."""
        self._deposited, offset = {}, 0
        for type_name, operand in values:
            self._deposited[offset] = (type_name, operand)
            offset += max(value_bits(type_name) // 8, 1)
        mask = f"%mask = or i32 {self._mask}, 0" if self._mask else "%mask = call i32 @llvm.nvvm.activemask()"
        return [mask, "%lane = call i32 @llvm.nvvm.read.ptx.sreg.laneid()"]

    def read(self, type_name: str, lane: str, name: str, offset: int) -> List[str]:
        """%`name` = lane `lane`'s value deposited at byte `offset`."""
        deposited, operand = self._deposited[offset]
        if deposited != type_name:
            raise ValueError(f"a collective reads {type_name} where {deposited} was exchanged")
        return shuffle(type_name, operand, lane, name)

    def reduce(self, combine, identity: str, type_name: str) -> Tuple[List[str], str]:
        """(lines, result) of a reduction over the active lanes of the value deposited first,
        combine(acc, other, out) giving each step's lines. With all 32 lanes active, a
        butterfly of 5 shuffles (every lane ends with the same value: the operations are
        commutative); otherwise lane by lane in lane order (the CPU's order), a loop over
        the mask's set bits: ptxas (sm_90) fails to allocate predicates for 32 unrolled
        selects in divergent code."""
        _, operand = self._deposited[0]
        lines = ["%tree.full = icmp eq i32 %mask, -1", "br i1 %tree.full, label %tree, label %in.order", "tree:"]
        acc = operand
        for step in (16, 8, 4, 2, 1):
            lines += shuffle(type_name, acc, str(step), f"bf{step}", kind="bfly", mask="-1")
            lines += combine(acc, f"%bf{step}", f"%tacc{step}")
            acc = f"%tacc{step}"
        lines += ["br label %reduced", "in.order:", "br label %each", "each:",
                  "%left = phi i32 [ %mask, %in.order ], [ %left.next, %each ]",
                  f"%acc = phi {type_name} [ {identity}, %in.order ], [ %acc.next, %each ]",
                  "%at = call i32 @llvm.cttz.i32(i32 %left, i1 true)"]
        lines += shuffle(type_name, operand, "%at", "lv") + combine("%acc", "%lv", "%acc.next")
        lines += ["%left.less = sub i32 %left, 1", "%left.next = and i32 %left, %left.less",
                  "%more = icmp ne i32 %left.next, 0", "br i1 %more, label %each, label %reduced", "reduced:",
                  f"%folded = phi {type_name} [ {acc}, %tree ], [ %acc.next, %each ]"]
        return lines, "%folded"

    def meet(self, value: str, bytes_: int) -> List[str]:
        """A SIMD-group barrier with memory flags: the active lanes meet (deposits of no bytes)."""
        return ["%meet.mask = call i32 @llvm.nvvm.activemask()", "call void @llvm.nvvm.bar.warp.sync(i32 %meet.mask)"]

    def barrier(self) -> List[str]:
        """A threadgroup barrier: ``bar.sync 0``, which also orders shared and global memory
        among the block's threads (what Metal's mem_threadgroup and mem_device ask)."""
        return ["call void @llvm.nvvm.barrier0()"]

    def declarations(self, text: str, declared: Set[str]) -> List[str]:
        """The running thread's index in its threadgroup, which lowering.py defines."""
        return [THREAD_IN_GROUP] if "@tm_rt_" in text else []


def shuffle(type_name: str, operand: str, lane: str, name: str, kind: str = "idx", mask: str = "%mask") -> List[str]:
    """Lines leaving %`name` = `operand` of lane `lane` (an i32 operand; for `kind` bfly, of
    this lane xor `lane`), in 32-bit pieces, among the lanes of `mask`."""
    bits = value_bits(type_name)
    wide = -(-bits // 32) * 32
    integer = f"i{bits}"
    lines = [] if type_name == integer else [f"%{name}.bits = bitcast {type_name} {operand} to {integer}"]
    value = operand if type_name == integer else f"%{name}.bits"
    if wide != bits:
        lines.append(f"%{name}.wide = zext {integer} {value} to i{wide}")
        value = f"%{name}.wide"
    result = None
    for k in range(wide // 32):
        piece = value
        if wide > 32:
            lines += [f"%{name}.sh{k} = lshr i{wide} {value}, {32 * k}", f"%{name}.p{k} = trunc i{wide} %{name}.sh{k} to i32"]
            piece = f"%{name}.p{k}"
        lines.append(f"%{name}.s{k} = call i32 @llvm.nvvm.shfl.sync.{kind}.i32(i32 {mask}, i32 {piece}, i32 {lane}, i32 31)")
        if wide == 32:
            result = f"%{name}.s{k}"
            continue
        lines += [f"%{name}.z{k} = zext i32 %{name}.s{k} to i{wide}", f"%{name}.u{k} = shl i{wide} %{name}.z{k}, {32 * k}"]
        if result is None:
            result = f"%{name}.u{k}"
        else:
            lines.append(f"%{name}.o{k} = or i{wide} {result}, %{name}.u{k}")
            result = f"%{name}.o{k}"
    if wide != bits:
        lines.append(f"%{name}.t = trunc i{wide} {result} to {integer}")
        result = f"%{name}.t"
    if type_name == integer:
        lines.append(f"%{name} = or {integer} {result}, 0")
    else:
        lines.append(f"%{name} = bitcast {integer} {result} to {type_name}")
    return lines


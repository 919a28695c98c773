"""How a target spells the waits that AIR's cooperative intrinsics are built on.

The SIMD-group functions and barriers (collectives.py), simdgroup-matrix loads, stores and
products (simdgroup_matrix.py), asynchronous copies and tensor operations are defined once,
here in air/, over an abstract SIMD-group exchange: each lane deposits values and waits
until the SIMD-group's active lanes have; then it knows the lanes that took part (%mask),
its own lane (%lane), and reads any lane's deposit. A Target says how one backend spells
those steps, and every definition that waits is given one:

- ``backends/cpu/target.py``: ``Coroutines`` (the runtime in csrc/cpu/cooperative.cpp
  collects the deposits; each thread is an LLVM coroutine that suspends until it has) and
  ``LaneLoops`` (markers where regions.py cuts the kernel into loops over a SIMD-group's
  lanes);
- ``backends/cuda/warp_spelling.py``: ``WarpSpelling`` (warp shuffles, ``bar.sync``).

This base class reads an exchange from memory, in the layout below, which the CPU's
targets share (csrc/cpu/cooperative.cpp: ExchangePhase).
"""

from typing import Callable, List, Optional, Set, Tuple

from ..errors import UnsupportedKernelError
from .intrinsics import SIMD_WIDTH

__all__ = ["Target", "SLOT_BYTES", "MASK_OFFSET", "CLAIMED_OFFSET", "RESULT_OFFSET", "WAIT_ALLOCA", "SITE_ORDER"]

# An exchange's result in memory: lane l's value at l * SLOT_BYTES, then the mask of lanes
# that took part, and 0 until a lane has read it.
SLOT_BYTES = 64
MASK_OFFSET = SIMD_WIDTH * SLOT_BYTES
CLAIMED_OFFSET = MASK_OFFSET + 4
RESULT_OFFSET = 32  # in lane 0's slot: a shared result, for values of at most 32 bytes
WAIT_ALLOCA = "%wait = alloca { ptr, i32 }, align 8"  # ExchangeWait; in the entry block, not in a loop
# The parameter a definition takes last where its target orders exchanges by call site (the
# CPU's coroutines: backends/cpu/reconvergence.py passes each call its site's order).
SITE_ORDER = "i32 %site.order"


class Target:
    """One backend's spelling of the exchange, the barrier and who computes a shared result."""

    # No lane reads what another lane computed: a result that is the same for every lane (a
    # SIMD-group reduction) is computed by each lane, not once by the first to read it.
    every_lane_computes = False
    # Folds over the lanes without a branch or select per lane (collectives._fold_blended),
    # prefix folds over a mask of the lanes before this one.
    blended_folds = False

    def barrier(self) -> List[str]:
        """A threadgroup barrier (``threadgroup_barrier`` with memory flags)."""
        raise NotImplementedError

    def meet(self, value: str, bytes_: int) -> List[str]:
        """Given %wait (WAIT_ALLOCA): deposits `bytes_` bytes at `value` (a ptr operand) and
        waits until the SIMD-group's active lanes have; leaves %slots where the target reads
        deposits from memory."""
        raise NotImplementedError

    def exchange(self, values: List[Tuple[str, str]]) -> List[str]:
        """Deposits `values` ((type, operand)...) one after another and waits; leaves %mask
        (the lanes that took part) and %lane, and what `read` needs."""
        raise NotImplementedError

    def read(self, type_name: str, lane: str, name: str, offset: int) -> List[str]:
        """%`name` = the value lane `lane` exchanged at byte `offset` of its deposit."""
        return [f"%{name}.off = mul i32 {lane}, {SLOT_BYTES}",
                f"%{name}.off2 = add i32 %{name}.off, {offset}",
                f"%{name}.p = getelementptr i8, ptr %slots, i32 %{name}.off2",
                f"%{name} = load {type_name}, ptr %{name}.p"]

    def claim(self, staged: bool = False) -> List[str]:
        """%leads, given %slots (and %mask, %lane): this lane is the first to read the
        exchange's result."""
        if self.every_lane_computes and not staged:
            return ["%lead.lane = call i32 @llvm.cttz.i32(i32 %mask, i1 true)", "%leads = icmp eq i32 %lane, %lead.lane"]
        return [f"%claimp = getelementptr i8, ptr %slots, i32 {CLAIMED_OFFSET}", "%claimed = load i32, ptr %claimp",
                "%leads = icmp eq i32 %claimed, 0", "store i32 1, ptr %claimp"]

    def staged_exchange(self, bytes_: str, fill: List[str]) -> List[str]:
        """Given %wait: `bytes_` (an i64 operand) of the SIMD-group's staging memory as
        %staged, `fill` (lines that may use %lane) writing this lane's part, then a wait
        until every lane has staged; leaves %staged, %lane, %slots and %leads."""
        raise UnsupportedKernelError(f"{type(self).__name__} has no staged SIMD-group exchange "
                                     f"(simdgroup-matrix batches, tensor operations)")

    def kept_matrices(self, area: int, bytes_: int) -> List[str]:
        """%kept: `bytes_` bytes of the SIMD-group's memory numbered `area` that stays as
        written between its exchanges (simdgroup-matrix accumulators a loop keeps there)."""
        raise UnsupportedKernelError(f"{type(self).__name__} keeps no simdgroup matrices between exchanges")

    def reduce(self, combine: Callable[[str, str, str], List[str]], identity: str,
               type_name: str) -> Optional[Tuple[List[str], str]]:
        """(lines, result) of a reduction over every active lane of the first deposited
        value, or None to fold lane by lane (collectives._fold)."""
        return None

    def declarations(self, text: str, declared: Set[str]) -> List[str]:
        """Declarations of what the definitions in `text` call that the target supplies
        (`declared`: the functions `text` declares already)."""
        return []

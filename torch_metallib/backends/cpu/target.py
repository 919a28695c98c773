"""The CPU's spellings of AIR's exchange and barrier (air/target.py): ``Coroutines`` and
``LaneLoops``, one per scheme a cooperative kernel runs as (ARCHITECTURE.md, "Rules").

Both deposit a lane's values in memory and read the exchange's result from memory in
air/target.py's layout (csrc/cpu/cooperative.cpp: ExchangePhase). As coroutines, each lane
deposits with the C++ runtime (``tm_rt_simd_exchange``) and waits (suspends: coroutine.py)
until the active lanes of the SIMD-group have arrived at the same call site (in the order
reconvergence.py gives the sites), and the first lane to read a result claims it. In lane
loops a wait is a marker (``@tm.lanes.*``) where regions.py cuts the kernel into regions,
the runtime plays no part, and lanes read in lane order, so the first lane that took part
leads and each lane computes a shared result itself.
"""

import re
from typing import List, Set, Tuple

from ...air.collectives import THREAD_IN_GROUP, simd_position
from ...air.intrinsics import type_bytes
from ...air.target import MASK_OFFSET, SITE_ORDER, WAIT_ALLOCA, Target
from .coroutine import SITE_PLACEHOLDER, SUSPEND

__all__ = ["Coroutines", "LaneLoops", "NotLanes", "COROUTINES", "RUNTIME_DECLARATIONS", "LANES_MARKERS"]

RUNTIME_DECLARATIONS = ["declare void @tm_rt_barrier(i32)", THREAD_IN_GROUP,
                        "declare ptr @tm_rt_simd_exchange(ptr, i32, ptr, i32, i32)",
                        "declare ptr @tm_rt_simd_stage(i64, ptr, i32, i32)"]
LANES_MARKERS = ["declare void @tm.lanes.barrier()", "declare void @tm.lanes.deposit(ptr, i32)",
                 "declare ptr @tm.lanes.exchanged()", "declare ptr @tm.lanes.stage(i64)", "declare ptr @tm.lanes.staged()",
                 "declare ptr @tm.lanes.kept(i32, i32)"]


class NotLanes(Exception):
    """The kernel waits in a way lane loops do not take: compile it as coroutines."""


class _Memory(Target):
    """An exchange through memory: the lane's values in a buffer, then the result's slots."""

    def exchange(self, values: List[Tuple[str, str]]) -> List[str]:
        lines = ["%buf = alloca [64 x i8], align 16", WAIT_ALLOCA]
        offset = 0
        for i, (type_name, operand) in enumerate(values):
            lines += [f"%at{i} = getelementptr i8, ptr %buf, i32 {offset}", f"store {type_name} {operand}, ptr %at{i}"]
            offset += type_bytes(type_name)
        return lines + self.meet("%buf", offset) + [
            f"%maskp = getelementptr i8, ptr %slots, i32 {MASK_OFFSET}", "%mask = load i32, ptr %maskp"] + self._lane()

    def _lane(self) -> List[str]:
        raise NotImplementedError

    def declarations(self, text: str, declared: Set[str]) -> List[str]:
        extra = []
        if "@tm_rt_" in text:
            extra += RUNTIME_DECLARATIONS
        if "@tm.lanes." in text:
            extra += LANES_MARKERS + ([] if "llvm.cttz.i32" in declared else ["declare i32 @llvm.cttz.i32(i32, i1)"])
        return extra


class Coroutines(_Memory):
    """Each thread an LLVM coroutine; the runtime (csrc/cpu/cooperative.cpp) collects deposits."""

    def barrier(self) -> List[str]:
        # The barrier's site (SITE_PLACEHOLDER, numbered by split_at_suspends): checked
        # execution reports threads waiting at different barriers.
        return [f"call void @tm_rt_barrier({SITE_PLACEHOLDER})", SUSPEND]

    def meet(self, value: str, bytes_: int) -> List[str]:
        """Deposits `value` with the runtime and, unless that completed the exchange,
        suspends until it has (or asks again: a lane that had to step back or wait for
        another collective finds no slots)."""
        return ["br label %xpoll", "xpoll:",
                f"%now = call ptr @tm_rt_simd_exchange(ptr {value}, i32 {bytes_}, ptr %wait, {SITE_ORDER}, "
                f"{SITE_PLACEHOLDER})",
                "%xdone = icmp ne ptr %now, null", "br i1 %xdone, label %xgot, label %xwait",
                "xwait:", SUSPEND, "%later = load ptr, ptr %wait",
                "%xback = icmp ne ptr %later, null", "br i1 %xback, label %xgot, label %xpoll",
                "xgot:", "%slots = phi ptr [ %now, %xpoll ], [ %later, %xwait ]"]

    def _lane(self) -> List[str]:
        return ["%lanep = getelementptr i8, ptr %wait, i32 8", "%lane = load i32, ptr %lanep"]

    def staged_exchange(self, bytes_: str, fill: List[str]) -> List[str]:
        """The SIMD-group's staging memory from the runtime (tm_rt_simd_stage; suspends until
        it is handed out); a lane that had to step back stages again."""
        return ["br label %stage", "stage:",
                f"%staged = call ptr @tm_rt_simd_stage(i64 {bytes_}, ptr %wait, {SITE_ORDER}, {SITE_PLACEHOLDER})",
                "%admitted = icmp ne ptr %staged, null", "br i1 %admitted, label %fill, label %enter.wait",
                "enter.wait:", SUSPEND, "br label %stage",
                "fill:", "%lanep = getelementptr i8, ptr %wait, i32 8", "%lane = load i32, ptr %lanep"] + fill + [
                # Arrived when staged: the slots are there already if this lane completed the exchange.
                "%now = load ptr, ptr %wait", "%xdone = icmp ne ptr %now, null", "br i1 %xdone, label %xgot, label %xwait",
                "xwait:", SUSPEND, "%later = load ptr, ptr %wait",
                "%xback = icmp ne ptr %later, null", "br i1 %xback, label %xgot, label %stage",
                "xgot:", "%slots = phi ptr [ %now, %fill ], [ %later, %xwait ]"] + self.claim(staged=True)


class LaneLoops(_Memory):
    """A wait is a marker where regions.py cuts the kernel into loops over the lanes."""

    every_lane_computes = True
    branch_free_math = False  # per-lane math keeps its branches on rare inputs (fast_exp's)
    # A lane that did not take part adds the identity: the chain of a reduction is one add
    # per lane, not an add and a select (a SIMD-group's sum took a third of a row sum's time).
    blended_folds = True

    def barrier(self) -> List[str]:
        return ["call void @tm.lanes.barrier()"]

    def meet(self, value: str, bytes_: int) -> List[str]:
        """The deposit ends a region; the next one starts with the exchange's slots."""
        return [f"call void @tm.lanes.deposit(ptr {value}, i32 {bytes_})", "%slots = call ptr @tm.lanes.exchanged()"]

    def _lane(self) -> List[str]:
        return simd_position("urem", "%lane")

    def claim(self, staged: bool = False) -> List[str]:
        """Lanes read in order: the first that took part (given %mask) leads."""
        return ["%lead.lane = call i32 @llvm.cttz.i32(i32 %mask, i1 true)", "%leads = icmp eq i32 %lane, %lead.lane"]

    def staged_exchange(self, bytes_: str, fill: List[str]) -> List[str]:
        """The SIMD-group's staging memory of the exchange's phase (@tm.lanes.stage, filled
        through %staged.fill), then a deposit of no bytes; the region after it finds the
        same memory as %staged (@tm.lanes.staged). %lane is taken again after the deposit
        (the fill's is %lane.fill): the thread's index is at hand in every region, and a
        lane's position kept across the wait would cost a store and a load per lane."""
        if not bytes_.isdigit():
            raise NotLanes("it stages an exchange of a run-time size (tensor operations)")
        fill = [re.sub(r"%(staged|lane)(?![-\w$.])", r"%\1.fill", line) for line in fill]
        lane_fill = [line.replace("%thread", "%thread.fill") for line in simd_position("urem", "%lane.fill")]
        return ([f"%staged.fill = call ptr @tm.lanes.stage(i64 {bytes_})"] + lane_fill + fill
                + ["call void @tm.lanes.deposit(ptr null, i32 0)", "%slots = call ptr @tm.lanes.exchanged()",
                   "%staged = call ptr @tm.lanes.staged()", f"%maskp = getelementptr i8, ptr %slots, i32 {MASK_OFFSET}",
                   "%mask = load i32, ptr %maskp"] + self._lane() + self.claim())

    def kept_matrices(self, area: int, bytes_: int) -> List[str]:
        """The SIMD-group's kept area `area` in the context (@tm.lanes.kept)."""
        return [f"%kept = call ptr @tm.lanes.kept(i32 {area}, i32 {bytes_})"]


COROUTINES = Coroutines()  # stateless: the CPU's definitions where no scheme is given (the census)


class VectorLanes(LaneLoops):
    """Lane loops whose regions vector lanes will run: per-lane math computes its rare
    cases for every input and selects, as a branch lanes may take apart costs vector lanes
    two copies of the code and a check (the same results)."""

    branch_free_math = True

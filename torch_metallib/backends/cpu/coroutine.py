"""Each thread of a cooperative kernel as an LLVM coroutine (ARCHITECTURE.md, "Rules").

A thread that reaches a barrier or a SIMD-group collective has to wait for the others.
Instead of giving every thread a stack of its own and switching stacks, the per-thread
entry is a switch-resumed LLVM coroutine: LLVM's coroutine passes (part of the O3
pipeline) split the kernel at each wait and keep only what is live across it in a frame
that the runtime (csrc/cpu/cooperative.cpp) places next to its SIMD-group neighbours'.
This is the continuation-based synchronization of PoCL and AdaptiveCpp, with LLVM doing
the splitting.

It happens in two steps, because a suspension point must be in the coroutine itself:

1. The intrinsic definitions (air/collectives.py, their waits spelled by
   target.Coroutines) call the runtime, which returns whether the thread must wait; where
   it must they call the marker ``@tm.suspend()``. Everything is inlined into the thread entry (``thread_entry``) by LLVM's always-inliner.
2. ``split_at_suspends`` replaces each marker by an ``llvm.coro.suspend`` and numbers the
   exchange call sites, which are now distinct calls. It also moves thread memory that
   inlining left outside the entry block (a callee's allocation whose size was a call's
   result until folded: Metal 4's tensor descriptors) into the entry block, and drops the
   stack save and restore around it: LLVM keeps only entry-block allocations in the
   frame, and anything on the stack is gone when a thread resumes.
"""

import re
from typing import Dict, List

from ...reflection.ir_model import LABEL, function, opcode, retarget_phis
from ...errors import UnsupportedKernelError

__all__ = ["SUSPEND", "SITE_PLACEHOLDER", "thread_entry", "split_at_suspends"]

SUSPEND = "call void @tm.suspend()"  # "wait here until the runtime resumes this thread"
SITE_PLACEHOLDER = "i32 0"  # the exchange's site id, set by split_at_suspends


_DECLARATIONS = """
declare token @llvm.coro.id(i32, ptr, ptr, ptr)
declare i1 @llvm.coro.alloc(token)
declare i64 @llvm.coro.size.i64()
declare ptr @llvm.coro.begin(token, ptr)
declare i8 @llvm.coro.suspend(token, i1)
declare ptr @llvm.coro.free(token, ptr)
declare void @llvm.coro.end(ptr, i1, token)
declare ptr @tm_rt_frame(i64)
declare void @tm_rt_finished()
declare void @tm.suspend()
"""

_MARKER = re.compile(r"^\s*(?:tail |notail )?call void @tm\.suspend\(\)")
_EXCHANGE_SITE = re.compile(r"(@tm_rt_simd_(?:exchange|stage)\(.*), " + SITE_PLACEHOLDER + r"\)")
_BARRIER_SITE = "@tm_rt_barrier(" + SITE_PLACEHOLDER + ")"
_DYNAMIC_ALLOCA = re.compile(r"= alloca [^,]+, i\d+ %")
_STACK = re.compile(r"@llvm\.stack(save|restore)")


def thread_entry(name: str, lines: List[str]) -> str:
    """``ptr @<name>(ptr args, ptr dims, i32 group, i32 thread)``: a coroutine running
    `lines` (which call the kernel), returning its frame (the runtime resumes it through the
    frame's first word)."""
    body = "\n  ".join(lines)
    return f"""{_DECLARATIONS}
define ptr @{name}(ptr %args, ptr %dims, i32 %g32, i32 %t32) presplitcoroutine {{
entry:
  %coro.id = call token @llvm.coro.id(i32 64, ptr null, ptr null, ptr null)
  %coro.need = call i1 @llvm.coro.alloc(token %coro.id)
  br i1 %coro.need, label %coro.alloc, label %coro.begin
coro.alloc:
  %coro.size = call i64 @llvm.coro.size.i64()
  %coro.memory = call ptr @tm_rt_frame(i64 %coro.size)
  br label %coro.begin
coro.begin:
  %coro.frame = phi ptr [ null, %entry ], [ %coro.memory, %coro.alloc ]
  %coro.handle = call ptr @llvm.coro.begin(token %coro.id, ptr %coro.frame)
  {body}
  call void @tm_rt_finished()
  br label %coro.cleanup
coro.cleanup:
  %coro.unused = call ptr @llvm.coro.free(token %coro.id, ptr %coro.handle)
  br label %coro.end
coro.end:
  call void @llvm.coro.end(ptr %coro.handle, i1 false, token none)
  ret ptr %coro.handle
}}
"""


def split_at_suspends(text: str, entry: str, kernel: str) -> str:
    """The printed module `text`, after inlining, with every ``@tm.suspend()`` marker in
    the coroutine `entry` a suspension point, and every exchange and barrier call site numbered."""
    lines = text.split("\n")
    found = function(lines, entry)
    start, end = found.start, found.end
    outside = lines[:start] + lines[end:]
    if any(_MARKER.match(line) for line in outside):
        raise UnsupportedKernelError(
            f"{kernel}: a function the kernel calls waits at a barrier or SIMD-group function but "
            f"could not be inlined (it is recursive), which the CPU backend needs. "
            f"Run it on a Mac with MPS tensors")
    body: List[str] = []
    hoisted: List[str] = []
    moved: Dict[str, str] = {}  # block -> the block its terminator now ends
    block, suspends, sites, barriers = "entry", 0, 0, 0
    for line in found.body:
        label = LABEL.match(line)
        if label:
            block = label.group(1)
        elif opcode(line) == "alloca" and block != "entry":
            if _DYNAMIC_ALLOCA.search(line):
                raise UnsupportedKernelError(
                    f"{kernel}: allocates thread memory of a size known only at run time, which the CPU "
                    f"backend cannot keep across a barrier or SIMD-group function. Run it on a Mac with MPS tensors")
            hoisted.append(line)
            continue
        elif _STACK.search(line):
            continue  # around allocations now in the entry block
        elif _MARKER.match(line):
            suspends += 1
            resume = f"tm.resume.{suspends}"
            body += [f"  %tm.wait.{suspends} = call i8 @llvm.coro.suspend(token none, i1 false)",
                     f"  switch i8 %tm.wait.{suspends}, label %coro.end [ i8 0, label %{resume} "
                     f"i8 1, label %coro.cleanup ]",
                     f"{resume}:"]
            moved[block] = resume
            continue
        elif "@tm_rt_simd_exchange(" in line or "@tm_rt_simd_stage(" in line:
            sites += 1
            line = _EXCHANGE_SITE.sub(rf"\1, i32 {sites})", line)
        elif _BARRIER_SITE in line:
            barriers += 1
            line = line.replace(_BARRIER_SITE, f"@tm_rt_barrier(i32 {barriers})")
        body.append(line)
    body = retarget_phis(body, moved)
    entry_at = body.index("entry:") + 1
    body[entry_at:entry_at] = hoisted
    return "\n".join(lines[:start + 1] + body + lines[end:])

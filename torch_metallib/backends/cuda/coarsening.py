"""Grid-only kernels on CUDA: each CUDA thread runs COARSENING consecutive grid positions.

MLX's elementwise kernels (``v_``/``vv_``/``vs_``... and the copies) do one element per
thread with 4-byte accesses: on an H200 ``vv_Add`` ran at 0.76x torch's speed and
``v_Exp`` at 0.59x, while ``vn_Exp`` (the same math on 2 consecutive elements per thread,
merged into vector accesses) reached 0.88x. A kernel that cannot tell how its grid is
cut into threadgroups (the runtime's ``grid_only``: no threadgroup memory, barriers or
SIMD-group functions, only grid builtins) may equally run several grid positions in one
CUDA thread: its entry calls the kernel for x = 4t, 4t+1, 4t+2, 4t+3, straight-line
where all four are in the grid, one by one at the grid's edge. After O3 the copies'
accesses to one buffer are runs off one pointer, which vector_accesses.py versions on
their alignment and NVPTX's LoadStoreVectorizer merges into 16-byte accesses.

Merging copy 1's load above copy 0's store needs to know that they touch different
memory. Metal's compiler says so of a kernel's buffers (``"air-buffer-no-alias"``, and
scopes that LLVM's inliner makes distinct for each inlined copy), so the entry's pointer
parameters for such buffers are ``noalias``: two copies that touched one location, one of
them writing, would be two Metal threads racing. Within one buffer, BasicAA tells the
copies' constant offsets apart itself.

Only kernels whose one-position code is straight-line after O3 are coarsened (ptx.py:
with branches between the copies, as in libdevice's sin or erf or MLX's ``vn_`` bounds
checks, their accesses do not merge, and four scalar accesses per thread only spread a
warp's accesses over more sectors), and of those only where the copies' accesses do form
runs; never kernels with atomics (threads may meet there on purpose) or global
constructors (run once per thread).
"""

import re
from typing import List, Set

from ...reflection.ir_model import function

__all__ = ["COARSENING", "coarsened_entry", "coarsenable", "no_alias_buffers"]

COARSENING = 4  # consecutive grid positions (along x) per CUDA thread
_ATOMIC = re.compile(r"\b(?:atomicrmw|cmpxchg)\b|@llvm\.nvvm\.atomic")
_METADATA_ID = re.compile(r"^!(\d+) = ", re.M)


def coarsenable(text: str, constructors: List[str], arguments) -> bool:
    """Whether a grid-only kernel (the lowered module `text`, its global `constructors`,
    its `arguments`) may run several grid positions per thread: no atomics or constructors,
    and its grid position, where it takes one, a scalar (MLX's contiguous kernels; its
    ``g2_``/``g3_`` kernels index strided memory from a vector position, where coarsening
    along x forms no runs)."""
    return (not constructors and not _ATOMIC.search(text)
            and all(a.components == 1 for a in arguments if a.builtin == "thread_position_in_grid"))


def no_alias_buffers(text: str, kernel: str) -> Set[int]:
    """Positions of `kernel`'s parameters that Metal's compiler marked ``"air-buffer-no-alias"``."""
    found = function(text.split("\n"), kernel)
    if found is None:
        return set()
    return {i for i, p in enumerate(found.parameters()) if '"air-buffer-no-alias"' in p}


def coarsened_entry(entry: str, thread: str, arguments: str, no_alias: Set[int], text: str) -> str:
    """The ``ptx_kernel`` `entry` (parameters `arguments`): `thread` (the module's function of
    one Metal thread, its x position the last parameter) called for COARSENING consecutive
    x positions per CUDA thread; the buffers at positions `no_alias` are ``noalias``. `text`
    is the module so far (for free metadata numbers)."""
    parameters = re.sub(r"ptr addrspace\(1\) %p(\d+)",
                        lambda m: m.group(0) if int(m.group(1)) not in no_alias else
                        f"ptr addrspace(1) noalias %p{m.group(1)}", arguments)
    loop = max((int(n) for n in _METADATA_ID.findall(text)), default=0) + 1
    calls = []
    for k in range(COARSENING):
        if k:
            calls.append(f"%x{k} = add nuw i32 %x0, {k}")
        calls.append(f"call void @{thread}({arguments}, i32 %x{k})")
    whole = "\n  ".join(calls)
    return f"""
define ptx_kernel void @{entry}({parameters}) {{
entry:
  %tx = call i32 @llvm.nvvm.read.ptx.sreg.tid.x()
  %cx = call i32 @llvm.nvvm.read.ptx.sreg.ctaid.x()
  %gx = add i32 %cx, %base.x
  %ox = mul i32 %gx, %group.x
  %thread = add i32 %ox, %tx
  %x0 = mul nuw i32 %thread, {COARSENING}
  %whole.n = udiv i32 %grid.x, {COARSENING}
  %all4 = icmp ult i32 %thread, %whole.n
  br i1 %all4, label %whole, label %edge
whole:
  {whole}
  ret void
edge:  ; the grid's last, partial run: x0 < grid.x (threads < ceil(grid.x / COARSENING))
  %left = sub i32 %grid.x, %x0
  br label %edge.loop
edge.loop:
  %j = phi i32 [ 0, %edge ], [ %j.next, %edge.body ]
  %more = icmp ult i32 %j, %left
  br i1 %more, label %edge.body, label %done
edge.body:
  %xj = add nuw i32 %x0, %j
  call void @{thread}({arguments}, i32 %xj)
  %j.next = add nuw i32 %j, 1
  br label %edge.loop, !llvm.loop !{loop}
done:
  ret void
}}
!{loop} = distinct !{{!{loop}, !{loop + 1}}}
!{loop + 1} = !{{!"llvm.loop.unroll.disable"}}
"""

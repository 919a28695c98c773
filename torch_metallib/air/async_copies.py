"""SIMD-group asynchronous copies between device and threadgroup memory (MFA's GEMM and
attention kernels load their tiles with them; docs/formats.md, AIR).

``air.simdgroup_async_copy_2d`` takes (element size, alignment, destination, its elements
per row, its element step, its tile (width, height), source, the same three, an offset and
a clamp mode) and returns an event; ``air.wait_simdgroup_events(count, events)`` waits for
events. Here the SIMD-group meets at the copy (an exchange without values, so no lane is
still reading the old tile), its leading lane copies at once (tm_rt_async_copy_2d in
csrc/cpu/async_copy.cpp), and every lane gets a non-null event; waiting is a no-op. Only
the zero offset and the clamp modes 0 and 1 (what Metal's simdgroup_event::async_copy
passes) are known: a call site with anything else is refused before compiling.
"""

import re
from typing import List, Optional, Tuple

from .collectives import _definition, _exchange
from .target import Target
from ..errors import UnsupportedKernelError

__all__ = ["define_async_copy", "check_async_copy_calls"]

_COPY_2D = "declare void @tm_rt_async_copy_2d(i64, ptr, i64, i64, i64, i64, ptr, i64, i64, i64, i64, i32)"
_PARAMS_2D = ["i64", "i64", None, "i64", "i64", "<2 x i64>", None, "i64", "i64", "<2 x i64>", "<2 x i64>", "i32"]
_CALL_2D = re.compile(r"call ptr @air\.simdgroup_async_copy_2d\.[\w.]+\((.*)\)")
_KNOWN_TAIL = re.compile(r"<2 x i64> zeroinitializer, i32 [01]$")


def _copy(args: List[str]) -> List[str]:
    """Lines copying with tm_rt_async_copy_2d, only in the leading lane."""
    return ["br i1 %leads, label %copy, label %done", "copy:"] + args + ["br label %done", "done:",
                                                                         "%r = inttoptr i64 1 to ptr"]


def define_async_copy(ret: str, name: str, params: List[str], target: Target) -> Optional[Tuple[str, List[str]]]:
    if name == "air.wait_simdgroup_events" and params == ["i32", "ptr"]:
        return "define internal void @air.wait_simdgroup_events(i32 %n, ptr %events) alwaysinline {\n  ret void\n}", []
    if ret != "ptr":
        return None
    if name.startswith("air.simdgroup_async_copy_1d.") and len(params) == 5 and params[4] == "i64":
        call = ["%dst = addrspacecast " + params[2] + " %a2 to ptr", "%src = addrspacecast " + params[3] + " %a3 to ptr",
                "call void @tm_rt_async_copy_2d(i64 %a0, ptr %dst, i64 0, i64 1, i64 %a4, i64 1, "
                "ptr %src, i64 0, i64 1, i64 %a4, i64 1, i32 0)"]
        return _definition(ret, name, params, _exchange([], target) + _copy(call)), [_COPY_2D]
    if name.startswith("air.simdgroup_async_copy_2d.") and len(params) == len(_PARAMS_2D) and all(
            want is None or want == got for want, got in zip(_PARAMS_2D, params)):
        call = ["%dst = addrspacecast " + params[2] + " %a2 to ptr", "%src = addrspacecast " + params[6] + " %a6 to ptr",
                "%dw = extractelement <2 x i64> %a5, i32 0", "%dh = extractelement <2 x i64> %a5, i32 1",
                "%sw = extractelement <2 x i64> %a9, i32 0", "%sh = extractelement <2 x i64> %a9, i32 1",
                "call void @tm_rt_async_copy_2d(i64 %a0, ptr %dst, i64 %a3, i64 %a4, i64 %dw, i64 %dh, "
                "ptr %src, i64 %a7, i64 %a8, i64 %sw, i64 %sh, i32 %a11)"]
        return _definition(ret, name, params, _exchange([], target) + _copy(call)), [_COPY_2D]
    return None


def check_async_copy_calls(text: str, kernel: str) -> None:
    """Refuses 2-D copies with an offset or clamp mode whose meaning is not known."""
    for match in _CALL_2D.finditer(text):
        arguments = re.sub(r"\s+#\d+$", "", match.group(1)).strip()
        if not _KNOWN_TAIL.search(arguments):
            raise UnsupportedKernelError(
                f"{kernel}: a SIMD-group async copy with an offset or clamp mode the CPU backend does not "
                f"know ({arguments[-60:]}). Run it on a Mac with MPS tensors, or report the kernel")

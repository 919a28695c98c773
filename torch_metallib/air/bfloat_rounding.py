"""float -> bfloat rounding that is the same on every host: round to nearest even, with
subnormals kept and NaN kept quiet, as torch rounds.

LLVM lowers ``fptrunc float to bfloat`` to VCVTNEPS2BF16 where the CPU has AVX512-BF16,
and that instruction flushes subnormal inputs and results to zero; without it, to a call
(tm_rt_truncsfbf2) that keeps them. So a kernel's bfloat results depended on the machine.
Every such fptrunc (the kernel's own and those of the intrinsic definitions) becomes a
call of an integer-only helper here. A double operand is rounded to float first.
"""

import re
from typing import Dict

from ..reflection.ir_model import NAME

__all__ = ["round_bfloat_exactly"]

_FPTRUNC = re.compile(rf"^(\s*%{NAME} = )fptrunc (double|float|<(\d+) x (?:float|double)>) (.+?) to "
                      r"(bfloat|<\d+ x bfloat>)(.*)$", re.M)


def _helper(width: str) -> str:
    """@tm.round.bf16[.vN]: float (or <N x float>) -> bfloat, on the bits."""
    i32, f32 = (f"<{width} x i32>", f"<{width} x float>") if width else ("i32", "float")
    i16, bf = (f"<{width} x i16>", f"<{width} x bfloat>") if width else ("i16", "bfloat")
    i1 = f"<{width} x i1>" if width else "i1"
    c = lambda value: f"splat (i32 {value})" if width else str(value)  # noqa: E731
    name = f"tm.round.bf16{'.v' + width if width else ''}"
    lines = [f"%b = bitcast {f32} %x to {i32}", f"%abs = and {i32} %b, {c(0x7FFFFFFF)}",
             f"%nan = icmp ugt {i32} %abs, {c(0x7F800000)}", f"%hi = lshr {i32} %b, {c(16)}",
             f"%quiet = or {i32} %hi, {c(0x40)}", f"%odd = and {i32} %hi, {c(1)}",
             f"%bias = add {i32} %odd, {c(0x7FFF)}", f"%sum = add {i32} %b, %bias",
             f"%rounded = lshr {i32} %sum, {c(16)}", f"%pick = select {i1} %nan, {i32} %quiet, {i32} %rounded",
             f"%t = trunc {i32} %pick to {i16}", f"%r = bitcast {i16} %t to {bf}"]
    body = "\n  ".join(lines + [f"ret {bf} %r"])
    return f"define internal {bf} @{name}({f32} %x) alwaysinline {{\n  {body}\n}}"


def round_bfloat_exactly(text: str) -> str:
    helpers: Dict[str, str] = {}
    counter = [0]

    def replace(match) -> str:
        head, source, width, value, target, tail = match.groups()
        width = width or ""
        helpers.setdefault(width, _helper(width))
        f32 = f"<{width} x float>" if width else "float"
        callee = f"tm.round.bf16{'.v' + width if width else ''}"
        if "double" in source:
            counter[0] += 1
            narrow = f"%tm.bf.{counter[0]}"
            return (f"  {narrow} = fptrunc {source} {value} to {f32}\n"
                    f"{head}call {target} @{callee}({f32} {narrow}){tail}")
        return f"{head}call {target} @{callee}({f32} {value}){tail}"

    text = _FPTRUNC.sub(replace, text)
    return text + "\n" + "\n".join(helpers.values()) + "\n" if helpers else text

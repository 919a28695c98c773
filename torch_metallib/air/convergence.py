"""Convergent functions: what keeps LLVM from copying a barrier or a SIMD-group exchange
into branches, or moving it across one, on every backend.

LLVM may copy or move a call only where it cannot change which threads reach it together,
and it knows that only for calls it sees as ``convergent``. Apple's AIR declares barriers
and SIMD-group functions convergent, but the lowering replaces those declarations with
definitions (collectives.py), and InstCombine drops ``convergent`` from every call of a
function that is not convergent itself. SimplifyCFG then threads a test through the
barrier: ``if (lane == 0) ...; barrier; if (lane == 0) ...`` (PyTorch's layer_norm_looped)
becomes two copies of the barrier, one per path, and a warp's lanes wait at different
``bar.sync`` (aligned barriers: the kernel hangs on an NVIDIA GPU).

So, as clang does for CUDA: the waits themselves are declared convergent (the CPU runtime's
and the lane loops' markers here, NVVM's intrinsics by LLVM's own tables, listed in
WAITS), and every definition that reaches one, through any chain of calls, is marked
convergent (the kernel's entry too).
"""

import re
from typing import Dict

from ..reflection.ir_model import callee, functions

__all__ = ["mark_convergent", "WAITS"]

# Functions that make the threads of a group or SIMD-group meet: the CPU runtime's waits
# and exchanges (csrc/cpu/cooperative.cpp), the lane loops' markers (regions.py), NVVM's
# barriers, shuffles, votes and active masks. Declared convergent here or by LLVM.
WAITS = re.compile(r"tm_rt_(?:barrier|simd_exchange|simd_stage)|tm\.lanes\.\w+|"
                   r"llvm\.nvvm\.(?:barrier\w*|bar\.[\w.]+|shfl\.[\w.]+|vote\.[\w.]+|activemask|match\.[\w.]+)")
_DECLARE = re.compile(r"^declare [^\n]*?@([-\w$.]+)\([^\n]*$", re.M)
_GROUPS = re.compile(r"^attributes (#\d+) = \{([^\n]*)\}$", re.M)
_PARENS = re.compile(r"[()]")


def _has(attribute: str, attributes: str, groups: Dict[str, str]) -> bool:
    """Whether a function's `attributes` (inline, or by group: `groups`) include `attribute`."""
    return any(re.search(rf"\b{attribute}\b", part)
               for part in [attributes] + [groups.get(g, "") for g in re.findall(r"#\d+", attributes)])


def _function_attributes(header: str) -> str:
    """What follows the parameter list of a ``define`` or ``declare`` line."""
    depth = 0
    for paren in _PARENS.finditer(header, header.index("(", header.index("@"))):
        depth += 1 if paren.group() == "(" else -1
        if depth == 0:
            return header[paren.end():]
    return ""


def mark_convergent(text: str, nounwind: bool = False) -> str:
    """`text` with its waits (WAITS; LLVM's own intrinsics keep LLVM's attributes) declared
    convergent, and ``convergent`` (and ``nounwind`` where asked: targets without exceptions)
    on each definition that calls, directly or not, a wait or a convergent declaration."""
    groups = dict(_GROUPS.findall(text))
    lines = text.split("\n")  # edited line by line: one pass, not a search of the module per function
    declarations = {i: m for i, m in ((i, _DECLARE.match(line)) for i, line in enumerate(lines)
                                      if line.startswith("declare ")) if m}
    declared = {m.group(1): m.group(0) for m in declarations.values()}
    meets = {name for name, line in declared.items()
             if WAITS.fullmatch(name) or _has("convergent", _function_attributes(line), groups)}
    found = {f.name: f for f in functions(lines)}
    defined = {name: (f.header, set(filter(None, map(callee, f.body)))) for name, f in found.items()}
    changed = True
    while changed:  # to a fixed point: callers of functions that meet, meet
        changed = False
        for name, (_, callees) in defined.items():
            if name not in meets and (callees & meets or any(WAITS.fullmatch(c) for c in callees)):
                meets.add(name)
                changed = True

    def declaration(match) -> str:
        line = match.group(0)
        if not WAITS.fullmatch(match.group(1)) or match.group(1).startswith("llvm.") \
                or _has("convergent", _function_attributes(line), groups):
            return line
        return line + " convergent"

    for i, match in declarations.items():
        lines[i] = declaration(match)
    for name in meets & defined.keys():
        attributes = _function_attributes(defined[name][0])
        added = " ".join(a for a in ("convergent", "nounwind" if nounwind else None)
                         if a and not _has(a, attributes, groups))
        if added:
            pattern = re.compile(rf"^(define [^\n]*?@{re.escape(name)}\([^\n]*?)( #\d+)?( section \"[^\"]*\")? \{{$")
            start = found[name].start
            lines[start] = pattern.sub(lambda m: f"{m.group(1)} {added}{m.group(2) or ''}{m.group(3) or ''} {{",
                                       lines[start], count=1)
    return "\n".join(lines)

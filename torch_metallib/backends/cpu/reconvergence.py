"""Where a SIMD-group reconverges: an order of each function's SIMD-group call sites.

A SIMD-group's lanes may wait at different collectives at once: some inside a divergent
`if` (or still in a loop), others already past it. On Metal the lanes inside run first and
the SIMD-group reconverges after the `if`, so the collective past it acts over every lane.
The runtime (csrc/cpu/cooperative.cpp) only sees call sites; this pass gives each call of
an exchanging intrinsic a number, and when lanes wait at several sites and none can
proceed, the runtime completes the lowest first ("min-PC" scheduling).

The number is the position of the call's block in a weak topological order of the
function's control-flow graph (Bourdoncle 1993): a block before its successors except
along loop back edges, and every loop's blocks together before the loop's exits, so code
inside an `if` or a loop comes before the code that follows it. Numbers compare only
within one function (collectives in helpers that are not inlined are ordered within the
helper).
"""

import re
import sys
from typing import Dict, List, Set

from ...air.target import SITE_ORDER
from ...reflection.ir_model import CALLEE, blocks, edit_function_bodies, successors

__all__ = ["SITE_ORDER", "number_exchange_sites", "weak_topological_order"]

_EXCHANGING = re.compile(r"^define internal [^\n]*?@([-\w$.]+)\([^\n]*" + re.escape(SITE_ORDER) + r"\)", re.M)
_SLOTS_PER_BLOCK = 1024  # call sites numbered within a block (more share the last number)


def weak_topological_order(successors: Dict[str, List[str]], entry: str) -> List[str]:
    """Bourdoncle's recursive strategy, flattened: components (loops) stay contiguous."""
    dfn: Dict[str, float] = {name: 0 for name in successors}
    stack: List[str] = []
    counter = [0]

    def visit(v: str, partition: List[str]) -> float:
        stack.append(v)
        counter[0] += 1
        dfn[v] = head = counter[0]
        loop = False
        for w in successors[v]:
            low = visit(w, partition) if dfn[w] == 0 else dfn[w]
            if low <= head:
                head, loop = low, True
        if head == dfn[v]:
            dfn[v] = float("inf")
            element = stack.pop()
            if loop:
                while element != v:
                    dfn[element] = 0
                    element = stack.pop()
                component: List[str] = []
                for w in successors[v]:
                    if dfn[w] == 0:
                        visit(w, component)
                partition[:0] = [v] + component
            else:
                partition.insert(0, v)
        return head

    order: List[str] = []
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 4 * len(successors) + 1000))  # the depth is a path's length
    try:
        visit(entry, order)
    finally:
        sys.setrecursionlimit(limit)
    return order


def _call_with_order(line: str, names: Set[str], order: int) -> str:
    """`line` with ``i32 order`` appended to the arguments of its call to one of `names`."""
    match = CALLEE.search(line)
    if match is None or match.group(1) not in names:
        return line
    depth, at = 1, match.end()
    while depth:
        depth += {"(": 1, ")": -1}.get(line[at], 0)
        at += 1
    close = at - 1
    separator = "" if line[match.end():close].strip() == "" else ", "
    return f"{line[:close]}{separator}i32 {order}{line[close:]}"


def _number_sites(body: List[str], names: Set[str]) -> List[str]:
    if not any(f"@{name}(" in line for line in body for name in names):
        return body
    found = blocks(body)
    position = {name: index for index, name in enumerate(weak_topological_order(successors(found), next(iter(found))))}
    out: List[str] = []
    for name, block in found.items():
        if block.label is not None:
            out.append(block.label)
        base = position.get(name, len(position)) * _SLOTS_PER_BLOCK  # unreachable blocks last
        site = 0
        for line in block.lines:
            numbered = _call_with_order(line, names, base + site)
            if numbered is not line:
                site = min(site + 1, _SLOTS_PER_BLOCK - 1)
            out.append(numbered)
    return out


def number_exchange_sites(text: str) -> str:
    """Passes each call of an exchanging intrinsic (a definition ending in SITE_ORDER) its
    call site's order."""
    names = set(_EXCHANGING.findall(text))
    return edit_function_bodies(text, lambda body: _number_sites(body, names)) if names else text

"""Which lanes take part in a SIMD-group function, where the warp may not have reconverged.

On an Apple GPU a SIMD-group function runs with the lanes that reach it together: after a
loop whose trip count differs per lane, the SIMD-group has reconverged, and every lane that
has not returned takes part. A warp need not reconverge there: ``activemask()`` names the
lanes that happen to run together, and after such a loop that may be part of the warp
(PyTorch's ``radix_scan`` takes a prefix sum right after one; a lane missing from it would
be missing from every later lane's sum).

Where a call's block is *top-level* in the kernel, the lanes that take part are known
without asking the hardware: every lane of the warp that has not returned. Top-level means
the block is on no cycle, and a lane that leaves the blocks which can reach it can only go
on to return, meeting no barrier or SIMD-group function on the way. There the call is
renamed ``<name>.tm_converged`` and given, as its last operand, the vote of the warp's
lanes as the kernel started (``vote.ballot.sync``: it waits for every lane of that mask that
has not exited, so its result is exactly the lanes still running). Elsewhere the spelling
keeps ``activemask()`` (the lanes inside an ``if`` are the ones running it together).
"""

import re
from typing import Dict, List, Set

from ...air.intrinsics import parse_declaration
from ...reflection.ir_model import LABEL, blocks, function, predecessors, reachable_blocks, successors

__all__ = ["converge_top_level_collectives", "CONVERGED_SUFFIX", "MASK_PARAMETER"]

CONVERGED_SUFFIX = ".tm_converged"
MASK_PARAMETER = "%tm.mask.in"  # the mask operand's name in a .tm_converged definition
_COLLECTIVE = re.compile(r"@(air\.(?:simd|quad)_[-\w$.]+)\(")
# Calls that wait for other threads, or may (a function of the module's own).
_MEETS = re.compile(r"\bcall\b[^\n]*?@(?!llvm\.)(?!air\.(?!wg\.barrier|simdgroup\.barrier|simd_|quad_))[-\w$.]+\(")
_ENTRY_MASK = "%tm.entry.mask"
_DECLARATIONS = ["declare i32 @llvm.nvvm.activemask()", "declare i32 @llvm.nvvm.vote.ballot.sync(i32, i1)"]


def _top_level(graph: Dict[str, List[str]], meets: Set[str], block: str) -> bool:
    """Whether every lane of the warp that has not returned reaches `block` together (see
    the module's docstring); `meets`: the blocks that call a wait."""
    if block in reachable_blocks(graph, graph[block]):
        return False  # on a cycle: lanes may reach it a different number of times
    reaching = reachable_blocks(predecessors(graph), [block])  # the blocks that can reach it
    for name in reaching - {block}:
        for away in graph[name]:
            if away not in reaching and reachable_blocks(graph, [away]) & meets:
                return False
    return True


def _with_mask(line: str, at: int, mask: str) -> str:
    """The call `line` whose callee's name ends at `at` (its '('), with `mask` appended."""
    depth = 0
    for end in range(at, len(line)):
        depth += {"(": 1, ")": -1}.get(line[end], 0)
        if depth == 0:
            break
    operands = line[at + 1:end].strip()
    return f"{line[:end]}{', ' if operands else ''}i32 {mask}{line[end:]}"


def converge_top_level_collectives(text: str, kernel: str, is_collective) -> str:
    """`text` with the top-level SIMD-group calls of `kernel`'s body renamed and given the
    vote of the lanes still running. `is_collective(name)`: whether the warp spelling defines
    `name` (an exchange among the active lanes)."""
    lines = text.split("\n")
    defined = function(lines, kernel)
    if defined is None:
        return text
    body = defined.body
    found = blocks(body)
    graph = successors(found)
    meets = {name for name, block in found.items() if any(_MEETS.search(line) for line in block.lines)}
    renamed: Dict[str, str] = {}
    edited: List[str] = []
    entry = next(iter(found))
    counter = 0
    current = entry
    for line in body:
        label = LABEL.match(line)
        if label:
            current = label.group(1)
        call = _COLLECTIVE.search(line)
        if call and " call " in f" {line}" and is_collective(call.group(1)) and _top_level(graph, meets, current):
            name = call.group(1)
            mask = f"%tm.mask.{counter}"
            counter += 1
            renamed[name] = name + CONVERGED_SUFFIX
            edited.append(f"  {mask} = call i32 @llvm.nvvm.vote.ballot.sync(i32 {_ENTRY_MASK}, i1 true)")
            line = _with_mask(line, call.end() - 1, mask).replace(f"@{name}(", f"@{name}{CONVERGED_SUFFIX}(", 1)
        edited.append(line)
    if not renamed:
        return text
    # The warp's lanes as the kernel starts, where they all run together.
    first = 1 if found[entry].label is not None else 0
    edited.insert(first, f"  {_ENTRY_MASK} = call i32 @llvm.nvvm.activemask()")
    text = "\n".join(lines[:defined.start + 1] + edited + lines[defined.end:])
    declared = set(re.findall(r"^declare [^\n]*?@([-\w$.]+)\(", text, re.M))
    extra = [line for line in _DECLARATIONS if re.search(r"@([-\w$.]+)\(", line).group(1) not in declared]
    for line in re.findall(r"^declare [^\n]*$", text, re.M):
        parsed = parse_declaration(line)
        if parsed is not None and parsed[1] in renamed:
            ret, name, params = parsed
            extra.append(f"declare {ret} @{renamed[name]}({', '.join(params + ['i32'])}) convergent")
    return text + "\n" + "\n".join(extra) + "\n"

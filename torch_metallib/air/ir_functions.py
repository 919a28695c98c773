"""Editing the function bodies of a printed LLVM module: one function at a time, its
blocks, their successors, and the phis of blocks cut in two."""

import re
from typing import Callable, Dict, List, Optional, Tuple

__all__ = ["edit_function_bodies", "LABEL", "blocks", "successors", "retarget_phis"]

LABEL = re.compile(r'^([-\w$.]+|"[^"]*"):')
_SUCCESSOR = re.compile(r"label %([-\w$.]+|\"[^\"]*\")")


def edit_function_bodies(text: str, edit: Callable[[List[str]], List[str]]) -> str:
    """`text` with the lines of each definition's body (between ``define ... {`` and its
    closing ``}``, which LLVM prints alone on a line) replaced by ``edit(lines)``."""
    lines = text.split("\n")
    out: List[str] = []
    i = 0
    while i < len(lines):
        out.append(lines[i])
        i += 1
        if lines[i - 1].startswith("define ") and lines[i - 1].endswith("{"):
            end = lines.index("}", i)
            out += edit(lines[i:end])
            i = end
    return "\n".join(out)


def blocks(body: List[str]) -> Dict[str, Tuple[Optional[str], List[str]]]:
    """Block name -> (its label line, its other lines), in printed order, entry first (an
    entry block without a label is named '')."""
    found: Dict[str, Tuple[Optional[str], List[str]]] = {}
    current = None
    for line in body:
        label = LABEL.match(line)
        if label:
            current = label.group(1)
            found[current] = (line, [])
        else:
            if current is None:
                current = ""
                found[current] = (None, [])
            found[current][1].append(line)
    return found


def successors(found: Dict[str, Tuple[Optional[str], List[str]]]) -> Dict[str, List[str]]:
    """Block name -> the blocks its terminator branches to (from every line: a switch lists
    its cases on lines of their own)."""
    return {name: [s for line in lines for s in _SUCCESSOR.findall(line) if s in found]
            for name, (_, lines) in found.items()}


def retarget_phis(body: List[str], moved: Dict[str, str]) -> List[str]:
    """`body` with phi operands from a block in `moved` coming from the block its
    terminator moved to (where a block was cut in two)."""
    if not moved:
        return body

    def rename(match):
        return f", %{moved.get(match.group(1), match.group(1))} ]"
    return [re.sub(r", %([-\w$.]+|\"[^\"]*\") \]", rename, line) if " = phi " in line else line for line in body]

"""Editing the function bodies of a printed LLVM module, one function at a time."""

from typing import Callable, List

__all__ = ["edit_function_bodies"]


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

"""Checked execution: every device, constant and threadgroup memory access of a kernel
goes through a bounds check (ARCHITECTURE.md, "Rules"; README, Reliability).

A text pass over the AIR module puts a call before each ``load``, ``store``,
``atomicrmw``, ``cmpxchg`` and ``air.atomic.*`` call on an ``addrspace(1|2|3)`` pointer:
``@tm.check.N(pointer, bytes, origin, write)`` returns the pointer if the access lies inside
memory the call bound, and otherwise a scratch buffer (so the access cannot corrupt or
crash), recording the first violation for the launch to raise as KernelMemoryError.

`origin` is the kernel parameter the pointer derives from (through getelementptr, casts,
phi and select inside the kernel function), checked against exactly that argument's
extent; -1 where it cannot be told (pointers loaded from memory, or helper functions that
were not inlined), checked against every bound range of that address space and the
module's own constant and threadgroup globals (registered by ``__tm_init``).
"""

import re
from typing import Dict, List, Optional

from .ir_functions import edit_function_bodies

__all__ = ["instrument_accesses", "check_definitions", "static_ranges_init"]

# The check is declared free of memory effects (it only records a violation, which the
# kernel never reads) so that it goes where its access goes: an access the optimizer
# removes (a load whose value the function constants made unused) is not reported.
CHECK_DECLARATIONS = ["declare ptr @tm_rt_check(ptr, i64, i32, i32) nounwind willreturn memory(none)", "declare void @tm_rt_check_thread(i32, i32, i32)",
                      "declare void @tm_rt_check_static(ptr, i64, i32)"]

_SPACES = (1, 2, 3)
_LOAD = re.compile(r"^(\s*%[-\w.$]+ = load (?:atomic )?(?:volatile )?)(.+?), ptr addrspace\(([123])\) (.+?)(, align \d+.*|, !.*|)$")
_STORE = re.compile(r"^(\s*store (?:atomic )?(?:volatile )?)(.+?) (\S+|<[^>]*>), ptr addrspace\(([123])\) (.+?)(, align \d+.*|, !.*|)$")
_RMW = re.compile(r"^(\s*%[-\w.$]+ = (?:atomicrmw|cmpxchg) (?:weak )?(?:volatile )?(?:\w+ )?)ptr addrspace\(([123])\) ([^,]+)(, (\S+) .*)$")
_ATOMIC_CALL = re.compile(r"^(\s*(?:%[-\w.$]+ = )?(?:tail )?call (\S+) @air\.atomic\.[\w.]+\()ptr addrspace\(([123])\)"
                          r"((?: [a-z]+(?:\([^)]*\))?)*) (%[-\w.$]+)(.*)$")
_GEP_BASE = re.compile(r"^getelementptr (?:inbounds |nuw |nusw |inrange\(\d+, ?\d+\) )*[^,]+, ptr addrspace\(\d\) (%[-\w.$]+)")
_CAST = re.compile(r"^(?:addrspacecast|bitcast) ptr(?: addrspace\(\d\))? (%[-\w.$]+) to ")
_PHI_VALUES = re.compile(r"\[ (%[-\w.$]+|null|undef|poison), %[-\w.$\"]+ \]")
_SELECT = re.compile(r"^select [^,]+, ptr(?: addrspace\(\d\))? (%[-\w.$]+), ptr(?: addrspace\(\d\))? (%[-\w.$]+)")
_ASSIGN = re.compile(r"^\s*(%[-\w.$]+) = (.*)$")


def _size(type_text: str) -> str:
    """The store size of `type_text` as an LLVM constant expression."""
    return f"ptrtoint (ptr getelementptr ({type_text}, ptr null, i32 1) to i64)"


class _Provenance:
    """Which kernel parameter a pointer in the kernel function derives from."""

    def __init__(self, parameters: Dict[str, int], body: List[str]):
        self.parameters = parameters
        self.definitions = {}
        for line in body:
            match = _ASSIGN.match(line)
            if match:
                self.definitions[match.group(1)] = match.group(2)

    def origin(self, value: str, depth: int = 0) -> int:
        if value in self.parameters:
            return self.parameters[value]
        code = self.definitions.get(value)
        if code is None or depth > 64:
            return -1
        for pattern in (_GEP_BASE, _CAST):
            match = pattern.match(code)
            if match:
                return self.origin(match.group(1), depth + 1)
        if code.startswith("phi "):
            incoming = [v for v in _PHI_VALUES.findall(code) if v.startswith("%")]
            return self._same([self.origin(v, depth + 1) if v != value else -2 for v in incoming])
        match = _SELECT.match(code)
        if match:
            return self._same([self.origin(match.group(1), depth + 1), self.origin(match.group(2), depth + 1)])
        return -1

    @staticmethod
    def _same(origins: List[int]) -> int:
        known = {o for o in origins if o != -2}  # -2: the phi itself (a loop)
        return known.pop() if len(known) == 1 else -1


def _parameters(define_line: str) -> Dict[str, int]:
    """Names of a definition's pointer parameters -> their positions."""
    inside = define_line[define_line.index("(", define_line.index("@")) + 1:define_line.rindex(")")]
    names, depth, start, position = {}, 0, 0, 0
    parts = []
    for i, ch in enumerate(inside):
        depth += ch in "(<[{"
        depth -= ch in ")>]}"
        if ch == "," and depth == 0:
            parts.append(inside[start:i])
            start = i + 1
    parts.append(inside[start:])
    for position, part in enumerate(parts):
        match = re.search(r"(%[-\w.$]+)\s*$", part.strip())
        if match and part.strip().startswith("ptr"):
            names[match.group(1)] = position
    return names


def instrument_accesses(text: str, kernel: str) -> str:
    """`text` with every memory access in address spaces 1-3 checked (see the module doc)."""
    counter = [0]
    kernel_header = re.compile(rf"^define [^\n]*@{re.escape(kernel)}\(")
    headers = iter([line for line in text.split("\n") if line.startswith("define ") and line.endswith("{")])

    def edit(body: List[str]) -> List[str]:
        header = next(headers)
        provenance = _Provenance(_parameters(header), body) if kernel_header.match(header) else None
        out = []
        for line in body:
            checked = _instrument(line, provenance, counter)
            out += [line] if checked is None else checked
        return out

    return edit_function_bodies(text, edit)


def _check(space: str, pointer: str, size: str, write: bool, provenance: Optional[_Provenance], counter) -> tuple:
    counter[0] += 1
    name = f"%tm.chk{counter[0]}"
    origin = provenance.origin(pointer) if provenance is not None and pointer.startswith("%") else -1
    return name, (f"  {name} = call ptr addrspace({space}) @tm.check.{space}(ptr addrspace({space}) {pointer}, "
                  f"i64 {size}, i32 {origin}, i32 {int(write)})")


def _instrument(line: str, provenance, counter) -> Optional[List[str]]:
    match = _LOAD.match(line)
    if match:
        head, type_text, space, pointer, tail = match.groups()
        name, call = _check(space, pointer, _size(type_text), False, provenance, counter)
        return [call, f"{head}{type_text}, ptr addrspace({space}) {name}{tail}"]
    match = _STORE.match(line)
    if match:
        head, type_text, value, space, pointer, tail = match.groups()
        name, call = _check(space, pointer, _size(type_text), True, provenance, counter)
        return [call, f"{head}{type_text} {value}, ptr addrspace({space}) {name}{tail}"]
    match = _RMW.match(line)
    if match:
        head, space, pointer, tail, type_text = match.groups()
        name, call = _check(space, pointer, _size(type_text), True, provenance, counter)
        return [call, f"{head}ptr addrspace({space}) {name}{tail}"]
    match = _ATOMIC_CALL.match(line)
    if match:
        head, _, space, attributes, pointer, tail = match.groups()
        size = "8" if re.search(r"\.[iuf]64\b|\.i64\(", line) else "4"
        name, call = _check(space, pointer, size, True, provenance, counter)
        return [call, f"{head}ptr addrspace({space}){attributes} {name}{tail}"]
    return None


def check_definitions() -> str:
    """Definitions of @tm.check.N: the runtime's check, in each address space."""
    out = []
    for space in _SPACES:
        out.append(f"""define internal ptr addrspace({space}) @tm.check.{space}(ptr addrspace({space}) %p, i64 %n, i32 %origin, i32 %write) alwaysinline {{
  %raw = addrspacecast ptr addrspace({space}) %p to ptr
  %flags = or i32 %write, {space << 8}
  %ok = call ptr @tm_rt_check(ptr %raw, i64 %n, i32 %origin, i32 %flags)
  %back = addrspacecast ptr %ok to ptr addrspace({space})
  ret ptr addrspace({space}) %back
}}""")
    return "\n".join(out) + "\n" + "\n".join(CHECK_DECLARATIONS) + "\n"


_GLOBAL = re.compile(r"^(@[-\w.$]+|@\"[^\"]+\") = [^\n]*?addrspace\(([23])\) (?:externally_initialized )?"
                     r"(?:global|constant) ([^\n]*)$", re.M)


def _leading_type(text: str) -> str:
    """The LLVM type at the start of `text` (brackets balanced)."""
    if text[:1] not in "[{<":
        return text.split(" ", 1)[0]
    depth = 0
    for i, ch in enumerate(text):
        depth += ch in "[{<"
        depth -= ch in "]}>"
        if depth == 0:
            return text[:i + 1]
    return text


def static_ranges_init(text: str) -> List[str]:
    """Lines for __tm_init registering the module's constant and threadgroup globals, which
    unattributed pointers may point into."""
    lines = []
    for name, space, rest in _GLOBAL.findall(text):
        if 'section "air.fc_initializer"' in rest:
            continue
        lines.append(f"  call void @tm_rt_check_static(ptr addrspacecast (ptr addrspace({space}) {name} to ptr), "
                     f"i64 {_size(_leading_type(rest))}, i32 {space})")
    return lines

"""Buffers that hold a pointer: arguments whose buffer the kernel only reads one pointer
from, at its start, and then reaches memory through that pointer. Mojo passes every
pointer argument so (``air.arg_type_name "void"``, no size), the device address in the
buffer's first 8 bytes; the binding plan binds a tensor there by writing its address into
an 8-byte buffer (docs/guide/writing.md, "Kernels from Mojo").

Only the kernel's own body is read: a buffer passed on to another function, stored, or
read at another offset or as anything but a pointer is an ordinary buffer. Apple's
compiler declares every buffer's element size, so its kernels are never candidates and
their reflection does not read function bodies.
"""

import re
from typing import Dict, List, Optional, Sequence, Set, Tuple

from .air_arguments import Argument
from . import ir_model
from .ir_model import DEFINITION, LOCAL, NAME

__all__ = ["mark_pointer_arguments"]

_SPACES = {"1": "device", "2": "constant", "3": "threadgroup"}
_POINTER = r"ptr(?: addrspace\((\d+)\))?"
# %x = load ptr addrspace(N), ptr addrspace(M) %param[, align 8]
_LOAD_POINTER = re.compile(rf"^\s*(%{NAME}) = load (?:volatile )?{_POINTER}, {_POINTER} (%{NAME})\b")
_LOAD = re.compile(rf"^\s*%{NAME} = load (?:atomic )?(?:volatile )?([^,]+), {_POINTER} (%{NAME})\b")
_STORE = re.compile(rf"^\s*store (?:atomic )?(?:volatile )?(.+?) (?:%{NAME}|[-\w.]+), {_POINTER} "
                    rf"(%{NAME})\b")
# A cast of a pointer, or an offset of zero: the same address.
_CAST = re.compile(rf"^\s*(%{NAME}) = (?:(?:bitcast|addrspacecast) {_POINTER} (%{NAME}) to "
                   rf"|getelementptr (?:inbounds )?[^,]+, {_POINTER} (%{NAME}), i\d+ 0$)")
_COMPARE = re.compile(rf"^\s*%{NAME} = icmp ")
_DERIVED = re.compile(rf"^\s*(%{NAME}) = (?:getelementptr|bitcast|addrspacecast|select|phi)\b")
# air.atomic.*(ptr addrspace(N) %p, T value, ...): T is what it reads and writes.
_ATOMIC = re.compile(rf"@air\.atomic\.[\w.]+\({_POINTER} (%{NAME}), ([^ ,]+) ")


def mark_pointer_arguments(text: str, function: str, arguments: Sequence[Argument]) -> Tuple[Argument, ...]:
    """`arguments` with ``holds_pointer`` (and what is known of the pointee) set on the
    buffers of `function` (in the printed module `text`) that only hold a pointer."""
    candidates = [a for a in arguments if a.kind == "buffer" and a.address_space in ("device", "constant")
                  and a.type_size is None and a.buffer_size is None]
    if not candidates:
        return tuple(arguments)
    lines = text.split("\n")
    found = ir_model.function(lines, function)
    if found is None:
        return tuple(arguments)
    names = [part.split()[-1] if part.strip() else "" for part in ir_model.parameters(found.header)]
    marked = {}
    for argument in candidates:
        if argument.position < len(names):
            held = _held_pointer(found.body, names[argument.position])
            if held is not None:
                marked[argument.position] = argument._replace(holds_pointer=True, pointee_address_space=held[0],
                                                              pointee_type=held[1], pointee_access=held[2])
    return tuple(marked.get(a.position, a) for a in arguments)


def _operands(line: str) -> List[str]:
    """The local values `line` uses (not the one it defines)."""
    defined = DEFINITION.match(line)
    return LOCAL.findall(line, defined.end() if defined else 0)


def _held_pointer(body: List[str], parameter: str) -> Optional[Tuple[str, Optional[str], str]]:
    """(the pointee's address space, the one type read or written through it or None, the
    access there: _pointee)
    when `parameter` (or a cast of it, as LLVM upgrades typed pointers) is only loaded
    from, as a pointer at its start; else None."""
    aliases, loaded, spaces = {parameter}, set(), set()
    for line in body:
        used = aliases.intersection(_operands(line))
        if not used:
            continue
        cast = _CAST.match(line)
        if cast and (cast.group(3) or cast.group(5)) in aliases:
            aliases.add(cast.group(1))
            continue
        match = _LOAD_POINTER.match(line)
        if match is None or match.group(4) not in aliases or len(used) > 1:
            return None
        loaded.add(match.group(1))
        spaces.add(_SPACES.get(match.group(2) or "0", "generic"))
    if not loaded or len(spaces) != 1:
        return None
    return (spaces.pop(), *_pointee(body, loaded))


def _pointee(body: List[str], pointers: Set[str]) -> Tuple[Optional[str], str]:
    """(the one type the kernel loads, stores or updates atomically through `pointers` and
    the pointers derived from them (offsets, casts, selects, phis), None if none or
    several; "read", "write" or "read_write": what it does there). A derived pointer used
    otherwise (passed to a function, stored, made an integer) counts as read and written."""
    derived = set(pointers)
    for _ in range(2):  # a phi can name a pointer defined further down
        for line in body:
            match = _DERIVED.match(line)
            if match and derived.intersection(_operands(line)):
                derived.add(match.group(1))
    types: Dict[str, None] = {}
    reads = writes = False
    for line in body:
        used = derived.intersection(_operands(line))
        if not used or _DERIVED.match(line) or _COMPARE.match(line):
            continue
        load, store, atomic = _LOAD.match(line), _STORE.match(line), _ATOMIC.search(line)
        if load and load.group(3) in derived and used == {load.group(3)}:
            types[load.group(1)] = None
            reads = True
        elif store and store.group(3) in derived and used == {store.group(3)}:
            types[store.group(1)] = None
            writes = True
        elif atomic and atomic.group(2) in derived and used == {atomic.group(2)}:
            types[atomic.group(3)] = None
            reads = writes = True
        else:  # escapes: what happens there is not known
            reads = writes = True
    access = "read_write" if reads and writes else "write" if writes else "read"
    return (next(iter(types)) if len(types) == 1 else None), access

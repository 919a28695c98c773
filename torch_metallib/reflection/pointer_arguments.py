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

__all__ = ["mark_pointer_arguments"]

_SPACES = {"1": "device", "2": "constant", "3": "threadgroup"}
_NAME = r'(?:[-\w$.]+|"[^"]*")'  # a local value as LLVM prints it, bare or quoted
_LOCAL = re.compile(rf'(?<![-\w$."])%{_NAME}')
_POINTER = r"ptr(?: addrspace\((\d+)\))?"
# %x = load ptr addrspace(N), ptr addrspace(M) %param[, align 8]
_LOAD_POINTER = re.compile(rf"^\s*(%{_NAME}) = load (?:volatile )?{_POINTER}, {_POINTER} (%{_NAME})\b")
_LOAD = re.compile(rf"^\s*%{_NAME} = load (?:atomic )?(?:volatile )?([^,]+), {_POINTER} (%{_NAME})\b")
_STORE = re.compile(rf"^\s*store (?:atomic )?(?:volatile )?(.+?) (?:%{_NAME}|[-\w.]+), {_POINTER} "
                    rf"(%{_NAME})\b")
# A cast of a pointer, or an offset of zero: the same address.
_CAST = re.compile(rf"^\s*(%{_NAME}) = (?:(?:bitcast|addrspacecast) {_POINTER} (%{_NAME}) to "
                   rf"|getelementptr (?:inbounds )?[^,]+, {_POINTER} (%{_NAME}), i\d+ 0$)")
_DEFINES = re.compile(rf"^\s*%{_NAME} = ")
_COMPARE = re.compile(rf"^\s*%{_NAME} = icmp ")
_DERIVED = re.compile(rf"^\s*(%{_NAME}) = (?:getelementptr|bitcast|addrspacecast|select|phi)\b")
# air.atomic.*(ptr addrspace(N) %p, T value, ...): T is what it reads and writes.
_ATOMIC = re.compile(rf"@air\.atomic\.[\w.]+\({_POINTER} (%{_NAME}), ([^ ,]+) ")


def mark_pointer_arguments(text: str, function: str, arguments: Sequence[Argument]) -> Tuple[Argument, ...]:
    """`arguments` with ``holds_pointer`` (and what is known of the pointee) set on the
    buffers of `function` (in the printed module `text`) that only hold a pointer."""
    candidates = [a for a in arguments if a.kind == "buffer" and a.address_space in ("device", "constant")
                  and a.type_size is None and a.buffer_size is None]
    if not candidates:
        return tuple(arguments)
    found = _definition(text, function)
    if found is None:
        return tuple(arguments)
    header, body = found
    names = _parameter_names(header)
    marked = {}
    for argument in candidates:
        if argument.position < len(names):
            held = _held_pointer(body, names[argument.position])
            if held is not None:
                marked[argument.position] = argument._replace(holds_pointer=True, pointee_address_space=held[0],
                                                              pointee_type=held[1], pointee_access=held[2])
    return tuple(marked.get(a.position, a) for a in arguments)


def _operands(line: str) -> List[str]:
    """The local values `line` uses (not the one it defines)."""
    defined = _DEFINES.match(line)
    return _LOCAL.findall(line, defined.end() if defined else 0)


def _definition(text: str, function: str) -> Optional[Tuple[str, List[str]]]:
    """(the header line, the body's lines) of the definition of @`function`."""
    match = re.search(rf'^define [^\n]*@(?:{re.escape(function)}|"{re.escape(function)}")\(', text, re.M)
    if match is None:
        return None
    header_end = text.index("\n", match.start())
    end = text.find("\n}", header_end)
    return text[match.start():header_end], text[header_end + 1:end if end >= 0 else len(text)].split("\n")


def _parameter_names(header: str) -> List[str]:
    """Each parameter's name (its last word), the list split at commas outside brackets."""
    opened = header.index("(", header.index("@"))
    names, depth, start = [], 0, opened + 1
    for i in range(opened, len(header)):
        character = header[i]
        if character in "(<[{":
            depth += 1
        elif character in ")>]}":
            depth -= 1
        if (character == "," and depth == 1) or depth == 0:
            names.append(header[start:i].split()[-1] if header[start:i].strip() else "")
            start = i + 1
            if depth == 0:
                break
    return names


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

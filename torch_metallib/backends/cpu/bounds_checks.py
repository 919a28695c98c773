"""Checked execution: every device, constant and threadgroup memory access of a kernel
goes through a bounds check (ARCHITECTURE.md, "Rules"; docs/reliability.md).

A text pass over the AIR module puts a call before each ``load``, ``store``,
``atomicrmw``, ``cmpxchg`` and ``air.atomic.*`` call on an ``addrspace(1|2|3)`` pointer:
``@tm.check.N(pointer, bytes, origin, write)`` returns the pointer if the access lies inside
memory the call bound, and otherwise a scratch buffer (so the access cannot corrupt or
crash), recording the first violation for the launch to raise as KernelMemoryError. The
common case, an access inside its own argument, is an inline compare against the launch's
bounds table; the runtime is called only when that fails or cannot tell.

Threadgroup memory is also checked for reads of bytes no thread of the threadgroup has
written in this launch (what compute-sanitizer's initcheck does): each store, atomic and
load in ``addrspace(3)`` also marks or checks a shadow of its bytes in the runtime
(csrc/cpu/threadgroup_initcheck.cpp), cleared when a threadgroup starts. A call that hands
threadgroup memory to code the pass cannot see (SIMD-group matrix stores, async copies,
memcpy, tensor operations) counts as writing all of it for the rest of the threadgroup, so
a correct kernel is never reported.

`origin` is the kernel parameter the pointer derives from (through getelementptr, casts,
phi and select inside the kernel function), checked against exactly that argument's
extent; -1 where it cannot be told (pointers loaded from memory, or helper functions that
were not inlined), checked against every bound range of that address space and the
module's own constant and threadgroup globals (registered by ``__tm_init``).
"""

import re
from typing import Dict, List, Optional, Tuple

from ...reflection.ir_model import NAME, edit_functions

__all__ = ["instrument_accesses", "check_definitions", "static_ranges_init"]

# The check is declared free of memory effects (it only records a violation, which the
# kernel never reads) so that it goes where its access goes: an access the optimizer
# removes (a load whose value the function constants made unused) is not reported.
# The context (bounds_check.h) is constant while a launch runs on the thread, hence
# memory(none) and invariant loads: both are hoisted out of the launcher's thread loops.
CHECK_DECLARATIONS = ["declare ptr @tm_rt_check(ptr, i64, i32, i32, i32, i32, i32) nounwind willreturn memory(none)",
                      "declare ptr @tm_rt_check_context() nounwind willreturn memory(none)",
                      "declare void @tm_rt_check_static(ptr, i64, i32, ptr)",
                      # Threadgroup initcheck (see the module doc). The read check returns its
                      # pointer and only reads the shadow, so it goes where its load goes (a
                      # load the optimizer removes is not reported); barriers order them all.
                      "declare ptr @tm_rt_tg_read(ptr, i64, i32, i32, i32) nounwind willreturn "
                      "memory(inaccessiblemem: read)",
                      "declare void @tm_rt_tg_write(ptr, i64, i32, i32, i32) nounwind willreturn "
                      "memory(inaccessiblemem: readwrite)",
                      "declare void @tm_rt_tg_unseen(i32, i32, i32) nounwind willreturn "
                      "memory(inaccessiblemem: readwrite)",
                      "!tm.check.empty = !{!9000001}", "!9000001 = !{}"]

_SPACES = (1, 2, 3)
_LOAD = re.compile(rf"^(\s*%{NAME} = load (?:atomic )?(?:volatile )?)(.+?), ptr addrspace\(([123])\) (.+?)(, align \d+.*|, !.*|)$")
_STORE = re.compile(r"^(\s*store (?:atomic )?(?:volatile )?)(.+?) (\S+|<[^>]*>), ptr addrspace\(([123])\) (.+?)(, align \d+.*|, !.*|)$")
_RMW = re.compile(rf"^(\s*%{NAME} = (?:atomicrmw|cmpxchg) (?:weak )?(?:volatile )?(?:\w+ )?)ptr addrspace\(([123])\) ([^,]+)(, (\S+) .*)$")
_ATOMIC_CALL = re.compile(rf"^(\s*(?:%{NAME} = )?(?:tail )?call (\S+) @air\.atomic\.[\w.]+\()ptr addrspace\(([123])\)"
                          rf"((?: [a-z]+(?:\([^)]*\))?)*) (%{NAME})(.*)$")
_NAME = rf"(%{NAME}|@{NAME})"
_GEP_BASE = re.compile(r"^getelementptr (?:inbounds |nuw |nusw |inrange\(\d+, ?\d+\) )*[^,]+, ptr addrspace\(\d\) " + _NAME)
_CAST = re.compile(r"^(?:addrspacecast|bitcast) ptr(?: addrspace\(\d\))? " + _NAME + " to ")
_PHI_VALUES = re.compile(rf"\[ (%{NAME}|@{NAME}|null|undef|poison), %{NAME} \]")
_SELECT = re.compile(r"^select [^,]+, ptr(?: addrspace\(\d\))? " + _NAME + r", ptr(?: addrspace\(\d\))? " + _NAME)
_LOOP = -2  # an origin that depends only on itself (a pointer stepped around a loop)
_ASSIGN = re.compile(rf"^\s*(%{NAME}) = (.*)$")


def _size(type_text: str) -> str:
    """The store size of `type_text` as an LLVM constant expression."""
    return f"ptrtoint (ptr getelementptr ({type_text}, ptr null, i32 1) to i64)"


class _Provenance:
    """Which kernel parameter (its position) or module global (its name) a pointer in a
    function derives from; -1 where it cannot be told."""

    def __init__(self, parameters: Dict[str, int], body: List[str], statics: Dict[str, tuple]):
        self.parameters = parameters
        self.statics = statics
        self.known = {}
        self.definitions = {}
        for line in body:
            match = _ASSIGN.match(line)
            if match:
                self.definitions[match.group(1)] = match.group(2)

    def origin(self, value: str):
        if value not in self.known:
            found = self._origin(value, set())
            self.known[value] = -1 if found == _LOOP else found
        return self.known[value]

    def _origin(self, value: str, visiting: set):
        if value in self.parameters:
            return self.parameters[value]
        if value in self.statics:
            return value
        code = self.definitions.get(value)
        if code is None or len(visiting) > 256:
            return -1
        if value in visiting:  # around a loop: the other incoming values decide
            return _LOOP
        visiting.add(value)
        try:
            for pattern in (_GEP_BASE, _CAST):
                match = pattern.match(code)
                if match:
                    return self._origin(match.group(1), visiting)
            if code.startswith("phi "):
                incoming = [v for v in _PHI_VALUES.findall(code) if v[0] in "%@"]
                return self._same([self._origin(v, visiting) for v in incoming])
            match = _SELECT.match(code)
            if match:
                return self._same([self._origin(match.group(1), visiting), self._origin(match.group(2), visiting)])
            return -1
        finally:
            visiting.discard(value)

    @staticmethod
    def _same(origins: list):
        known = {o for o in origins if o != _LOOP}
        if not known:
            return _LOOP
        return known.pop() if len(known) == 1 else -1


def _parameters(function) -> Dict[str, int]:
    """Names of a definition's pointer parameters -> their positions."""
    names = {}
    for position, part in enumerate(function.parameters()):
        match = re.search(rf"(%{NAME})\s*$", part.strip())
        if match and part.strip().startswith("ptr"):
            names[match.group(1)] = position
    return names


# Checked kernels take the thread's position in grid as three trailing parameters (the
# launchers pass them), so that checks name the thread without a store per thread.
THREAD_PARAMETERS = ("%tm.px", "%tm.py", "%tm.pz")
_NO_THREAD = "i32 -1, i32 0, i32 0"  # helpers: the runtime reads the context's thread


def instrument_accesses(text: str, kernel: str, initcheck: bool = True) -> Tuple[str, bool]:
    """`text` with every memory access in address spaces 1-3 checked (see the module doc;
    threadgroup reads also for unwritten bytes, with `initcheck`) and the kernel given
    THREAD_PARAMETERS; and whether functions other than the kernel were checked too (their
    checks read the thread from the context, which the launcher then has to keep current)."""
    counter = [0]
    helpers_checked = [False]
    kernel_header = re.compile(rf"^define [^\n]*@{re.escape(kernel)}\(")
    statics = _statics(text)
    declared = set(_DECLARED.findall(text))

    def edit(function) -> List[str]:
        is_kernel = bool(kernel_header.match(function.header))
        provenance = _Provenance(_parameters(function) if is_kernel else {}, function.body, statics)
        thread = ", ".join(f"i32 {name}" for name in THREAD_PARAMETERS) if is_kernel else _NO_THREAD
        out = []
        for line in function.body:
            checked = _instrument(line, provenance, counter, thread, initcheck)
            if checked is None and initcheck:
                checked = _unseen_threadgroup_writes(line, declared, thread)
            helpers_checked[0] |= checked is not None and not is_kernel
            out += [line] if checked is None else checked
        return out

    text = edit_functions(text, edit)
    return _with_thread_parameters(text, kernel_header), helpers_checked[0]


_DECLARED = re.compile(r"^declare [^\n]*?@([-\w$.]+)\(", re.M)
_CALLEE = re.compile(r"\bcall [^@]*@([-\w$.]+)\(")


def _unseen_threadgroup_writes(line: str, declared: set, thread: str) -> Optional[List[str]]:
    """A call handing threadgroup memory to code the pass cannot see (an intrinsic other than
    the atomics: SIMD-group matrix stores, async copies, memcpy, tensor operations): after it,
    every byte of threadgroup memory counts as written for the rest of the threadgroup."""
    if "ptr addrspace(3)" not in line:
        return None
    match = _CALLEE.search(line)
    if match is None or match.group(1) not in declared:
        return None
    return [line, f"  call void @tm_rt_tg_unseen({thread})"]


def _with_thread_parameters(text: str, kernel_header) -> str:
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if kernel_header.match(line) and line.endswith("{"):
            close = _parameter_list_end(line)
            extra = ", ".join(f"i32 {name}" for name in THREAD_PARAMETERS)
            separator = "" if line[close - 1] == "(" else ", "
            lines[i] = line[:close] + separator + extra + line[close:]
    return "\n".join(lines)


def _parameter_list_end(define_line: str) -> int:
    """Index of the ')' closing a definition's parameter list."""
    depth = 0
    for i in range(define_line.index("(", define_line.index("@")), len(define_line)):
        depth += define_line[i] in "(<[{"
        depth -= define_line[i] in ")>]}"
        if depth == 0:
            return i
    raise ValueError(f"unbalanced definition: {define_line[:120]}")


def _check(space: str, pointer: str, size: str, write: bool, provenance: _Provenance, counter,
           thread: str) -> tuple:
    counter[0] += 1
    name = f"%tm.chk{counter[0]}"
    value = pointer.split(" ")[-1]  # past attributes such as nonnull
    origin = provenance.origin(value)
    if isinstance(origin, str):  # a module global: compared with its own address and size
        global_space, type_text = provenance.statics[origin]
        if global_space == space:
            return name, (f"  {name} = call ptr addrspace({space}) @tm.check.static.{space}(ptr addrspace({space}) "
                          f"{pointer}, i64 {size}, ptr addrspace({space}) {origin}, i64 {_size(type_text)}, "
                          f"i32 {int(write)}, {thread})")
        origin = -1
    return name, (f"  {name} = call ptr addrspace({space}) @tm.check.{space}(ptr addrspace({space}) {pointer}, "
                  f"i64 {size}, i32 {origin}, i32 {int(write)}, {thread})")


def _written(space: str, name: str, size: str, thread: str, initcheck: bool) -> List[str]:
    """Threadgroup initcheck: marks [name, name + size) written (nothing for other spaces)."""
    if space != "3" or not initcheck:
        return []
    return [f"  call void @tm.tg.write(ptr addrspace(3) {name}, i64 {size}, {thread})"]


def _instrument(line: str, provenance, counter, thread: str, initcheck: bool) -> Optional[List[str]]:
    match = _LOAD.match(line)
    if match:
        head, type_text, space, pointer, tail = match.groups()
        name, call = _check(space, pointer, _size(type_text), False, provenance, counter, thread)
        if space != "3" or not initcheck:
            return [call, f"{head}{type_text}, ptr addrspace({space}) {name}{tail}"]
        read = f"{name}.read"  # threadgroup initcheck: the bytes must have been written
        return [call, f"  {read} = call ptr addrspace(3) @tm.tg.read(ptr addrspace(3) {name}, i64 "
                      f"{_size(type_text)}, {thread})", f"{head}{type_text}, ptr addrspace(3) {read}{tail}"]
    match = _STORE.match(line)
    if match:
        head, type_text, value, space, pointer, tail = match.groups()
        name, call = _check(space, pointer, _size(type_text), True, provenance, counter, thread)
        return [call, *_written(space, name, _size(type_text), thread, initcheck),
                f"{head}{type_text} {value}, ptr addrspace({space}) {name}{tail}"]
    match = _RMW.match(line)
    if match:  # an atomic on threadgroup memory counts as writing it (it may be what initializes it)
        head, space, pointer, tail, type_text = match.groups()
        name, call = _check(space, pointer, _size(type_text), True, provenance, counter, thread)
        return [call, *_written(space, name, _size(type_text), thread, initcheck),
                f"{head}ptr addrspace({space}) {name}{tail}"]
    match = _ATOMIC_CALL.match(line)
    if match:
        head, _, space, attributes, pointer, tail = match.groups()
        size = "8" if re.search(r"\.[iuf]64\b|\.i64\(", line) else "4"
        name, call = _check(space, pointer, size, True, provenance, counter, thread)
        return [call, *_written(space, name, size, thread, initcheck), f"{head}ptr addrspace({space}){attributes} {name}{tail}"]
    return None


def _inside(space: int) -> str:
    """Given %p, %n, %start and %bytes: on to %pass (returns %p) if [p, p + n) lies in
    [start, start + bytes), else to %runtime."""
    return f"""  %address = ptrtoint ptr addrspace({space}) %p to i64
  %offset = sub i64 %address, %start
  %room = sub i64 %bytes, %n
  %fits = icmp ule i64 %n, %bytes
  %inside = icmp ule i64 %offset, %room
  %ok = and i1 %fits, %inside
  br i1 %ok, label %pass, label %runtime, !prof !9000002
pass:
  ret ptr addrspace({space}) %p
"""


def check_definitions() -> str:
    """Definitions of @tm.check.N, in each address space: an access attributed to argument
    `origin` is compared inline with the launch's bounds for it (start, bytes); the runtime
    call decides the rest (unattributed pointers, failures) and records failures. And of
    @tm.check.static.N, for pointers into a module global: compared with the global."""
    out = []
    for space in _SPACES:
        out.append(f"""define internal ptr addrspace({space}) @tm.check.static.{space}(ptr addrspace({space}) %p, i64 %n, ptr addrspace({space}) %base, i64 %bytes, i32 %write, i32 %x, i32 %y, i32 %z) alwaysinline {{
entry:
  %start = ptrtoint ptr addrspace({space}) %base to i64
{_inside(space)}runtime:
  %checked = call ptr addrspace({space}) @tm.check.{space}(ptr addrspace({space}) %p, i64 %n, i32 -1, i32 %write, i32 %x, i32 %y, i32 %z)
  ret ptr addrspace({space}) %checked
}}""")
        out.append(f"""define internal ptr addrspace({space}) @tm.check.{space}(ptr addrspace({space}) %p, i64 %n, i32 %origin, i32 %write, i32 %x, i32 %y, i32 %z) alwaysinline {{
entry:
  %known = icmp sge i32 %origin, 0
  br i1 %known, label %inline, label %runtime
inline:
  %ctx = call ptr @tm_rt_check_context()
  %table.at = getelementptr inbounds i8, ptr %ctx, i64 16
  %table = load ptr, ptr %table.at, align 8, !invariant.load !9000001
  %o = zext i32 %origin to i64
  %start.at = getelementptr inbounds [2 x i64], ptr %table, i64 %o, i64 0
  %bytes.at = getelementptr inbounds [2 x i64], ptr %table, i64 %o, i64 1
  %start = load i64, ptr %start.at, align 8, !invariant.load !9000001
  %bytes = load i64, ptr %bytes.at, align 8, !invariant.load !9000001
{_inside(space)}runtime:
  %raw = addrspacecast ptr addrspace({space}) %p to ptr
  %flags = or i32 %write, {space << 8}
  %checked = call ptr @tm_rt_check(ptr %raw, i64 %n, i32 %origin, i32 %flags, i32 %x, i32 %y, i32 %z)
  %back = addrspacecast ptr %checked to ptr addrspace({space})
  ret ptr addrspace({space}) %back
}}""")
    out.append(_THREADGROUP_DEFINITIONS)
    return "\n".join(out) + "\n" + "\n".join(CHECK_DECLARATIONS) + '\n!9000002 = !{!"branch_weights", i32 1048576, i32 1}\n'


_THREADGROUP_DEFINITIONS = """define internal ptr addrspace(3) @tm.tg.read(ptr addrspace(3) %p, i64 %n, i32 %x, i32 %y, i32 %z) alwaysinline {
entry:
  %raw = addrspacecast ptr addrspace(3) %p to ptr
  %read = call ptr @tm_rt_tg_read(ptr %raw, i64 %n, i32 %x, i32 %y, i32 %z)
  %back = addrspacecast ptr %read to ptr addrspace(3)
  ret ptr addrspace(3) %back
}
define internal void @tm.tg.write(ptr addrspace(3) %p, i64 %n, i32 %x, i32 %y, i32 %z) alwaysinline {
entry:
  %raw = addrspacecast ptr addrspace(3) %p to ptr
  call void @tm_rt_tg_write(ptr %raw, i64 %n, i32 %x, i32 %y, i32 %z)
  ret void
}"""

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


def _statics(text: str) -> Dict[str, tuple]:
    """The module's constant and threadgroup globals: name -> (address space, type)."""
    return {name: (space, _leading_type(rest)) for name, space, rest in _GLOBAL.findall(text)
            if 'section "air.fc_initializer"' not in rest}


def static_ranges_init(text: str) -> Tuple[List[str], str]:
    """Lines for __tm_init registering the module's constant and threadgroup globals, which
    unattributed pointers may point into, with their names for messages; and the module's
    globals holding those names."""
    lines, names = [], []
    for i, (name, (space, type_text)) in enumerate(_statics(text).items()):
        shown = _variable_name(name).encode()
        escaped = "".join(chr(b) if 32 <= b < 127 and b not in (34, 92) else f"\\{b:02X}" for b in shown)
        names.append(f'@tm.static.name.{i} = private unnamed_addr constant [{len(shown) + 1} x i8] c"{escaped}\\00"')
        lines.append(f"  call void @tm_rt_check_static(ptr addrspacecast (ptr addrspace({space}) {name} to ptr), "
                     f"i64 {_size(type_text)}, i32 {space}, ptr @tm.static.name.{i})")
    return lines, "\n".join(names) + "\n"


_LOCAL_NAME = re.compile(r"E(\d+)(\w+)$")


def _variable_name(symbol: str) -> str:
    """A global's name as the source spells it: MSL's function-local threadgroup arrays are
    mangled (``_ZZ...E10max_scores`` -> ``max_scores``); others keep their symbol."""
    bare = symbol.lstrip("@").strip('"')
    match = _LOCAL_NAME.search(bare)
    if match and len(match.group(2)) == int(match.group(1)):
        return match.group(2)
    return bare

"""Refusing a kernel that would read a constant-address-space global nothing defined.

After specialize_constants, every global in address space 2 that a kernel reads must have a
value: an initializer, or a store by the module's ``air.static_init`` constructors (which
copy the ``MTL_FC_INIT`` placeholders into the globals the kernel reads). Two ways one can
be left ``undef``: a placeholder that specialization did not recognise (its type or form),
or an internal global that no constructor stores. Either would be computed with as
whatever the host memory holds, so the kernel is refused instead, naming the global.
"""

import re
from typing import Dict, List, Set

from ..errors import UnsupportedKernelError
from ..reflection.ir_model import functions

__all__ = ["check_constant_globals"]

# `@name = ... addrspace(2) [externally_initialized] global|constant T undef|poison[, ...]`
_UNDEFINED = re.compile(r'^@([-\w$.]+) = [^\n]*?addrspace\(2\) (?:externally_initialized )?(?:global|constant) '
                        r'([^\n]+?) (?:undef|poison)(?:,[^\n]*)?$', re.M)
_NAME = re.compile(r"@([-\w$.]+)")


def _bodies(text: str) -> Dict[str, List[str]]:
    """Function name -> the lines of its body."""
    return {found.name: found.body for found in functions(text.split("\n"))}


def _constructor_closure(bodies: Dict[str, List[str]], constructors: List[str]) -> Set[str]:
    """The constructors and every function they call."""
    found, todo = set(), [name for name in constructors if name in bodies]
    while todo:
        name = todo.pop()
        if name not in found:
            found.add(name)
            todo += [callee for line in bodies[name] for callee in _NAME.findall(line)
                     if callee in bodies and callee not in found]
    return found


def check_constant_globals(text: str, kernel: str, constructors: List[str]) -> None:
    """UnsupportedKernelError where `kernel`'s module (specialized, its constructors
    `constructors` taken out of llvm.global_ctors) reads an address-space-2 global whose
    value nothing defines."""
    undefined = {m.group(1): m.group(2) for m in _UNDEFINED.finditer(text)}
    if not undefined:
        return
    bodies = _bodies(text)
    init = _constructor_closure(bodies, constructors)
    written, read = set(), set()
    for name, lines in bodies.items():
        for line in lines:
            mentioned = undefined.keys() & set(_NAME.findall(line))
            if not mentioned:
                continue
            if name in init and " = load " not in line:
                written |= mentioned  # a store, or an element address or call that stores
            placeholders = {g for g in mentioned if ".MTL_FC_INIT_" in g}
            read |= placeholders | (mentioned if name not in init else set())
    missing = sorted(read - written)
    placeholders = [name for name in missing if ".MTL_FC_INIT_" in name]
    if placeholders:
        raise UnsupportedKernelError(
            f"{kernel}: reads the function-constant placeholder {_listed(placeholders)}, which was not given the "
            f"caller's value; expected a scalar placeholder (internal or linkonce_odr, externally_initialized "
            f"constant T undef, section \"air.fc_initializer\"), got {_typed(placeholders, undefined)}. Its value "
            f"would be undefined, so the kernel is not run; report the kernel and the toolchain that built it")
    if missing:
        raise UnsupportedKernelError(
            f"{kernel}: reads the constant-address-space global {_listed(missing)}, which nothing initializes; "
            f"expected an initializer or a store by an air.static_init constructor (function constants are copied "
            f"so), got {_typed(missing, undefined)} and no store. Its value would be undefined, so the kernel is "
            f"not run; report the kernel and the toolchain that built it")


def _listed(names: List[str]) -> str:
    return ", ".join(f"@{name}" for name in names)


def _typed(names: List[str], undefined: Dict[str, str]) -> str:
    return ", ".join(f"{undefined[name]} undef" for name in names)

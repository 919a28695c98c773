"""Function-constant specialization, the same for every target: each ``MTL_FC_INIT_<index>_<type>``
placeholder gets its value, ``air.is_function_constant_defined`` is defined from the
constants set, and the ``air.static_init`` constructors that copy them into the globals a
kernel reads are taken out of ``llvm.global_ctors`` for the backend to call
(constant_globals.py then refuses a global left without a value).
"""

import re
import struct
from typing import Dict

from ..errors import UnsupportedKernelError

__all__ = ["constant_literal", "specialize_constants", "take_constructors"]

# A placeholder is internal in Apple's kernels; public AIR dumps also show it linkonce_odr
# hidden (local_unnamed_addr), and it must be specialized the same either way.
_FC_INIT = re.compile(r'^(@[-\w$.]+\.MTL_FC_INIT_(\d+)_\w+) = ((?:(?:internal|private|linkonce_odr|weak_odr|'
                      r'linkonce|weak|external|hidden|protected|dso_local|unnamed_addr|local_unnamed_addr) )*)'
                      r'addrspace\(2\) externally_initialized constant (\w+) undef, section "air.fc_initializer"(.*)$',
                      re.M)
_IS_DEFINED = re.compile(r"^declare i1 @air\.is_function_constant_defined\(ptr addrspace\(2\)[^\n]*$", re.M)
_CTORS = re.compile(r"^@llvm\.global_ctors = appending global \[\d+ x [^\]]*\] (.*)$", re.M)


def constant_literal(ir_type: str, value) -> str:
    """`value` as an LLVM constant of `ir_type` (bool is i8 in AIR's placeholders)."""
    if ir_type.startswith("i"):
        bits = int(ir_type[1:])
        wrapped = int(value) & ((1 << bits) - 1)  # two's complement, as the GPU stores it
        return str(wrapped - (1 << bits) if wrapped >> (bits - 1) and bits > 1 else wrapped)
    if ir_type == "float":
        return "0x%016X" % struct.unpack("<Q", struct.pack("<d", struct.unpack("<f", struct.pack("<f", value))[0]))[0]
    if ir_type == "double":
        return "0x%016X" % struct.unpack("<Q", struct.pack("<d", value))[0]
    if ir_type == "half":
        return "0xH%04X" % struct.unpack("<H", struct.pack("<e", value))[0]
    if ir_type == "bfloat":
        bits = struct.unpack("<I", struct.pack("<f", value))[0]
        return "0xR%04X" % ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16)
    raise UnsupportedKernelError(f"function constant of LLVM type {ir_type} is not supported on the CPU")


def specialize_constants(text: str, values: Dict[int, object]) -> str:
    """Gives each constant's placeholder its value (an optional constant that was not set
    reads as 0) and defines air.is_function_constant_defined: the placeholders of the
    constants set. A placeholder whose address is compared keeps its own address (no
    unnamed_addr unless it had it); each becomes internal (a definition, not exported)."""
    defined = []
    def replace(match):
        index, ir_type = int(match.group(2)), match.group(4)
        if index in values:
            defined.append(match.group(1))
        unnamed = [word for word in match.group(3).split() if word.endswith("unnamed_addr")]
        return f"{match.group(1)} = {' '.join(['internal'] + unnamed)} addrspace(2) constant {ir_type} " \
               f"{constant_literal(ir_type, values.get(index, 0))}{match.group(5)}"
    text = _FC_INIT.sub(replace, text)
    tests = [f"%d{i} = icmp eq ptr addrspace(2) %p, {name}" for i, name in enumerate(defined)]
    result = "false"
    for i in range(len(defined)):
        tests.append(f"%any{i} = or i1 {result}, %d{i}")
        result = f"%any{i}"
    body = "\n  ".join(tests + [f"ret i1 {result}"])
    definition = f"define internal i1 @air.is_function_constant_defined(ptr addrspace(2) %p) alwaysinline {{\n  {body}\n}}"
    return _IS_DEFINED.sub(lambda _: definition, text)


def take_constructors(text: str):
    """Empties llvm.global_ctors; returns (text, constructor names)."""
    match = _CTORS.search(text)
    if match is None:
        return text, []
    names = re.findall(r"ptr @([-\w$.]+)", match.group(1))
    return text[:match.start()] + "@llvm.global_ctors = appending global [0 x { i32, ptr, ptr }] zeroinitializer" \
        + text[match.end():], names

"""Struct arguments packed at the offsets the kernel's reflection gives."""

import struct
from typing import Dict

_FORMATS = {("int", 4): "i", ("uint", 4): "I", ("float", 4): "f", ("bool", 1): "?", ("long", 8): "q",
            ("ulong", 8): "Q", ("uint", 8): "Q", ("int", 8): "q", ("half", 2): "e", ("char", 1): "b",
            ("uchar", 1): "B", ("short", 2): "h", ("ushort", 2): "H"}


def _format(type_name: str, size: int) -> str:
    # idx_T members reflect as ``uint`` or ``ulong`` (``uint64_t``): the size decides.
    base = type_name.split("::")[-1].replace("_t", "").replace("uint64", "ulong").replace("uint32", "uint")
    if (base, size) in _FORMATS:
        return _FORMATS[(base, size)]
    return {1: "B", 2: "H", 4: "I", 8: "Q"}[size] if base.startswith("u") else {1: "b", 2: "h", 4: "i", 8: "q"}[size]


def pack(argument, values: Dict[str, object]) -> bytes:
    """`argument`'s struct with `values` by member name (arrays as sequences, zero-padded;
    ``metal::array`` members as sequences too); members not named are zero."""
    out = bytearray(argument.type_size)
    for field in argument.struct_fields:
        if field.name not in values:
            continue
        value = values[field.name]
        inner = field
        if field.fields and field.type_name == "metal::array":
            inner = field.fields[0]  # ``__elems``: its size is one element's
            count, elem = inner.array_length, inner.size
        else:
            count = field.array_length or 1
            elem = field.size // count
            # Some reflections give an array member's element size (``int Q_strides[3]``:
            # size 4, array_length 3, next member 12 bytes on): a size the count does not
            # divide into whole elements of the named type is one element's.
            known = {"int": 4, "uint": 4, "float": 4, "half": 2, "short": 2, "ushort": 2, "long": 8, "ulong": 8}
            if count > 1 and field.size == known.get(field.type_name):
                elem = field.size
        fmt = _format(inner.type_name, elem)
        items = list(value) if isinstance(value, (list, tuple)) else [value]
        items = items + [0] * (count - len(items))
        struct.pack_into("<" + fmt * count, out, field.offset + (inner.offset if inner is not field else 0), *items)
    return bytes(out)


def argument(function, name: str):
    return next(a for a in function.arguments if a.name == name)

"""The LLVM IR text that vector lanes (vectorize.py) read: operands, types and their sizes,
metadata, and the allocations a region's lanes may keep interleaved."""

import re
from typing import Dict, List, Optional, Tuple

from ...reflection import ir_model
from ...reflection.ir_model import LOCAL, split_operands

__all__ = ["NotVector", "SCALAR", "FLAGS", "ELEMENTWISE", "PER_LANE", "split_operands", "typed", "scalar_bytes",
           "mangled", "strip_metadata", "indexed_type", "type_size", "leaf_type", "scalar_count", "indexed",
           "only_accessed_as", "array_elements"]

SCALAR = re.compile(r"^(?:i\d+|half|bfloat|float|double|ptr(?: addrspace\(\d+\))?)$")
FLAGS = {"nuw", "nsw", "exact", "disjoint", "samesign", "nneg", "inbounds", "nusw", "fast", "nnan", "ninf", "nsz",
         "arcp", "contract", "afn", "reassoc", "tail", "notail"}
# LLVM intrinsics defined element by element: their vector forms give each lane the scalar result.
ELEMENTWISE = {"umin", "umax", "smin", "smax", "abs", "fabs", "fma", "fmuladd", "minnum", "maxnum", "minimum",
               "maximum", "copysign", "floor", "ceil", "trunc", "rint", "nearbyint", "round", "roundeven", "sqrt",
               "ctpop", "ctlz", "cttz", "bswap", "bitreverse", "fshl", "fshr", "uadd.sat", "usub.sat", "sadd.sat",
               "ssub.sat", "ushl.sat", "sshl.sat"}
# Pure math intrinsics a lane calls on its own (their vector forms may call other routines).
PER_LANE = {"exp", "exp2", "exp10", "log", "log2", "log10", "pow", "powi", "sin", "cos", "tan", "asin", "acos",
            "atan", "atan2", "sinh", "cosh", "tanh", "ldexp", "frexp", "lround", "llround", "lrint", "llrint"}
_ATTACHMENT = re.compile(r", ![A-Za-z]")  # metadata attachments follow the operands
_BYTES = {"half": 2, "bfloat": 2, "float": 4, "double": 8}


class NotVector(Exception):
    """The region does something vector lanes do not take: it stays a lane loop."""


def typed(operand: str) -> Tuple[str, str]:
    """(type, value) of a typed operand (``i32 %x``, ``ptr addrspace(1) %p``, ``ptr nonnull
    align 4 %p``: parameter attributes dropped)."""
    match = re.match(r"^(ptr addrspace\(\d+\)|[<\[{][^ ]*(?: x [^ ]+)?|[^ ]+) (.*)$", operand)
    if not match:
        raise NotVector(f"an operand not read: {operand}")
    type_name, value = match.group(1), match.group(2)
    if type_name.startswith(("<", "[", "{")):
        depth, end = 0, 0
        for i, c in enumerate(operand):
            depth += c in "<[{("
            depth -= c in ">]})"
            if depth == 0:
                end = i + 1
                break
        type_name, value = operand[:end], operand[end:].strip()
    value = re.sub(r"^(?:(?:noundef|nonnull|immarg|noalias|nocapture|readonly|writeonly|signext|zeroext|"
                   r"align \d+|captures\([^)]*\)|dereferenceable(?:_or_null)?\(\d+\)) )+", "", value)
    return type_name, value


def scalar_bytes(type_name: str) -> int:
    if type_name.startswith("ptr"):
        return 8
    if type_name in _BYTES:
        return _BYTES[type_name]
    return max(int(type_name[1:]) // 8, 1)


def mangled(type_name: str) -> str:
    """The suffix an intrinsic's name gives a type (``f32``, ``i64``, ``p1``)."""
    if type_name.startswith("ptr"):
        space = re.search(r"addrspace\((\d+)\)", type_name)
        return f"p{space.group(1) if space else 0}"
    return {"half": "f16", "bfloat": "bf16", "float": "f32", "double": "f64"}.get(type_name, type_name)


def strip_metadata(line: str) -> str:
    """An instruction without its metadata attachments (``, !tbaa !3``)."""
    found = _ATTACHMENT.search(line)
    return line[:found.start()] if found else line


def indexed_type(source: str, indices: List[str], types: Dict[str, str]) -> Optional[str]:
    """The type a getelementptr over `source` reaches through `indices` after the first
    (constants into structs), named types resolved; None where it cannot tell."""
    current = source.strip()
    for index in indices:
        current = types.get(current, current).strip()
        array = re.fullmatch(r"\[(\d+) x (.+)\]", current)
        if array:
            current = array.group(2)
        elif current.startswith("{") and index.isdigit():
            fields = split_operands(current[1:-1])
            if int(index) >= len(fields):
                return None
            current = fields[int(index)]
        else:
            return None
    return types.get(current, current).strip()


def type_size(type_name: Optional[str], types: Dict[str, str]) -> Optional[int]:
    """Bytes of a scalar, an array of them, or a context element ``{ T, [0 x P] }`` (T padded
    to P's alignment); None for anything else."""
    if type_name is None:
        return None
    type_name = types.get(type_name, type_name).strip()
    if SCALAR.match(type_name):
        return scalar_bytes(type_name)
    array = re.fullmatch(r"\[(\d+) x (.+)\]", type_name)
    if array:
        inner = type_size(array.group(2), types)
        return None if inner is None else int(array.group(1)) * inner
    padded = re.fullmatch(r"\{ (.+), \[0 x (.+)\] \}", type_name)
    if padded:
        inner, pad = type_size(padded.group(1), types), type_size(padded.group(2), types)
        if inner is None or not pad:
            return None
        return -(-inner // pad) * pad
    vector = re.fullmatch(r"<(\d+) x (.+)>", type_name)
    if vector:
        inner = type_size(vector.group(2), types)
        return None if inner is None else int(vector.group(1)) * inner
    return None


def leaf_type(type_name: str) -> Optional[str]:
    """The scalar type of a scalar or a (nested) array of scalars; None for anything else."""
    array = re.fullmatch(r"\[(\d+) x (.+)\]", type_name.strip())
    if array:
        return leaf_type(array.group(2))
    return type_name.strip() if SCALAR.match(type_name.strip()) else None


def scalar_count(type_name: str) -> int:
    """The scalars in a scalar or a (nested) array of scalars."""
    array = re.fullmatch(r"\[(\d+) x (.+)\]", type_name.strip())
    return int(array.group(1)) * scalar_count(array.group(2)) if array else 1


def indexed(source: str, depth: int) -> str:
    """The type a getelementptr over `source` steps through at index `depth` (the first
    index steps over whole `source`s)."""
    for _ in range(depth):
        array = re.fullmatch(r"\[(\d+) x (.+)\]", source.strip())
        if not array:
            raise NotVector(f"an index into {source}")
        source = array.group(2)
    return source


def only_accessed_as(name: str, whole: str, leaf: str, lines: List[str]) -> bool:
    """Whether every pointer derived from allocation `name` (by getelementptr over arrays of
    `leaf`) is only used to load or store a `leaf`, or `name` itself to copy the `whole`
    allocation."""
    derived = {name}
    changed = True
    while changed:
        changed = False
        for line in lines:
            used = set(LOCAL.findall(line))
            if not used & derived or " = alloca " in line:
                continue
            result = ir_model.defined_name(line)
            text = line.split(" = ", 1)[1].strip() if result else line.strip()
            if text.startswith("getelementptr"):
                parts = split_operands(re.sub(r"^getelementptr (?:(?:inbounds|nuw|nusw) )*", "", text))
                if typed(parts[1])[1] not in derived or leaf_type(parts[0]) != leaf or used & derived - {
                        typed(parts[1])[1], result} or any(not SCALAR.match(typed(p)[0]) for p in parts[2:]):
                    return False
                if result not in derived:
                    derived.add(result)
                    changed = True
            elif text.startswith("load "):
                parts = split_operands(strip_metadata(text[5:]))
                if parts[0] != leaf and not (parts[0] == whole and typed(parts[1])[1] == name):
                    return False
            elif text.startswith("store "):
                parts = split_operands(strip_metadata(text[6:]))
                stored = typed(parts[0])[0]
                if (stored != leaf and not (stored == whole and typed(parts[1])[1] == name)
                        or set(LOCAL.findall(parts[0])) & derived):
                    return False
            else:
                return False
    return True


def array_elements(type_name: str, prefix: Tuple[int, ...] = ()) -> List[Tuple[Tuple[int, ...], str]]:
    """(indices, scalar type) of each element of an array type, in order."""
    array = re.fullmatch(r"\[(\d+) x (.+)\]", type_name)
    if not array:
        if not SCALAR.match(type_name):
            raise NotVector(f"a copy of {type_name}")
        return [(prefix, type_name)]
    return [found for i in range(int(array.group(1))) for found in array_elements(array.group(2), prefix + (i,))]

"""Shared-memory accesses given the alignment their address arithmetic proves.

Metal's compiler marks a half tile's loads ``align 2``. A lane of MLX's steel GEMM reads two
neighbouring halves at an even element offset: one 4-byte word, which NVPTX's code
generation would load at once (its load/store vectorizer merges neighbours whose alignment
covers them) were the first marked ``align 4``. LLVM's own inference stops six operations
deep into the address (ValueTracking's recursion limit) and steel GEMM's offsets are deeper.
Here each access into addrspace(3) gets the alignment its pointer provably has: the known
trailing zero bits of globals (threadgroup arrays, aligned to 16 by lowering.py), constants
and the integer operations between them, however deep, up to 16 bytes.
"""

import re
from typing import Dict

__all__ = ["proven_shared_alignment"]

_MOST = 4  # 2**4 = 16 bytes: the widest access NVPTX has
_NAME = r"[%@][-\w.$]+"
_GLOBAL = re.compile(r"^(@[-\w.$]+) = [^\n]*addrspace\(3\) global [^\n]*, align (\d+)$", re.M)
_ACCESS = re.compile(r"((?:= load [^,\n]+|^\s*store [^,\n]+), ptr addrspace\(3\) (" + _NAME + r")), align (\d+)", re.M)
_ASSIGNED = re.compile(r"^\s*(%[-\w.$]+) = (.*)$", re.M)
_FLAGS = re.compile(r"(?<![-%@\w.$])(?:nuw|nsw|exact|disjoint|inbounds|nneg|samesign) ")
_SCALAR = {"i8": 1, "i16": 2, "half": 2, "bfloat": 2, "i32": 4, "float": 4, "i64": 8, "double": 8}


def _size(type_: str):
    """Bytes between consecutive `type_` values, None where not a plain scalar, vector or array."""
    type_ = type_.strip()
    if type_ in _SCALAR:
        return _SCALAR[type_]
    nested = re.fullmatch(r"[\[<](\d+) x (.+)[\]>]", type_)
    if nested:
        inner = _size(nested.group(2))
        return None if inner is None else int(nested.group(1)) * inner
    return None


def _zeros(number: int) -> int:
    return 64 if number == 0 else (number & -number).bit_length() - 1


class _Known:
    """Known trailing zero bits of the values of one function (`assigned`: name -> right side)."""

    def __init__(self, assigned: Dict[str, str], globals_: Dict[str, int]):
        self.assigned, self.globals, self.found = assigned, globals_, {}

    def zeros(self, value: str) -> int:
        value = value.strip()
        if re.fullmatch(r"-?\d+", value):
            return _zeros(int(value))
        if value.startswith("@"):
            return self.globals.get(value, 0)
        if value not in self.found:
            self.found[value] = 0  # a cycle (a loop's phi) proves nothing
            self.found[value] = min(64, self._zeros_of(_FLAGS.sub("", self.assigned.get(value, ""))))
        return self.found[value]

    def _zeros_of(self, rhs: str) -> int:
        binary = re.fullmatch(r"(add|sub|or|xor|and|mul|shl|lshr|ashr) \S+ (\S+), (\S+)", rhs)
        if binary:
            op, a, b = binary.groups()
            if op in ("add", "sub", "or", "xor"):
                return min(self.zeros(a), self.zeros(b))
            if op == "and":
                return max(self.zeros(a), self.zeros(b))
            if op == "mul":
                return self.zeros(a) + self.zeros(b)
            if not re.fullmatch(r"\d+", b):
                return 0
            return self.zeros(a) + int(b) if op == "shl" else max(0, self.zeros(a) - int(b))
        cast = re.fullmatch(r"(zext|sext|trunc|bitcast|addrspacecast|ptrtoint|inttoptr) \S+(?: addrspace\(\d+\))? "
                            r"(\S+) to (\S+)", rhs)
        if cast:
            bits = re.fullmatch(r"i(\d+)", cast.group(3))
            return min(self.zeros(cast.group(2)), int(bits.group(1)) if bits and cast.group(1) == "trunc" else 64)
        chosen = re.fullmatch(r"select i1 \S+, \S+(?: addrspace\(\d+\))? (\S+), \S+(?: addrspace\(\d+\))? (\S+)", rhs)
        if chosen:
            return min(self.zeros(chosen.group(1)), self.zeros(chosen.group(2)))
        if rhs.startswith("phi "):
            incoming = re.findall(r"\[ (\S+), %[-\w.$]+ \]", rhs)
            return min((self.zeros(v) for v in incoming), default=0)
        if rhs.startswith("getelementptr "):
            return self._gep_zeros(rhs[len("getelementptr "):])
        return 0

    def _gep_zeros(self, rest: str) -> int:
        found = re.fullmatch(r"(.+?), ptr(?: addrspace\(\d+\))? (\S+)((?:, i(?:32|64) \S+)+)", rest)
        if not found:
            return 0
        type_, base, indices = found.groups()
        zeros = self.zeros(base)
        for k, index in enumerate(re.findall(r", i(?:32|64) (\S+)", indices)):
            if k > 0:  # into an array (a vector) of elements
                nested = re.fullmatch(r"\s*[\[<]\d+ x (.+)[\]>]\s*", type_)
                if not nested:
                    return 0
                type_ = nested.group(1)
            size = _size(type_)
            if size is None:
                return 0
            zeros = min(zeros, self.zeros(index) + _zeros(size))
        return zeros


def proven_shared_alignment(text: str) -> str:
    """`text` (a module) with each load and store of addrspace(3) given the alignment its
    address proves, where that is more than it says."""
    globals_ = {name: _zeros(int(align)) for name, align in _GLOBAL.findall(text)}
    pieces = re.split(r"(?m)^(?=define )", text)
    for n, piece in enumerate(pieces):
        if not piece.startswith("define ") or "addrspace(3)" not in piece:
            continue
        known = _Known({name: rhs.split(", !")[0] for name, rhs in _ASSIGNED.findall(piece)}, globals_)

        def raised(match) -> str:
            proven = 1 << min(_MOST, known.zeros(match.group(2)))
            return f"{match.group(1)}, align {max(proven, int(match.group(3)))}"

        pieces[n] = _ACCESS.sub(raised, piece)
    return "".join(pieces)

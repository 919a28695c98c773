"""Objective-C type encodings: computed from the simulated headers' types as Apple's clang
computes them for 64-bit macOS, and read back from Apple's (offsets dropped).

Apple's rules used here (x86_64, the slice macho_protocols.py reads): ``long`` and
``NSInteger`` are ``q``, ``unsigned long`` and ``NSUInteger`` ``Q``; an object pointer
``@``, a block ``@?``, ``SEL`` ``:``, ``Class`` ``#``; ``const`` on a pointer's target is
``r`` (``r^v``, ``r*`` for ``const char*``); an anonymous struct behind a typedef is
``{?=...}``; ``BOOL`` is ``c`` (``B`` on arm64). Two departures of the simulation are
mapped to Apple's meaning by name, as Apple's headers define them: ``BOOL`` (GCC's runtime
makes it ``unsigned char``) and libdispatch's ``dispatch_*_t`` (the simulation's are C
struct pointers, Apple's are Objective-C objects, ``@``).
"""

import re
from typing import List

__all__ = ["encode", "method_encoding", "split", "comparable"]

_BUILTIN = {
    "void": "v", "char": "c", "signed char": "c", "unsigned char": "C", "short": "s", "unsigned short": "S",
    "int": "i", "unsigned int": "I", "long": "q", "unsigned long": "Q", "long long": "q",
    "unsigned long long": "Q", "float": "f", "double": "d", "bool": "B", "_Bool": "B",
}
_OBJECT_TYPEDEFS = re.compile(r"^dispatch_\w+_t$")
_QUALIFIERS = "rnNoORV"


def _strip_const(spelling: str):
    words = spelling.replace("const ", " ").replace(" const", " ").split()
    return " ".join(words), "const" in spelling.split()


def encode(spelling: str, declarations) -> str:
    """The encoding of a type as clang spells it (sugared), resolving typedefs, structs
    and enums through `declarations` (declarations.Declarations)."""
    spelling = spelling.strip()
    if "(^)" in spelling:
        return "@?"
    if spelling.endswith("*"):
        pointee, const = _strip_const(spelling[:-1].strip())
        if pointee in ("id", "instancetype") or pointee.startswith("id<") or pointee in declarations.classes:
            return "@"  # a pointer to an Objective-C class is the object itself
        if pointee in ("char", "signed char"):
            return ("r" if const else "") + "*"
        return ("r" if const else "") + "^" + encode(pointee, declarations)
    base, _ = _strip_const(spelling)
    if base in ("id", "instancetype") or base.startswith("id<"):
        return "@"
    if base in ("Class",):
        return "#"
    if base in ("SEL",):
        return ":"
    if base == "BOOL":
        return "c"
    if _OBJECT_TYPEDEFS.match(base):
        return "@"
    if base in _BUILTIN:
        return _BUILTIN[base]
    for prefix in ("struct ", "enum "):
        if base.startswith(prefix):
            base = base[len(prefix):]
    if base in declarations.typedefs:
        spelled, reference = declarations.typedefs[base]
        if reference in declarations.records:
            return "{?=" + "".join(encode(t.sugared, declarations) for _, t in declarations.records[reference]) + "}"
        if reference in declarations.enums:
            return encode(declarations.enums[reference].sugared, declarations)
        return encode(spelled.sugared, declarations)
    raise ValueError(f"no encoding for type {spelling!r}")


def method_encoding(method, declarations) -> str:
    """Return type, self (``@``), _cmd (``:``), then each parameter: Apple's method
    encoding without its offsets."""
    return (encode(method.returns.sugared, declarations) + "@:"
            + "".join(encode(parameter.sugared, declarations) for parameter in method.parameters))


def _token(text: str, at: int) -> int:
    """The end of the one type that starts at `at`."""
    while text[at] in _QUALIFIERS:
        at += 1
    head = text[at]
    if head == "^":
        return _token(text, at + 1)
    if head == "@":
        if text.startswith("@?", at):
            return at + 2
        if text.startswith('@"', at):
            return text.index('"', at + 2) + 1
        return at + 1
    if head in "{([":
        depth = 0
        while True:
            if text[at] in "{([":
                depth += 1
            elif text[at] in "})]":
                depth -= 1
                if depth == 0:
                    return at + 1
            elif text[at] == '"':
                at = text.index('"', at + 1)
            at += 1
    if head == "b":
        at += 1
        while at < len(text) and text[at].isdigit():
            at += 1
        return at
    return at + 1


def split(encoding: str) -> List[str]:
    """An encoding's types, offsets dropped: ``v40@0:8@16Q24Q32`` -> ``['v', '@', ':', '@', 'Q', 'Q']``."""
    types, at = [], 0
    while at < len(encoding):
        end = _token(encoding, at)
        types.append(encoding[at:end])
        at = end
        while at < len(encoding) and (encoding[at].isdigit() or encoding[at] == "-"):
            at += 1
    return types


def comparable(token: str, qualifiers: bool = True) -> str:
    """A type token as compared: names dropped (``{MTLSize=QQQ}`` -> ``{?=QQQ}``, the
    simulation's struct is anonymous; ``@"NSString"`` -> ``@``), ``oneway`` (``V``) dropped;
    PyObjC's own codes as Apple's (``Z`` BOOL -> ``c``, ``^t`` a C string -> ``*``, ``t``
    -> ``c``); and with `qualifiers` false every qualifier dropped (PyObjC moves ``const``,
    in and out to ``type_modifier``)."""
    token = re.sub(r"\{[^=}]*=", "{?=", re.sub(r'@"[^"]*"', "@", token))
    token = token.replace("V", "").replace("^t", "*").replace("Z", "c").replace("t", "c")
    return token if qualifiers else "".join(ch for ch in token if ch not in "rnNoOR")

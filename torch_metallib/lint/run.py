"""Running the rules over one module's bitcode, or over a path: a .metallib (every function
module) or an AIR module (.air/.bc bitcode, raw or wrapped, or .ll text)."""

from typing import Iterable, List, Optional

import llvmlite.binding as llvm

from ..errors import ReflectionError
from ..reflection.air_text import ModuleText
from ..reflection.bitcode import parse_bitcode
from ..reflection.module_source import FUNCTION_LISTS
from .bitstream import BitstreamError, read_facts
from .model import ERROR, Finding, ModuleView, Rule
from .rules_bitcode import RULES as _BITCODE
from .rules_ir import RULES as _IR
from .rules_metadata import RULES as _METADATA

__all__ = ["RULES", "Finding", "lint_bitcode", "lint_path"]

RULES = _BITCODE + _METADATA + _IR
_MAGICS = (b"BC\xc0\xde", b"\xde\xc0\x17\x0b")


def lint_bitcode(bitcode, where: str, *, from_text: bool = False,
                 rules: Optional[Iterable[Rule]] = None) -> List[Finding]:
    """Findings for one module's bitcode (raw or in Apple's wrapper); `where` labels them.
    A module that cannot be read at all is one AIR000 finding."""
    try:
        facts = read_facts(bitcode)
    except BitstreamError as error:
        return [Finding("AIR000", ERROR, where, f"not readable as LLVM bitcode: {error}")]
    context = llvm.create_context()
    try:
        try:
            parsed = parse_bitcode(f"lint: {where}", _raw(bytes(bitcode)), context)
        except ReflectionError as error:
            return [Finding("AIR000", ERROR, where, str(error))]
        try:
            text = ModuleText(str(parsed))
            view = ModuleView(where, facts, text, parsed.triple, _entries(text), from_text)
        finally:
            parsed.close()
    finally:
        context.close()
    findings = []
    for rule in rules if rules is not None else RULES:
        findings.extend(Finding(rule.id, rule.severity, where, message) for message in rule.check(view))
    return findings


def lint_path(path: str, *, rules: Optional[Iterable[Rule]] = None) -> List[Finding]:
    """Findings for every function module of a .metallib, or for one AIR module file."""
    with open(path, "rb") as file:
        head = file.read(4)
    if head == b"MTLB":
        from ..library.library import load

        library = load(path)
        return [finding for name in library.function_names
                for finding in lint_bitcode(bytes(getattr(library, name).bitcode), f"{path}:{name}", rules=rules)]
    if head in _MAGICS:
        with open(path, "rb") as file:
            return lint_bitcode(file.read(), path, rules=rules)
    with open(path, "rb") as file:
        data = file.read()
    try:
        module = llvm.parse_assembly(data.decode("utf-8"))
    except (UnicodeDecodeError, RuntimeError) as error:
        detail = str(error).strip().splitlines()
        return [Finding("AIR000", ERROR, path, f"neither a .metallib, LLVM bitcode nor LLVM IR text LLVM can "
                                               f"parse: {detail[-1] if detail else error}")]
    # IR text is what `pack` writes as this LLVM's bitcode: lint that bitcode.
    return lint_bitcode(module.as_bitcode(), path, from_text=True, rules=rules)


def _raw(data: bytes) -> bytes:
    if data[:4] == _MAGICS[1]:
        offset, size = int.from_bytes(data[8:12], "little"), int.from_bytes(data[12:16], "little")
        return data[offset:offset + size]
    return data


def _entries(text: ModuleText):
    entries = []
    for metadata, kind in FUNCTION_LISTS.items():
        for ref in text.named(metadata) or ():
            node = text.node(ref)
            if node:
                entries.append((str(node[0]), kind, str(ref)))
    return entries


def exit_status(findings: Iterable[Finding]) -> int:
    """1 if any finding is an error, else 0."""
    return 1 if any(f.severity == ERROR for f in findings) else 0



"""What a lint rule sees (`ModuleView`: one AIR module as written and as LLVM prints it) and
what it reports (`Finding`), and the `Rule` record each rule module registers."""

import re
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, List, Optional, Tuple

from ..reflection.air_text import ModuleText
from .bitstream import BitcodeFacts

__all__ = ["ERROR", "WARNING", "Rule", "Finding", "ModuleView"]

ERROR, WARNING = "error", "warning"

_DEFINE = re.compile(r'^define [^@]*@("[^"]*"|[-\w$.]+)\(', re.M)


@dataclass(frozen=True)
class Finding:
    """One rule broken: `where` names the module (a path, or path:function for a library)."""

    rule: str
    severity: str
    where: str
    message: str

    def as_dict(self) -> dict:
        return {"rule": self.rule, "severity": self.severity, "where": self.where, "message": self.message}


@dataclass(frozen=True)
class Rule:
    """`check(view)` yields one message per violation; the docstring of `check` holds the
    evidence (public sources) and what breaks on a Mac."""

    id: str
    severity: str
    title: str
    check: Callable[["ModuleView"], Iterable[str]]

    @property
    def evidence(self) -> str:
        return (self.check.__doc__ or "").strip()


@dataclass
class ModuleView:
    """One AIR module: `facts` from its bitcode as written, `text` as llvmlite's LLVM prints
    it (upgraded: pointers print as ``ptr``), `triple`, and the entry functions
    (name, type, node reference) its function lists name."""

    where: str
    facts: BitcodeFacts
    text: ModuleText
    triple: str
    entries: List[Tuple[str, str, str]]
    from_text: bool = False

    def instructions(self) -> Iterator[Tuple[str, str]]:
        """(function name, instruction line) for every instruction of every defined function."""
        text = self.text.text
        end = self.text.metadata_start if self.text.metadata_start >= 0 else len(text)
        for match in _DEFINE.finditer(text, 0, end):
            name = match.group(1).strip('"')
            body_end = text.find("\n}\n", match.end())
            for line in text[match.end():body_end if body_end >= 0 else end].splitlines():
                if line.startswith("  "):
                    yield name, line.strip()

    def named_node(self, metadata: str) -> Optional[list]:
        refs = self.text.named(metadata)
        return self.text.node(refs[0]) if refs and len(refs) == 1 else None

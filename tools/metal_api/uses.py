"""What csrc/mps uses of Objective-C, as the compiler sees it.

Each ``.mm`` file is compiled as tests/metal_sim/build.py compiles it (clang-14, GCC's
Objective-C runtime, the simulated headers; torch_mps_stream.mm with torch's own MPS
headers) and its AST is dumped as JSON for the declarations in namespace
``torch_metallib`` (the whole AST, torch's headers included, is over a gigabyte). Read from
it: every message send (``[obj sel:...]``, and the getters behind property syntax such as
``buffer.gpuAddress``) with its receiver's static type, every ``@selector(...)``, and every
enum constant and function referenced. A text search for ``[obj sel:]`` would miss the
property accesses and could not say which protocol or class a receiver is.

Code outside namespace ``torch_metallib`` is not seen: ``outside_namespace`` finds any.
"""

import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, List, Optional

__all__ = ["Use", "read_uses", "parse_ast_json", "outside_namespace"]


@dataclass(frozen=True)
class Use:
    what: str                 # "send", "selector", "enum", "function"
    name: str                 # the selector, enum constant or function
    kind: str = "-"           # "-" instance message, "+" class message
    receiver: Optional[str] = None  # the receiver's static type, e.g. "id<MTLBuffer>", "NSString"
    file: str = ""
    line: int = 0

    @property
    def where(self) -> str:
        return f"{Path(self.file).name}:{self.line}"


def _documents(text: str) -> Iterator[dict]:
    decoder, at = json.JSONDecoder(), 0
    while True:
        while at < len(text) and text[at].isspace():
            at += 1
        if at >= len(text):
            return
        if text[at] != "{":  # "Dumping torch_metallib::...:" between documents
            at = text.index("\n", at)
            continue
        document, at = decoder.raw_decode(text, at)
        yield document


def parse_ast_json(text: str, source: str) -> List[Use]:
    uses, place = [], {"file": source, "line": 0}

    def locate(node):  # clang prints a file and a line only where they change
        for key in ("loc", "range"):
            value = node.get(key) or {}
            for spot in ([value] if key == "loc" else [value.get("begin") or {}, value.get("end") or {}]):
                spot = spot.get("expansionLoc", spot)
                if "file" in spot:
                    place["file"] = spot["file"]
                if "line" in spot:
                    place["line"] = spot["line"]

    def visit(node, begin):
        locate(node)
        here = (begin["file"], begin["line"])
        kind = node.get("kind")
        if kind == "ObjCMessageExpr":
            if node.get("receiverKind") == "class":
                receiver, message = node["classType"]["qualType"], "+"
            else:
                receiver, message = node["inner"][0]["type"]["qualType"], "-"
            uses.append(Use("send", node["selector"], message, receiver, *here))
        elif kind == "ObjCSelectorExpr":
            uses.append(Use("selector", node["selector"], file=here[0], line=here[1]))
        elif kind == "DeclRefExpr":
            referenced = node.get("referencedDecl", {})
            if referenced.get("kind") in ("EnumConstantDecl", "FunctionDecl"):
                what = "enum" if referenced["kind"] == "EnumConstantDecl" else "function"
                uses.append(Use(what, referenced["name"], file=here[0], line=here[1]))
        for child in node.get("inner", []) or []:
            visit(child, dict(place))

    for document in _documents(text):
        visit(document, dict(place))
    return uses


def read_uses(source: Path, clang: str, flags: List[str]) -> List[Use]:
    """The uses in `source`, compiled with `flags` (the simulated Metal's build flags)."""
    command = [clang, *flags, "-fsyntax-only", "-Xclang", "-ast-dump=json", "-Xclang",
               "-ast-dump-filter=torch_metallib", str(source)]
    run = subprocess.run(command, capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"clang could not compile {source.name}:\n{run.stderr[-3000:]}")
    return [use for use in parse_ast_json(run.stdout, str(source)) if Path(use.file).suffix in (".mm", ".h")]


def outside_namespace(text: str) -> List[str]:
    """Top-level code of an Objective-C++ file that is not inside ``namespace torch_metallib``
    (its first line each), comments, strings and preprocessor lines aside."""
    text = re.sub(r"//[^\n]*|/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    text = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    outside, depth, at = [], 0, 0
    for match in re.finditer(r"namespace\s+torch_metallib\b[\w:]*\s*\{|\{|\}", text):
        if depth == 0 and text[at:match.start()].strip():
            outside.append(text[at:match.start()].strip().splitlines()[0])
        if match.group().startswith("namespace") and depth == 0:
            depth = 1
        else:
            depth += 1 if match.group() == "{" else -1
        at = match.end()
    if text[at:].strip():
        outside.append(text[at:].strip().splitlines()[0])
    return outside

"""The simulated Metal's declarations (tests/metal_sim/include), as clang reads them.

clang-14 prints the headers' AST as text (its JSON dump crashes on Objective-C protocol
methods under GCC's runtime); this reads the protocols and classes with their methods
(declared, and the getters of properties) and types, the typedefs, structs and enums they
use, and the C functions. Types are kept as clang spells them, sugared and desugared
(``'NSUInteger':'unsigned long'``); encodings.py turns them into type encodings.
"""

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

__all__ = ["Type", "Method", "Container", "Declarations", "parse_ast_text", "read_declarations"]

_LINE = re.compile(r"^(?P<indent>[| `]*[|`]-)?(?P<kind>\w+)(?P<rest>.*)$")
_TYPE = re.compile(r"'(?P<sugared>[^']*)'(?::'(?P<desugared>[^']*)')?")
_ID = re.compile(r" (0x[0-9a-f]+)")
_FILE = re.compile(r"<(?P<file>[^<>:\s]+\.(?:h|mm|m|hpp|c|cpp)):\d+")


@dataclass(frozen=True)
class Type:
    sugared: str
    desugared: str  # equal to sugared where clang prints one spelling

    @staticmethod
    def parse(text: str) -> "Type":
        match = _TYPE.search(text)
        return Type(match["sugared"], match["desugared"] or match["sugared"])


@dataclass
class Method:
    kind: str                  # "-" instance, "+" class
    selector: str
    returns: Type
    parameters: List[Type]
    container: str             # the protocol or class declaring it
    container_kind: str        # "protocol" or "class"
    file: str
    implicit: bool = False     # a property's getter

    @property
    def key(self) -> str:
        """``-[Class selector]``, or ``-[<Protocol> selector]`` for a protocol's."""
        owner = self.container if self.container_kind == "class" else f"<{self.container}>"
        return f"{self.kind}[{owner} {self.selector}]"


@dataclass
class Container:
    kind: str                  # "protocol" or "class"
    name: str
    file: str
    parents: List[str] = field(default_factory=list)   # protocols adopted; a class's superclass first
    superclass: Optional[str] = None
    methods: Dict[Tuple[str, str], Method] = field(default_factory=dict)


@dataclass
class Declarations:
    containers: Dict[Tuple[str, str], Container] = field(default_factory=dict)  # (kind, name) -> Container
    typedefs: Dict[str, Tuple[Type, Optional[str]]] = field(default_factory=dict)  # name -> (type, record/enum id)
    records: Dict[str, List[Tuple[str, Type]]] = field(default_factory=dict)  # id -> fields
    enums: Dict[str, Type] = field(default_factory=dict)  # id -> underlying type
    enum_constants: Dict[str, Tuple[int, str]] = field(default_factory=dict)  # name -> (value, file)
    functions: Dict[str, Tuple[str, str]] = field(default_factory=dict)  # name -> (function type, file)
    classes: set = field(default_factory=set)  # every Objective-C class name seen (system headers too)

    def container(self, name: str, kind: str = None) -> Optional[Container]:
        for each in ([kind] if kind else ["class", "protocol"]):
            if (each, name) in self.containers:
                return self.containers[(each, name)]
        return None

    def lookup(self, container: Container, kind: str, selector: str, seen=None) -> Optional[Method]:
        """`selector`'s declaration as `container` sees it: its own, its superclasses', its protocols'."""
        seen = seen if seen is not None else set()
        if (container.kind, container.name) in seen:
            return None
        seen.add((container.kind, container.name))
        if (kind, selector) in container.methods:
            return container.methods[(kind, selector)]
        chain = ([("class", container.superclass)] if container.superclass else []) + \
            [("protocol", name) for name in container.parents]
        for parent_kind, name in chain:
            parent = self.containers.get((parent_kind, name))
            found = parent and self.lookup(parent, kind, selector, seen)
            if found:
                return found
        return None


class _Node:
    __slots__ = ("depth", "kind", "rest", "children", "file")

    def __init__(self, depth, kind, rest, file):
        self.depth, self.kind, self.rest, self.children, self.file = depth, kind, rest, [], file


def _tree(text: str) -> List[_Node]:
    """The dump's lines as nodes (depth from the tree drawing), each with the file it is in."""
    roots, stack, current_file = [], [], ""
    for line in text.splitlines():
        match = _LINE.match(line)
        if not match:
            continue
        depth = len(match["indent"] or "") // 2
        located = _FILE.search(match["rest"])
        if located:
            current_file = located["file"]
        node = _Node(depth, match["kind"], match["rest"], current_file)
        while stack and stack[-1].depth >= depth:
            stack.pop()
        (stack[-1].children if stack else roots).append(node)
        stack.append(node)
    return roots


def _name_after_location(rest: str) -> str:
    """The word after the last ``col:N``/``line:N:M`` location of a declaration line."""
    tail = re.split(r"(?:col:\d+|line:\d+:\d+)(?: referenced| used| implicit)*\s", rest)[-1]
    return tail.split(" ")[0].strip()


def _method(node: _Node, container: str, container_kind: str) -> Method:
    match = re.search(r" (?P<implicit>implicit )?(?P<kind>[-+]) (?P<selector>\S+) '", node.rest)
    parameters = [Type.parse(child.rest) for child in node.children if child.kind == "ParmVarDecl"]
    return Method(match["kind"], match["selector"], Type.parse(node.rest[match.end() - 1:]), parameters, container,
                  container_kind, node.file, bool(match["implicit"]))


def _container(node: _Node, declarations: Declarations) -> None:
    kind = "protocol" if node.kind == "ObjCProtocolDecl" else "class"
    name = node.rest.split()[-1]
    if kind == "class":
        declarations.classes.add(name)
    if not node.children:  # a forward declaration (@protocol X; @class X)
        return
    container = declarations.containers.setdefault((kind, name), Container(kind, name, node.file))
    for child in node.children:
        if child.kind == "ObjCProtocol" and Type.parse(child.rest).sugared not in container.parents:
            container.parents.append(Type.parse(child.rest).sugared)
        elif child.kind == "super":  # "super ObjCInterface 0x.. 'NSObject'"
            container.superclass = Type.parse(child.rest).sugared
        elif child.kind == "ObjCMethodDecl":
            method = _method(child, name, kind)
            container.methods[(method.kind, method.selector)] = method


def _reference(node: _Node) -> Optional[str]:
    """The record or enum a typedef names (``CXXRecord 0x..`` / ``Enum 0x..`` below it)."""
    for child in node.children:
        if child.kind in ("CXXRecord", "Record", "Enum"):
            return _ID.search(" " + child.rest).group(1)
        found = _reference(child)
        if found:
            return found
    return None


def parse_ast_text(text: str) -> Declarations:
    declarations = Declarations()

    def visit(nodes: List[_Node]) -> None:
        for node in nodes:
            if node.kind in ("ObjCProtocolDecl", "ObjCInterfaceDecl"):
                _container(node, declarations)
            elif node.kind == "TypedefDecl":
                declarations.typedefs[_name_after_location(node.rest)] = (Type.parse(node.rest), _reference(node))
            elif node.kind in ("CXXRecordDecl", "RecordDecl") and " definition" in node.rest:
                declarations.records[_ID.search(node.rest).group(1)] = [
                    (_name_after_location(child.rest), Type.parse(child.rest))
                    for child in node.children if child.kind == "FieldDecl"]
            elif node.kind == "EnumDecl":
                declarations.enums[_ID.search(node.rest).group(1)] = Type.parse(node.rest)
                value = -1
                for child in node.children:
                    if child.kind == "EnumConstantDecl":  # an explicit value, else the one before plus 1
                        explicit = re.search(r"value: Int (-?\d+)", _flatten(child))
                        value = int(explicit.group(1)) if explicit else value + 1
                        declarations.enum_constants[_name_after_location(child.rest)] = (value, child.file)
            elif node.kind == "FunctionDecl":
                declarations.functions[_name_after_location(node.rest)] = (Type.parse(node.rest).sugared, node.file)
            elif node.kind in ("LinkageSpecDecl", "NamespaceDecl"):
                visit(node.children)
            if node.kind == "TranslationUnitDecl":
                visit(node.children)

    visit(_tree(text))
    return declarations


def _flatten(node: _Node) -> str:
    return f"{node.kind}{node.rest} " + " ".join(_flatten(child) for child in node.children)


def read_declarations(include: Path, clang: str, flags: List[str], headers=("Foundation/Foundation.h",
                                                                            "Metal/Metal.h")) -> Declarations:
    """The declarations of `headers` under `include`, compiled as csrc/mps is (`flags`)."""
    source = "".join(f"#import <{header}>\n" for header in headers)
    command = [clang, *flags, f"-I{include}", "-fsyntax-only", "-fno-color-diagnostics", "-Xclang", "-ast-dump",
               "-x", "objective-c++", "-"]
    run = subprocess.run(command, input=source, capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"clang could not read {include}:\n{run.stderr[-3000:]}")
    return parse_ast_text(run.stdout)

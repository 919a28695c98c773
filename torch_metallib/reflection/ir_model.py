"""The one reader of LLVM IR function bodies, for every analysis and rewrite of a printed
module: its functions (header, parameters, body), their blocks (label, lines, terminator,
successors, phis) and instructions (result name, opcode, result type, callee, the values
they use).

The rewrites edit the printed text in place, line by line, so the model reads that text
(llvmlite's reader leaves the numbered values a line refers to, ``%12``, without a name);
where a question is asked of a function LLVM has parsed (``branches``), llvmlite answers.
Names are read once here, bare or quoted (``%"a b"``, ``"a b":``), so every reader agrees
on them. It is part of reflection (stage 2), the first stage that reads bodies, so that
reflection, ``air/`` and ``backends/`` share it.
"""

import re
from typing import Callable, Container, Dict, Iterable, Iterator, List, Optional, Set, Tuple

__all__ = ["NAME", "LOCAL", "LABEL", "DEFINITION", "CALLEE", "Function", "Block", "Phi", "functions", "function",
           "unquoted", "unescape", "parameters", "split_operands", "branches", "reachable", "edit_functions",
           "edit_function_bodies", "blocks", "successors", "predecessors", "reachable_blocks", "retarget_phis",
           "defined_name", "opcode", "result_type", "callee", "used_names", "substitute", "renamed"]

NAME = r'(?:[-\w$.]+|"[^"]*")'  # an identifier as LLVM prints it, bare or quoted
LOCAL = re.compile(rf'(?<![-\w$."])%{NAME}')  # a local value or label where a line uses it
LABEL = re.compile(rf"^({NAME}):")
DEFINITION = re.compile(rf"^\s*(%{NAME}) = ")
_SUCCESSOR = re.compile(rf"label %({NAME})")
_OPCODE = re.compile(rf"^\s*(?:%{NAME} = )?(?:tail |notail |musttail )?(\w+)")
CALLEE = re.compile(rf"\b(?:call|invoke|callbr)\b[^\n]*?@({NAME})\(")  # up to the argument list's "("


# --- functions -------------------------------------------------------------------------------

class Function:
    """A definition of a printed module: `start` is its ``define ... {`` line's index among
    the module's lines, `end` its closing ``}``'s (LLVM prints it alone on a line)."""
    __slots__ = ("name", "header", "start", "end", "body")

    def __init__(self, lines: List[str], start: int, end: int):
        self.header, self.start, self.end = lines[start], start, end
        self.name = _defined_function(self.header)
        self.body = lines[start + 1:end]

    def parameters(self) -> List[str]:
        """The header's parameters as printed (type, attributes, name): `parameters`."""
        return parameters(self.header)


def parameters(header: str) -> List[str]:
    """A ``define`` or ``declare`` line's parameters as printed (type, attributes, name),
    split at the commas outside brackets; [] for none."""
    opened = header.index("(", header.index("@"))
    parts, depth, start = [], 0, opened + 1
    for i in range(opened, len(header)):
        character = header[i]
        if character in "(<[{":
            depth += 1
        elif character in ")>]}":
            depth -= 1
            if depth == 0:
                parts.append(header[start:i])
                break
        elif character == "," and depth == 1:
            parts.append(header[start:i])
            start = i + 1
    return [] if parts == [""] else parts


_NESTED_OPERANDS = re.compile(r'[(<\[{"]')  # without them, a plain split


def split_operands(text: str) -> List[str]:
    """`text` split at its top-level commas (outside brackets and quotes), parts stripped."""
    if not _NESTED_OPERANDS.search(text):
        return [part.strip() for part in text.split(",")]
    parts, depth, start, quoted = [], 0, 0, False
    for i, c in enumerate(text):
        if c == '"':
            quoted = not quoted
        elif quoted:
            continue
        elif c in "([{<":
            depth += 1
        elif c in ")]}>":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:].strip())
    return parts


def _defined_function(header: str) -> str:
    found = re.search(rf"@({NAME})\(", header)
    return found.group(1) if found else ""


def functions(lines: List[str]) -> Iterator[Function]:
    """The definitions among a module's `lines`, in order."""
    i = 0
    while i < len(lines):
        if lines[i].startswith("define ") and lines[i].endswith("{"):
            end = lines.index("}", i + 1)
            yield Function(lines, i, end)
            i = end
        i += 1


_ESCAPE = re.compile(r"\\([0-9A-Fa-f]{2})")


def unescape(text: str) -> str:
    """Undoes LLVM's ``\\XX`` escapes (quotes, backslashes, non-ASCII bytes as UTF-8)."""
    if "\\" not in text:
        return text
    raw = _ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), text).encode("latin-1")
    return raw.decode("utf-8", "backslashreplace")


def unquoted(name: str) -> str:
    """A global's name as LLVM knows it from `name` as printed: without the quotes LLVM puts
    around a name that is not a bare identifier (``@"a b"``), its escapes undone."""
    return unescape(name[1:-1]) if name.startswith('"') else name


_BARE_NAME = re.compile(r"[-a-zA-Z$._][-a-zA-Z$._0-9]*\Z")


def printed(name: str) -> str:
    """Global `name` as LLVM prints it after ``@``: bare where it is an identifier, otherwise
    quoted, with quotes, backslashes and bytes outside printable ASCII escaped (the inverse
    of :func:`unquoted`)."""
    if _BARE_NAME.match(name):
        return name
    escaped = "".join(c if " " <= c <= "~" and c not in '"\\' else "".join(f"\\{b:02X}" for b in c.encode())
                      for c in name)
    return f'"{escaped}"'


def function(lines: List[str], name: str) -> Optional[Function]:
    """The definition of @`name` (bare or as printed, quoted) among a module's `lines`; None
    where it has none."""
    name = unquoted(name)
    return next((f for f in functions(lines) if unquoted(f.name) == name), None)


_GLOBAL_REFERENCE = re.compile(rf"@({NAME})")


def reachable(lines: List[str], roots) -> set:
    """The names of the functions and declarations `roots` (function names) reach: those a
    reached definition's body names (a call or a function pointer), and those the module's
    global variables name (their initializers). Metadata is not followed (``!air.kernel``
    names every kernel of the module)."""
    bodies = {unquoted(found.name): found.body for found in functions(lines)}

    def names(text: str) -> set:
        return set(map(unquoted, _GLOBAL_REFERENCE.findall(text)))
    todo = set(roots)
    for line in lines:
        if line.startswith("@"):
            todo |= names(line.split("=", 1)[1] if "=" in line else "")
    seen: set = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo |= names("\n".join(bodies.get(name, ()))) - seen  # one search a body: no name spans lines
    return seen


def edit_functions(text: str, edit: Callable[[Function], List[str]]) -> str:
    """`text` with the lines of each definition's body replaced by ``edit(function)``."""
    lines = text.split("\n")
    out: List[str] = []
    done = 0
    for found in functions(lines):
        out += lines[done:found.start + 1] + edit(found)
        done = found.end
    return "\n".join(out + lines[done:])


def edit_function_bodies(text: str, edit: Callable[[List[str]], List[str]]) -> str:
    """`text` with the lines of each definition's body replaced by ``edit(lines)``."""
    return edit_functions(text, lambda found: edit(found.body))


def branches(parsed) -> bool:
    """Whether a function parsed by LLVM (llvmlite's ValueRef) has a branch or switch: read
    through llvmlite, without printing the function."""
    return any(instruction.opcode in ("br", "switch") for block in parsed.blocks for instruction in block.instructions)


# --- blocks ----------------------------------------------------------------------------------

class Block:
    """A basic block: `name` ('' for an entry block printed without a label), its `label`
    line (None there), and its other `lines` as printed (blank lines and comments kept)."""
    __slots__ = ("name", "label", "lines")

    def __init__(self, name: str, label: Optional[str], lines: List[str]):
        self.name, self.label, self.lines = name, label, lines

    def instructions(self) -> List[str]:
        """The block's instructions, one text each (a switch's case lines, up to its closing
        ``]``, joined to it by newlines); blank lines and comments left out."""
        found: List[str] = []
        cases = False
        for line in self.lines:
            stripped = line.strip()
            if not stripped or stripped.startswith(";"):
                continue
            if cases:
                found[-1] += "\n" + line
                cases = stripped != "]"
            else:
                found.append(line)
                cases = stripped.startswith("switch ") and stripped.endswith("[")
        return found

    def terminator(self) -> List[str]:
        """The terminator's lines: the last instruction's (read from the end: a block may be long)."""
        lines = self.lines
        last = len(lines) - 1
        while last >= 0 and (not lines[last].strip() or lines[last].lstrip().startswith(";")):
            last -= 1
        first = last
        if last >= 0 and lines[last].strip() == "]":  # a switch's cases, on lines of their own
            while first > 0 and not lines[first].lstrip().startswith("switch "):
                first -= 1
        return lines[first:last + 1]

    def successors(self) -> List[str]:
        """The blocks the terminator branches to, in printed order (repeats kept)."""
        return [name for line in self.terminator() for name in _SUCCESSOR.findall(line)]

    def phis(self) -> List[str]:
        """The phi lines the block starts with."""
        count = 0
        while count < len(self.lines) and " = phi " in self.lines[count]:
            count += 1
        return self.lines[:count]


def blocks(body: List[str]) -> Dict[str, Block]:
    """A function body's blocks by name, in printed order, entry first."""
    found: Dict[str, Block] = {}
    current: Optional[Block] = None
    for line in body:
        label = LABEL.match(line)
        if label:
            current = found[label.group(1)] = Block(label.group(1), line, [])
        else:
            if current is None:
                current = found[""] = Block("", None, [])
            current.lines.append(line)
    return found


def successors(found: Dict[str, Block]) -> Dict[str, List[str]]:
    """Block name -> the blocks of `found` its terminator branches to: the control-flow graph."""
    return {name: [s for s in block.successors() if s in found] for name, block in found.items()}


def predecessors(graph: Dict[str, List[str]]) -> Dict[str, List[str]]:
    """Block name -> the blocks that branch to it: `graph` (every successor one of its
    blocks, as ``successors`` gives it) reversed."""
    into: Dict[str, List[str]] = {name: [] for name in graph}
    for name, outs in graph.items():
        for out in outs:
            into[out].append(name)
    return into


def reachable_blocks(graph: Dict[str, List[str]], starts: Iterable[str],
                     avoiding: Container[str] = frozenset()) -> Set[str]:
    """The blocks a walk along `graph`'s edges from `starts` reaches without entering one of
    `avoiding`: `starts` (those not avoided) and every block after them."""
    found = {start for start in starts if start not in avoiding}
    work = list(found)
    while work:
        for after in graph[work.pop()]:
            if after not in found and after not in avoiding:
                found.add(after)
                work.append(after)
    return found


# --- instructions ----------------------------------------------------------------------------

def defined_name(line: str) -> Optional[str]:
    """The value an instruction line defines (``%x``), None where it defines none."""
    found = DEFINITION.match(line)
    return found.group(1) if found else None


def opcode(line: str) -> Optional[str]:
    """An instruction line's opcode (``call`` for a tail call)."""
    found = _OPCODE.match(line)
    return found.group(1) if found else None


def callee(line: str) -> Optional[str]:
    """The function a call, invoke or callbr line names (None for other lines and calls
    through a pointer)."""
    if "call" not in line and "invoke" not in line:  # most lines: no search (it is per line, per module)
        return None
    found = CALLEE.search(line)
    return found.group(1) if found else None


def used_names(line: str) -> List[str]:
    """The local values and labels a line names (its result's included), in order."""
    return LOCAL.findall(line)


def substitute(line: str, names: Dict[str, str]) -> str:
    """`line` with every local name in `names` replaced by its value there."""
    return LOCAL.sub(lambda m: names.get(m.group(0), m.group(0)), line)


def renamed(name: str, tag: str) -> str:
    """A copy's name for local `name`: `tag` before the original's (a bare name may not start
    with a digit; a quoted name stays quoted)."""
    if name.startswith('%"'):
        return f'%"{tag}.{name[2:]}'
    return f"%{tag}.{name[1:]}"


_SIMPLE_TYPE = r"(?:i\d+|half|bfloat|float|double|ptr(?: addrspace\(\d+\))?)"
_TYPE = re.compile(rf"^(?:{_SIMPLE_TYPE}|<\d+ x {_SIMPLE_TYPE}>)$")
_LEADING_TYPE = re.compile(rf"(<\d+ x {_SIMPLE_TYPE}>|{_SIMPLE_TYPE})(?=[ ,]|$)")
_FLAGS = {"nuw", "nsw", "exact", "disjoint", "samesign", "fast", "nnan", "ninf", "nsz", "arcp", "contract", "afn",
          "reassoc", "nneg", "volatile", "inbounds", "nusw"}
_CASTS = ("sext", "zext", "trunc", "fpext", "fptrunc", "fptoui", "fptosi", "uitofp", "sitofp", "bitcast",
          "ptrtoint", "inttoptr", "addrspacecast")
_TYPED_FIRST = ("insertelement", "load", "freeze", "fneg", "add", "sub", "mul", "udiv", "sdiv", "urem", "srem",
                "shl", "lshr", "ashr", "and", "or", "xor", "fadd", "fsub", "fmul", "fdiv", "frem")


def result_type(line: str) -> Optional[str]:
    """The type of the value an instruction line defines: a scalar, a pointer or a vector of
    those; None where it is of another type or not read from the text."""
    if " = " not in line:
        return None
    rest = re.split(r", !", line.split(" = ", 1)[1])[0]
    words = rest.split(" ")
    code = words[0]
    if code in ("tail", "notail", "musttail"):
        code, words = words[1], words[1:]
    if code in _CASTS:
        found = rest.rsplit(" to ", 1)[-1].strip()
    elif code in ("icmp", "fcmp"):
        vector = re.search(r"<(\d+) x ", rest)
        found = f"<{vector.group(1)} x i1>" if vector else "i1"
    elif code == "getelementptr":
        operand = rest.split(", ", 1)[1] if ", " in rest else ""
        pointer = re.match(r"(ptr(?: addrspace\(\d+\))?) ", operand)
        found = pointer.group(1) if pointer else None
    elif code == "select":
        found = _leading_type(rest.split(", ", 1)[1] if ", " in rest else "")
    elif code == "call":
        head = rest.split("@", 1)[0].strip()
        typed = re.search(rf"(<\d+ x {_SIMPLE_TYPE}>|{_SIMPLE_TYPE})$", head)
        found = typed.group(1) if typed and not re.search(r"\bvoid$", head) else None
    elif code == "extractelement":
        vector = re.match(rf"extractelement <\d+ x ({_SIMPLE_TYPE})>", rest)
        found = vector.group(1) if vector else None
    elif code in _TYPED_FIRST:
        found = _leading_type(" ".join(w for w in words[1:] if w not in _FLAGS).rstrip(","))
    else:
        found = None
    return found if found and _TYPE.match(found) else None


def _leading_type(text: str) -> Optional[str]:
    match = _LEADING_TYPE.match(text)
    return match.group(1) if match else None


# --- phis ------------------------------------------------------------------------------------

_PHI = re.compile(rf"^(\s*%{NAME} = phi (?:(?:fast|nnan|ninf|nsz|arcp|contract|afn|reassoc) )*)"
                  r"(<\d+ x [^>]+>|ptr addrspace\(\d+\)|[^\s\[]+) (\[ .*\])$")
_ENTRY = re.compile(rf"\[ ([^\[\]]+?), (%{NAME}) \]")
_INCOMING_BLOCK = re.compile(rf", %({NAME}) \]")


class Phi:
    """A phi line read exactly: `name`, `head` (up to its first entry) and `entries`
    ((value, ``%block``) pairs); read() gives None for a phi printed otherwise."""
    __slots__ = ("name", "head", "entries")

    def __init__(self, name: str, head: str, entries: List[Tuple[str, str]]):
        self.name, self.head, self.entries = name, head, entries

    @staticmethod
    def read(line: str) -> Optional["Phi"]:
        found = _PHI.match(line)
        if not found:
            return None
        entries = _ENTRY.findall(found.group(3))
        if ", ".join(f"[ {v}, {label} ]" for v, label in entries) != found.group(3):
            return None
        return Phi(defined_name(line), f"{found.group(1)}{found.group(2)} ", entries)

    def text(self) -> str:
        return self.head + ", ".join(f"[ {v}, {label} ]" for v, label in self.entries)


def retarget_phis(body: List[str], moved: Dict[str, str]) -> List[str]:
    """`body` with phi operands from a block in `moved` coming from the block its
    terminator moved to (where a block was cut in two)."""
    if not moved:
        return body

    def rename(match):
        return f", %{moved.get(match.group(1), match.group(1))} ]"
    return [_INCOMING_BLOCK.sub(rename, line) if " = phi " in line else line for line in body]

"""The parts of a printed AIR module that reflection reads.

llvmlite has no metadata API, so reflection prints the parsed module (``str(module)``)
and reads the text LLVM's writer emits: metadata nodes, named metadata, global variables,
declarations and the kernel's parameter list. Only the subset of the IR grammar that
LLVM prints for these lines is understood; anything else in a node is kept as `Raw`.
"""

import re
from typing import Dict, List, Optional, Tuple

from .ir_model import NAME, parameters, reachable, unescape, unquoted

__all__ = ["Ref", "GlobalRef", "Raw", "MalformedNode", "ModuleText"]


class Ref(int):
    """A reference to metadata node ``!N``; ``str(ref)`` is ``"!N"``."""

    def __repr__(self) -> str:
        return f"!{int(self)}"

    __str__ = __repr__


class GlobalRef(str):
    """A reference to a global value, ``ptr @name``; the str is the unquoted name."""

    def __repr__(self) -> str:
        return f"@{str.__str__(self)}"


class Raw(str):
    """A node element this reader does not interpret (e.g. ``[2 x i32] [...]``), verbatim."""


class MalformedNode(Exception):
    """A node's text does not follow the grammar; carries the node and what was found."""

    def __init__(self, node: str, detail: str):
        super().__init__(detail)
        self.node = node
        self.detail = detail


_ELEMENT = re.compile(
    r"""(?:
        !"(?P<str>[^"]*)"
      | !(?P<ref>\d+)
      | (?P<null>null)
      | i\d+\ (?P<int>-?\d+|true|false)
      | ptr(?:\ addrspace\(\d+\))?\ @(?P<global>"[^"]*"|[-\w$.]+)
      | (?P<raw>(?:[^,\[{<("]|\[[^\]]*\]|\{[^}]*\}|<[^>]*>|\([^)]*\)|"[^"]*")+)
    )(?:,\ |$)""",
    re.X,
)
_GLOBAL_LINE = re.compile(rf"^@({NAME}) = ([^\n]*)$", re.M)
_FUNCTION_HEADER = re.compile(rf"(?:define|declare) [^\n]*?@({NAME})\(")
_ALIGN = re.compile(r", align (\d+)")
# The type a parameter starts with (attributes and the name follow it).
_PARAM_TYPE = re.compile(r"ptr(?: addrspace\(\d+\))?|<\d+ x [^>]+>|\[[^\]]*\]|\{[^}]*\}|%\"[^\"]*\"|%[-\w$.]+|\w+")


def _value(match) -> object:
    kind = match.lastgroup
    text = match.group(kind)
    if kind == "str":
        return unescape(text)
    if kind == "ref":
        return Ref(text)
    if kind == "int":
        return True if text == "true" else False if text == "false" else int(text)
    if kind == "global":
        return GlobalRef(unquoted(text))
    if kind == "null":
        return None
    return Raw(text)


def parse_elements(node: str, body: str) -> list:
    """The elements of one node body (the text between ``!{`` and ``}``)."""
    values = []
    end = 0
    for match in _ELEMENT.finditer(body):
        if match.start() != end:
            break
        values.append(_value(match))
        end = match.end()
    if end != len(body):
        raise MalformedNode(node, f"unreadable element at character {end}: {body[end:end + 40]!r}")
    return values


class ModuleText:
    """Looks up lines of one printed module; node bodies are found and parsed on first use.

    Nodes are found with str.find rather than by indexing every metadata line: a kernel's
    argument nodes are a short consecutive run, and the search resumes where the previous
    one ended, so reflection touches a few hundred characters of metadata, not all of it.
    """

    __slots__ = ("text", "_metadata_start", "_bodies", "_parsed", "_resume_ref", "_resume_at", "_reached")

    def __init__(self, text: str):
        self.text = text
        start = text.find("\n!")
        self._metadata_start = len(text) if start < 0 else start  # at the "\n" before it
        self._bodies = {}
        self._parsed = {}
        self._resume_ref, self._resume_at = -1, self._metadata_start
        self._reached = {}

    @property
    def metadata_start(self) -> int:
        """Where the metadata lines begin in `text`."""
        return self._metadata_start

    # --- metadata -----------------------------------------------------------------
    def named(self, name: str) -> Optional[list]:
        """The operands of named metadata ``!name``, or None if the module has none."""
        body = self._find_body(f"!{name}", self._metadata_start)
        return None if body is None else parse_elements(f"!{name}", body)

    def node(self, ref: int) -> list:
        """The elements of node ``!ref`` (a tuple node ``!{...}``)."""
        parsed = self._parsed.get(ref)
        if parsed is None:
            parsed = self._parsed[ref] = parse_elements(f"!{int(ref)}", self.body(ref))
        return parsed

    def body(self, ref: int) -> str:
        """The text of tuple node ``!ref`` between ``!{`` and ``}``."""
        body = self._bodies.get(ref)
        if body is None:
            label = f"!{int(ref)}"
            start = self._resume_at if ref > self._resume_ref else self._metadata_start
            body = self._find_body(label, start)
            if body is None and start != self._metadata_start:
                body = self._find_body(label, self._metadata_start)
            if body is None:
                raise MalformedNode(label, "no such node in the module")
            self._bodies[ref] = body
            self._resume_ref = ref
        return body

    def _find_body(self, label: str, start: int) -> Optional[str]:
        text = self.text
        needle = f"\n{label} = "
        at = text.find(needle, start)
        if at < 0:
            return None
        begin = at + len(needle)
        end = text.find("\n", begin)
        end = len(text) if end < 0 else end
        self._resume_at = end
        line = text[begin:end]
        if line.startswith("distinct "):
            line = line[len("distinct "):]
        if not (line.startswith("!{") and line.endswith("}")):
            raise MalformedNode(label, f"expected a tuple node !{{...}}, got {line[:60]!r}")
        return line[2:-1]

    # --- globals and functions ------------------------------------------------------
    def globals(self, containing: str = "") -> Dict[str, str]:
        """Global variable name -> the rest of its definition line, for the lines that
        contain `containing`."""
        end = self._first_function()
        if containing not in self.text[:end]:
            return {}
        return {unquoted(name): rest for name, rest in _GLOBAL_LINE.findall(self.text, 0, end)
                if containing in rest}

    def declarations(self, prefix: str = "") -> Tuple[str, ...]:
        """Names (starting with `prefix`) of the functions the module declares: the ones it
        calls but does not define."""
        names = (unquoted(match.group(1)) for match in self._lines_starting("declare ", f" @{prefix}"))
        return tuple(name for name in names if name.startswith(prefix))

    def called_declarations(self, function: str, prefix: str) -> Tuple[str, ...]:
        """The `declarations` (starting with `prefix`) that `function` can call: those its body,
        or a function it reaches, names (``ir_model.reachable``, the rule a backend refuses a
        kernel by). Compilers such as Mojo's declare some in every module, called or not."""
        declared = self.declarations(prefix)
        if not declared:  # most modules: no body is read
            return declared
        reached = self._reached.get(function)
        if reached is None:
            reached = self._reached[function] = reachable(self.text.split("\n"), [function])
        return tuple(name for name in declared if name in reached)

    def parameter_types(self, function: str) -> Optional[List[str]]:
        """LLVM types of the parameters of the defined `function`, None if it is not defined."""
        for match in self._lines_starting("define "):
            if unquoted(match.group(1)) == function:
                line_end = self.text.find("\n", match.end())
                header = self.text[match.start():len(self.text) if line_end < 0 else line_end]
                types = (_PARAM_TYPE.match(parameter.strip()) for parameter in parameters(header))
                return [found.group(0) for found in types if found]
        return None

    def bodies_in_section(self, section: str) -> List[str]:
        """The bodies (the lines between ``{`` and ``}``) of the functions defined in
        `section`, e.g. ``air.static_init``."""
        bodies = []
        for match in self._lines_starting("define ", f'section "{section}"'):
            line_end = self.text.find("\n", match.end())
            if line_end < 0 or f'section "{section}"' not in self.text[match.start():line_end]:
                continue
            end = self.text.find("\n}", line_end)
            bodies.append(self.text[line_end + 1:len(self.text) if end < 0 else end])
        return bodies

    def _lines_starting(self, keyword: str, containing: str = ""):
        """Header matches of the `keyword` lines (``define ``/``declare ``) that contain
        `containing` (or a quoted name), in text order. str.find skips the function
        bodies far faster than a multi-line regex."""
        text, needle = self.text, "\n" + keyword
        at = text.find(needle)
        while 0 <= at < self._metadata_start:
            end = text.find("\n", at + 1)
            end = len(text) if end < 0 else end
            if text.find(containing, at, end) >= 0 or '@"' in text[at:end]:
                match = _FUNCTION_HEADER.match(text, at + 1)
                if match is not None:
                    yield match
            at = text.find(needle, end)

    def _first_function(self) -> int:
        match = re.search(r"^(?:define|declare) ", self.text, re.M)
        return match.start() if match else self._metadata_start


def alignment_of(definition: str) -> Optional[int]:
    """The ``align N`` of a global's definition line, None if it has none."""
    match = _ALIGN.search(definition)
    return int(match.group(1)) if match else None

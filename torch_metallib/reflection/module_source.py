"""One AIR module -> what Apple's ``metallib`` tool derives from it: the function's list entry
(NAME, TYPE, VERS), its CNST, and the platform and OS version for the library header.

Read off Apple-built libraries (docs/formats.md, "Where each tag comes from"): each function's
module holds only that function (a module with several is cut, module_split.py); the header's platform version is the modules' deployment
target (the triple's OS version), not the ``SDK Version`` module flag.
"""

import os
import re
from dataclasses import dataclass
from typing import List, Optional, Tuple

import llvmlite.binding as llvm

from ..container.function_constant import FunctionConstant
from ..container.pack import FunctionSource
from ..container.tables import DATA_TYPES
from ..errors import ReflectionError
from .air_text import GlobalRef, MalformedNode, ModuleText, Ref
from .bitcode import parse_bitcode
from .module_split import cut_to_entry

__all__ = ["ModuleSource", "read_module", "read_modules"]

# Named metadata listing the entry functions of each TYPE.
FUNCTION_LISTS = {"air.kernel": "kernel", "air.vertex": "vertex", "air.fragment": "fragment",
                  "air.visible": "visible"}
# Function lists Metal has whose TYPE code no Apple-built library in the corpus shows.
_UNSUPPORTED_LISTS = ("air.mesh", "air.object", "air.intersection")

# Triple OS names -> the header's platform names (container/tables.py PLATFORMS).
_OS_NAMES = {"macosx": "macos", "macos": "macos", "ios": "ios", "tvos": "tvos", "watchos": "watchos",
             "xros": "visionos", "visionos": "visionos", "driverkit": "driverkit", "bridgeos": "bridgeos"}
_ENVIRONMENTS = {("ios", "macabi"): "maccatalyst", ("ios", "simulator"): "ios_simulator",
                 ("tvos", "simulator"): "tvos_simulator", ("watchos", "simulator"): "watchos_simulator",
                 ("visionos", "simulator"): "visionos_simulator"}
_TRIPLE = re.compile(r"air64(?:_v\d+)?-apple-([a-z]+?)(\d+(?:\.\d+){0,2})?(?:-([a-z]+))?")
_SDK_VERSION = re.compile(r'!"SDK Version", \[\d+ x i32\] \[([^\]]*)\]')
_WRAPPER_MAGIC = b"\xde\xc0\x17\x0b"
_BITCODE_MAGIC = b"BC\xc0\xde"


@dataclass(frozen=True)
class ModuleSource:
    """What one AIR module says about the library entry it becomes.

    Attributes:
        function: the FunctionSource to pack (name, type, bitcode, constants, versions).
        platform: the header's platform name, from the triple (e.g. ``"macos"``).
        platform_version: the deployment target from the triple, e.g. ``(14, 0, 0)``.
        sdk_version: the ``SDK Version`` module flag, or None.
        triple: the module's target triple.
    """

    function: FunctionSource
    platform: str
    platform_version: Tuple[int, int, int]
    sdk_version: Optional[Tuple[int, ...]]
    triple: str


def read_modules(module, name: Optional[str] = None) -> List[ModuleSource]:
    """Reads one AIR module: a path (``.air``/``.bc`` bitcode, raw or in the Darwin wrapper,
    or ``.ll`` text), bitcode bytes, or an llvmlite module; one ModuleSource per entry
    function. A module with one entry function keeps its bitcode byte for byte; one with
    several is cut into a module per function (module_split.py). `name` labels messages
    (default: the path).

    Raises:
        ReflectionError: the module cannot be parsed, or lacks what a library entry needs
            (an entry function, ``!air.version``, ``!air.language_version``, an AIR triple).
        OSError: the path cannot be read.
    """
    where, bitcode, text = _load(module, name)
    context = llvm.create_context()
    try:
        if text is None:
            parsed = parse_bitcode(f"pack: {where}", bitcode, context)
        else:
            try:
                parsed = llvm.parse_assembly(text, context=context)
            except RuntimeError as error:
                detail = str(error).replace("LLVM IR parsing error", "").strip().splitlines()
                raise ReflectionError(f"pack: {where}: LLVM cannot parse the IR text: "
                                      f"{detail[0] if detail else 'no module'}. Expected an AIR module in LLVM "
                                      f"assembly", function=where) from None
            bitcode = parsed.as_bitcode()
        try:
            printed = ModuleText(str(parsed))
            entries = _guarded(where, _entries, where, printed)
            if len(entries) == 1:
                return [_derive(where, bitcode, parsed.triple, printed, entries[0])]
            refs = {entry: ref for entry, _type, ref in entries}
            lists = [metadata for metadata in FUNCTION_LISTS if printed.named(metadata)]
            sources = []
            for entry, _type, _ref in entries:
                try:
                    part = cut_to_entry(printed.text, lists, entry, refs)
                except RuntimeError as error:  # the edited text does not parse: a shape the cut does not know
                    raise ReflectionError(f"pack: {where}: cutting out @{entry} failed ({str(error).strip()[:300]}); "
                                          f"expected a module LLVM can cut. Write one module per function",
                                          function=entry) from None
                sources.append(_part(f"{where} ({entry})", part, parsed.triple))
            return sources
        finally:
            parsed.close()
    finally:
        context.close()


def read_module(module, name: Optional[str] = None) -> ModuleSource:
    """`read_modules` for a module with one entry function; ReflectionError otherwise."""
    sources = read_modules(module, name)
    if len(sources) > 1:
        listed = ", ".join(f"{s.function.type} {s.function.name}" for s in sources)
        where = name or (os.fspath(module) if isinstance(module, (str, os.PathLike)) else "module")
        raise ReflectionError(f"pack: {where}: {len(sources)} entry functions ({listed}); expected one",
                              function=where)
    return sources[0]


def _part(where: str, bitcode: bytes, triple: str) -> ModuleSource:
    context = llvm.create_context()
    try:
        parsed = parse_bitcode(f"pack: {where}", bitcode, context)
        try:
            printed = ModuleText(str(parsed))
            entries = _guarded(where, _entries, where, printed)
            return _derive(where, bitcode, triple, printed, entries[0])
        finally:
            parsed.close()
    finally:
        context.close()


def _load(module, name):
    """(label, bitcode or None, IR text or None)."""
    if hasattr(module, "as_bitcode"):
        return name or "module", module.as_bitcode(), None
    if isinstance(module, (str, os.PathLike)):
        path = os.fspath(module)
        with open(path, "rb") as file:
            data = file.read()
        where = name or path
    else:
        data = bytes(module)
        where = name or f"bytes of {len(data)}"
    if data[:4] in (_BITCODE_MAGIC, _WRAPPER_MAGIC):
        return where, _raw_bitcode(where, data), None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is None or "\0" in text:
        raise ReflectionError(f"pack: {where}: expected LLVM bitcode ('BC' 0xC0DE, or Apple's wrapper "
                              f"0x0B17C0DE) or LLVM IR text; got {len(data)} bytes starting {data[:8].hex()}",
                              function=where)
    return where, None, text


def _raw_bitcode(where: str, data: bytes) -> bytes:
    if data[:4] != _WRAPPER_MAGIC:
        return data
    offset, size = int.from_bytes(data[8:12], "little"), int.from_bytes(data[12:16], "little")
    if len(data) < 20 or offset < 20 or offset + size > len(data) or data[offset:offset + 4] != _BITCODE_MAGIC:
        raise ReflectionError(f"pack: {where}: Darwin bitcode wrapper: expected offset >= 20 and offset + size "
                              f"<= {len(data)} over 'BC' 0xC0DE; got offset {offset}, size {size}",
                              function=where)
    return data[offset:offset + size]


def _derive(where: str, bitcode: bytes, triple: str, text: ModuleText, entry) -> ModuleSource:
    name, function_type, _ref = entry
    platform, version = _platform(where, triple, text)
    function = _guarded(where, lambda: FunctionSource(
        name=name, bitcode=bitcode, type=function_type, function_constants=_constants(where, text),
        air_version=_version(where, text, "air.version", 0),
        language_version=_version(where, text, "air.language_version", 1)))
    return ModuleSource(function, platform, version, _sdk_version(text), triple)


def _guarded(where: str, read, *args):
    """`read(*args)`, a malformed metadata node reported as a ReflectionError naming `where`."""
    try:
        return read(*args)
    except MalformedNode as error:
        raise ReflectionError(f"pack: {where}: metadata {error.node}: {error.detail}", function=where,
                              node=error.node) from None


def _entries(where: str, text: ModuleText) -> List[Tuple[str, str, str]]:
    """(name, type, node reference) of every entry function the module lists."""
    for metadata in _UNSUPPORTED_LISTS:
        if text.named(metadata):
            raise ReflectionError(
                f"pack: {where}: !{metadata} functions are not supported; expected kernel, vertex, fragment or "
                f"visible functions (!air.kernel, !air.vertex, !air.fragment, !air.visible)", function=where,
                node=f"!{metadata}")
    entries = []
    for metadata, function_type in FUNCTION_LISTS.items():
        for ref in text.named(metadata) or ():
            node = text.node(ref) if type(ref) is Ref else None
            if not node or not isinstance(node[0], GlobalRef):
                raise MalformedNode(f"!{metadata}", f"expected entries (ptr @function, ...), got {node!r}")
            name = str(node[0])
            if text.parameter_types(name) is None:
                raise MalformedNode(f"!{metadata}", f"names @{name}, but the module defines no such function")
            if any(name == earlier for earlier, _type, _ref in entries):
                raise MalformedNode(f"!{metadata}", f"lists @{name}, which another function list lists too")
            entries.append((name, function_type, str(ref)))
    if not entries:
        raise ReflectionError(
            f"pack: {where}: no entry function; expected a function listed in !air.kernel, !air.vertex, "
            f"!air.fragment or !air.visible, got none", function=where, node="!air.kernel")
    return entries


def _version(where: str, text: ModuleText, metadata: str, skip: int) -> Tuple[int, int]:
    refs = text.named(metadata)
    node = text.node(refs[0]) if refs and len(refs) == 1 else None
    numbers = node[skip:] if node else []
    if len(numbers) < 2 or not all(type(v) is int for v in numbers):
        shape = "!{i32 2, i32 6, i32 0}" if skip == 0 else '!{!"Metal", i32 3, i32 1, i32 0}'
        raise ReflectionError(f"pack: {where}: !{metadata}: expected one node {shape}, got "
                              f"{'none' if refs is None else node if node is not None else refs}", function=where,
                              node=f"!{metadata}")
    return (numbers[0], numbers[1])


def _constants(where: str, text: ModuleText) -> tuple:
    constants = []
    for ref in text.named("air.function_constants") or ():
        elements = text.node(ref)
        if [type(v) for v in elements[:5]] != [GlobalRef, str, str, int, bool]:
            raise MalformedNode(f"!{int(ref)}", "expected a function constant (initializer global, type, "
                                                f"name, index, required), got {elements!r}")
        _init, type_name, name, index, required = elements[:5]
        if type_name not in DATA_TYPES.values():
            raise MalformedNode(f"!{int(ref)}", f"function constant {name!r}: type {type_name!r} is not an "
                                                f"MTLDataType name")
        constants.append(FunctionConstant(name, type_name, index, required))
    return tuple(constants)


def _platform(where: str, triple: str, text: ModuleText) -> Tuple[str, Tuple[int, int, int]]:
    match = _TRIPLE.fullmatch(triple)
    os_name = _OS_NAMES.get(match.group(1)) if match else None
    platform = _ENVIRONMENTS.get((os_name, match.group(3)), os_name) if match else None
    if platform is None or (match.group(3) and (os_name, match.group(3)) not in _ENVIRONMENTS):
        raise ReflectionError(f"pack: {where}: target triple: expected an AIR triple such as "
                              f"'air64_v26-apple-macosx14.0.0' or 'air64-apple-ios17.0.0'; got {triple!r}",
                              function=where)
    if match.group(2):
        numbers = tuple(int(v) for v in match.group(2).split("."))
    else:  # no deployment target in the triple: the SDK's version is the best guess
        numbers = _sdk_version(text)
        if numbers is None:
            raise ReflectionError(f"pack: {where}: target triple {triple!r} has no OS version and the module has "
                                  f"no 'SDK Version' flag; pass platform_version", function=where)
    return platform, (numbers + (0, 0, 0))[:3]


def _sdk_version(text: ModuleText) -> Optional[Tuple[int, ...]]:
    match = _SDK_VERSION.search(text.text, text.metadata_start)
    return tuple(int(v.split()[-1]) for v in match.group(1).split(",")) if match else None

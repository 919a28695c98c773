"""Rules on a module's metadata: what Apple's compiler always writes and Metal reads (versions,
triple, module flags, entry functions and their argument nodes)."""

import re

from ..reflection.air_text import Ref
from .model import ERROR, WARNING, Rule

__all__ = ["RULES"]

_TRIPLE = re.compile(r"air64(?:_v(\d)(\d))?-apple-[a-z]+[\d.]*(?:-[a-z]+)?")
# Module flags present in every Apple-built module of the corpus (frame-pointer is not: older
# toolchains omit it).
_APPLE_FLAGS = ("SDK Version", "wchar_size", "air.max_device_buffers", "air.max_constant_buffers",
                "air.max_threadgroup_buffers", "air.max_textures", "air.max_read_write_textures",
                "air.max_samplers")
_FLAG = re.compile(r'^!\d+ = !\{i32 \d+, !"([^"]+)"', re.M)


def versions(view):
    """``!air.version`` ({i32 major, minor, patch}) and ``!air.language_version`` ({"Metal",
    major, minor, patch}) are in every Apple-built module; Apple's ``metallib`` tool copies them
    into the function's VERS tag, which Metal checks against the OS (docs/formats.md, "Where each
    tag comes from"). Metal.jl writes both for the same reason
    (https://github.com/JuliaGPU/GPUCompiler.jl/blob/7dd4056d9144e20e5a2912be9e81eda1c7d59336/src/metal.jl#L1445-L1465).
    Breaks: no library can be packed (VERS is unknown)."""
    air = view.named_node("air.version")
    if not air or len(air) < 2 or not all(type(v) is int for v in air[:3]):
        yield f"!air.version: expected one node !{{i32 2, i32 6, i32 0}}, got {air!r}. Add it"
    language = view.named_node("air.language_version")
    if not language or len(language) < 3 or not isinstance(language[0], str) \
            or not all(type(v) is int for v in language[1:4]):
        yield f'!air.language_version: expected one node !{{!"Metal", i32 3, i32 1, i32 0}}, got {language!r}. Add it'


def triple(view):
    """The triple is ``air64-apple-<os><version>`` or, from AIR 2.6, ``air64_v<major><minor>-...``
    with the AIR version of ``!air.version`` (every Apple-built module in the corpus: air64_v26
    with 2.6, air64_v28 with 2.8). "Tools like metal-opt derive the expected AIR version from the
    triple and complain when the air.version module metadata disagrees"
    (https://github.com/JuliaGPU/GPUCompiler.jl/blob/7dd4056d9144e20e5a2912be9e81eda1c7d59336/src/metal.jl#L77-L90).
    Breaks: Apple's tools refuse or misread the module."""
    match = _TRIPLE.fullmatch(view.triple)
    if not match:
        yield (f"target triple {view.triple!r}: expected an AIR triple such as 'air64_v26-apple-macosx14.0.0' "
               f"or 'air64-apple-macosx13.0.0'")
        return
    air = view.named_node("air.version")
    if match.group(1) and air and all(type(v) is int for v in air[:2]):
        if (int(match.group(1)), int(match.group(2))) != (air[0], air[1]):
            yield (f"target triple {view.triple!r} says AIR {match.group(1)}.{match.group(2)}, !air.version says "
                   f"{air[0]}.{air[1]}; expected the same. Write air64_v{air[0]}{air[1]} (or plain air64)")


def module_flags(view):
    """Apple's compiler writes the same module flags in every module (all Apple-built modules
    in the corpus): ``SDK Version``, ``wchar_size`` and the ``air.max_*`` resource limits, and
    ``!air.compile_options``; Metal.jl writes the same set
    (https://github.com/JuliaGPU/GPUCompiler.jl/blob/7dd4056d9144e20e5a2912be9e81eda1c7d59336/src/metal.jl#L1394-L1445).
    Hand-written modules without them have been reported to load
    (https://github.com/sueszli/llvm-to-air), so a missing one is a warning: Metal then applies
    its own defaults."""
    text = view.text.text
    present = set(_FLAG.findall(text, view.text.metadata_start))
    missing = [flag for flag in _APPLE_FLAGS if flag not in present]
    if missing:
        yield f"module flags: missing {', '.join(missing)}; expected every flag Apple's compiler writes"
    if view.text.named("air.compile_options") is None:
        yield "!air.compile_options: missing; expected the list Apple's compiler writes (e.g. air.compile.fast_math_disable)"


def entry_functions(view):
    """Each function an ``!air.kernel``/``!air.vertex``/``!air.fragment`` list names must be
    defined in the module; a kernel returns void (Metal Shading Language Specification, "Kernel
    Functions": a kernel function has a void return type,
    https://developer.apple.com/metal/Metal-Shading-Language-Specification.pdf). Breaks:
    ``newFunctionWithName`` finds nothing, or pipeline creation fails."""
    text = view.text.text
    for name, kind, _ref in view.entries:
        header = re.search(r'^(define|declare) ([^@\n]*)@"?' + re.escape(name) + r'"?\(', text, re.M)
        if not header or header.group(1) != "define":
            yield f"@{name}: listed in !air.{kind} but not defined in the module; expected its body"
        elif kind == "kernel" and not re.search(r"\bvoid\s*$", header.group(2)):
            yield f"@{name}: a kernel returning {header.group(2).split()[-1]}; expected void"


def argument_nodes(view):
    """Metal binds arguments from the entry's argument nodes, not from the IR: one node per
    parameter, in order, each ``!{i32 index, !"air.<kind>", ...}``; buffers name their
    ``air.location_index`` (the [[buffer(n)]] slot), ``air.arg_type_name`` and ``air.arg_name``
    (every buffer of every Apple-built module in the corpus; the names are AIR015's). "If air.location_index mismatches
    your pipeline bindings, the GPU driver will silently ignore your kernel or crash"
    (https://github.com/sueszli/llvm-to-air); Metal.jl writes the same keys
    (https://github.com/JuliaGPU/GPUCompiler.jl/blob/7dd4056d9144e20e5a2912be9e81eda1c7d59336/src/metal.jl#L1288-L1393).
    Breaks: wrong bindings (wrong results) or pipeline creation fails."""
    for name, kind, ref in view.entries:
        entry = view.text.node(int(ref.lstrip("!")))
        params = view.text.parameter_types(name) or []
        if len(entry) < 3 or type(entry[2]) is not Ref:
            yield f"@{name}: !air.{kind} entry {entry!r}: expected (function, outputs, arguments)"
            continue
        nodes = view.text.node(entry[2])
        if len(nodes) != len(params):
            yield (f"@{name}: {len(nodes)} argument nodes for {len(params)} parameters; expected one node per "
                   f"parameter")
        for position, node_ref in enumerate(nodes):
            node = view.text.node(node_ref) if type(node_ref) is Ref else []
            if len(node) < 2 or node[0] != position or not (isinstance(node[1], str) and node[1].startswith("air.")):
                yield (f"@{name}: argument {position}: expected !{{i32 {position}, !\"air.<kind>\", ...}}, got "
                       f"{node!r}")
                continue
            if node[1] == "air.buffer" and "air.location_index" not in node:
                yield f"@{name}: buffer argument {position}: missing air.location_index"


def argument_names(view):
    """Apple's compiler gives every buffer argument ``air.arg_type_name`` and ``air.arg_name``;
    Metal does not need them to bind or run a kernel (Mojo's kernels, which run on Apple GPUs
    through ``xcrun metallib``, have no ``air.arg_name``: https://github.com/modular/modular, whose
    Apple backend ``mojo build --emit air`` writes such modules), but reflection (MTLFunction's
    arguments, this project's ``inspect`` and keyword arguments) shows nameless, typeless
    buffers. Breaks: nothing at run time; arguments cannot be passed by name."""
    for name, kind, ref in view.entries:
        entry = view.text.node(int(ref.lstrip("!")))
        if len(entry) < 3 or type(entry[2]) is not Ref:
            continue
        for position, node_ref in enumerate(view.text.node(entry[2])):
            node = view.text.node(node_ref) if type(node_ref) is Ref else []
            if len(node) >= 2 and node[1] == "air.buffer":
                missing = [k for k in ("air.arg_type_name", "air.arg_name") if k not in node]
                if missing:
                    yield f"@{name}: buffer argument {position}: missing {', '.join(missing)}"


RULES = (
    Rule("AIR010", ERROR, "AIR and Metal versions", versions),
    Rule("AIR011", ERROR, "AIR triple", triple),
    Rule("AIR012", WARNING, "module flags", module_flags),
    Rule("AIR013", ERROR, "entry functions", entry_functions),
    Rule("AIR014", ERROR, "argument nodes", argument_nodes),
    Rule("AIR015", WARNING, "argument names", argument_names),
)

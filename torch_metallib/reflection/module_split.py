"""A module defining several entry functions cut into one module per function, as Apple's
``metallib`` tool does (each function of an Apple-built library has a module holding only it
and what it uses).

The cut is textual where llvmlite has no API (named metadata: the other entries are dropped
from the function lists) and LLVM's where it has one (the other entries made internal, then
global dead-code elimination removes them and whatever only they used). Function constants
are then cut as Apple's are (MLX's sdpa_vector_2pass_2, compiled in one module with kernels
using 7 constants, lists none): the ``air.static_init`` constructor stops copying constants
into globals nothing else reads, and ``!air.function_constants`` keeps the constants still read.
"""

import re
from typing import List

import llvmlite.binding as llvm

__all__ = ["cut_to_entry"]

_machine = None


def _pass_builder():
    global _machine
    if _machine is None:  # the passes here are target-independent; any registered target will do
        llvm.initialize_native_target()
        _machine = llvm.Target.from_default_triple().create_target_machine()
    return llvm.create_pass_builder(_machine, llvm.create_pipeline_tuning_options())


def cut_to_entry(text: str, lists: List[str], keep: str, entry_refs: dict) -> bytes:
    """The bitcode of printed module `text` cut to entry function `keep`.

    Args:
        lists: the named metadata listing entry functions (``air.kernel``...).
        entry_refs: entry function name -> its node reference (``!15``) in those lists.
    """
    kept = entry_refs[keep]
    for name in lists:
        text = re.sub(rf"^!{re.escape(name)} = !\{{[^\n]*\}}$",
                      lambda line: _filtered(line.group(0), name, kept), text, flags=re.M)
    context = llvm.create_context()
    try:
        module = llvm.parse_assembly(text, context=context)
        try:
            for function in module.functions:
                if function.name in entry_refs and function.name != keep and not function.is_declaration:
                    function.linkage = "internal"
            _remove_unused_globals(module)
            pruned = _prune_constants(str(module))
        finally:
            module.close()
        module = llvm.parse_assembly(pruned, context=context)
        try:
            _remove_unused_globals(module)
            return module.as_bitcode()
        finally:
            module.close()
    finally:
        context.close()


def _remove_unused_globals(module) -> None:
    dce = llvm.create_new_module_pass_manager()
    dce.add_global_dead_code_eliminate_pass()
    dce.run(module, _pass_builder())


_GLOBAL = r'@(?:"[^"]+"|[-\w.$]+)'
_STORE = re.compile(rf"^  store [^\n]*?, ptr addrspace\(2\) ({_GLOBAL})[,\n][^\n]*\n", re.M)
_DEFINITION = re.compile(r"^  (%[-\w.$]+) = ([^\n]*)\n", re.M)
_PURE_CALLS = ("@air.normalize_function_constant_predicate", "@air.is_function_constant_defined")


def _prune_constants(text: str) -> str:
    """`text` with the constructor's copies into unread globals, the loads only they needed,
    and the function constants no longer read removed."""
    constants = re.search(r"^!air\.function_constants = !\{([^\n]*)\}$", text, re.M)
    if constants is None:
        return text
    entries = {}
    for ref in re.findall(r"!\d+", constants.group(1)):
        line = re.search(rf"^{ref} = !\{{ptr addrspace\(2\) ({_GLOBAL}),[^\n]*$", text, re.M)
        if line is not None:
            entries[ref] = (line.group(1), line.group(0))
    constructors = [m for m in re.finditer(r'^define [^\n]*section "air\.static_init"[^\n]*\{\n(.*?)^\}$', text,
                                           re.M | re.S)]
    if not constructors:
        return text
    # Where a read counts: everything but global definitions, the constructors, llvm.compiler.used and
    # the constant list's own nodes.
    outside = text
    for match in reversed(constructors):
        outside = outside[:match.start()] + outside[match.end():]
    outside = "\n".join(line for line in outside.splitlines()
                        if not line.startswith(("@", "!air.function_constants"))
                        and line not in {entry for _global, entry in entries.values()})

    def read_outside(name: str) -> bool:
        return re.search(re.escape(name) + r"(?![-\w.$])", outside) is not None

    pieces, at, kept_compiler_used = [], 0, set()
    for match in constructors:
        body = match.group(1)
        body = _STORE.sub(lambda store: store.group(0) if read_outside(store.group(1)) else "", body)
        body = _without_dead_definitions(body)
        pieces += [text[at:match.start(1)], body]
        at = match.end(1)
        kept_compiler_used.update(re.findall(_GLOBAL, body))
    text = "".join(pieces) + text[at:]
    constructor_text = "".join(pieces[1::2])
    kept = [ref for ref, (name, _line) in entries.items()
            if read_outside(name) or re.search(re.escape(name) + r"(?![-\w.$])", constructor_text)]
    listed = f"!air.function_constants = !{{{', '.join(kept)}}}\n" if kept else ""
    text = text.replace(constants.group(0) + "\n", listed, 1)
    return _compiler_used(text, lambda name: read_outside(name) or name in kept_compiler_used)


def _without_dead_definitions(body: str) -> str:
    """`body` without the loads and pure computations whose values nothing uses (repeated
    until none is left)."""
    while True:
        removed = False
        for match in reversed(list(_DEFINITION.finditer(body))):
            value, rest = match.groups()
            if "call " in rest and not any(call in rest for call in _PURE_CALLS):
                continue
            if re.search(re.escape(value) + r"(?![-\w.$])", body[:match.start()] + body[match.end():]) is None:
                body = body[:match.start()] + body[match.end():]
                removed = True
        if not removed:
            return body


def _compiler_used(text: str, used) -> str:
    """``@llvm.compiler.used`` without the globals `used` says nothing reads."""
    line = re.search(r"^@llvm\.compiler\.used = appending global \[\d+ x ptr\] \[(.*)\], section "
                     r'"llvm\.metadata"$', text, re.M)
    if line is None:
        return text
    entry = re.compile(r"ptr (?:addrspacecast \(ptr addrspace\(\d+\) (" + _GLOBAL + r") to ptr\)|(" + _GLOBAL + r"))")
    entries = [(m.group(0), m.group(1) or m.group(2)) for m in entry.finditer(line.group(1))]
    keep = [text_ for text_, name in entries if used(name)]
    if len(keep) == len(entries):
        return text
    new = (f"@llvm.compiler.used = appending global [{len(keep)} x ptr] [{', '.join(keep)}], "
           f'section "llvm.metadata"' if keep else "")
    return text.replace(line.group(0), new, 1)


def _filtered(line: str, name: str, kept: str) -> str:
    refs = re.findall(r"!\d+", line[line.index("{"):])
    if kept in refs:
        return f"!{name} = !{{{kept}}}"
    return ""  # a list without the kept entry is left out altogether

"""Reflection on bad input: ReflectionError naming the function and the metadata node.

Each case edits one metadata line of a fixture's IR (tests/fixtures/*.ll), assembles it
with LLVM, packs it next to an untouched fixture and loads the library. The edited
function must fail with a ReflectionError (a ValueError) whose message names the
function, the node, what was expected and what was found; loading the library and
reflecting the untouched function must not be affected. Metadata the reader does not
know (new argument keys, new kernel attributes) must be kept, not rejected.
"""

import functools
import re
import threading
import traceback
from typing import NamedTuple, Optional, Tuple

import llvmlite.binding as llvm
import pytest

import torch_metallib as tm
import torch_metallib.library.function as function_module
import torch_metallib.reflection.reflect as reflection_module
from conftest import FIXTURES, fixture_bitcode

NEIGHBOUR = "scale_shift_float"  # the untouched fixture packed after every edited one
BITCODE_MAGIC = b"BC\xc0\xde"


# --- helpers --------------------------------------------------------------------------

def edit_ir(fixture: str, line: str, old: str, new: str, add: str = "") -> str:
    """The fixture's IR with `old` replaced by `new` on the metadata line `line` (e.g.
    ``"!19"`` or ``"!air.kernel"``), and `add` appended. Asserts that the line and `old`
    occur exactly once, so a stale edit cannot make a test check nothing."""
    lines = (FIXTURES / f"{fixture}.ll").read_text().splitlines(keepends=True)
    found = [i for i, text in enumerate(lines) if text.startswith(f"{line} = ")]
    assert len(found) == 1, f"{fixture}.ll: expected one line {line}, found {len(found)}"
    text = lines[found[0]]
    assert text.count(old) == 1, f"{fixture}.ll {line}: {old!r} occurs {text.count(old)} times"
    lines[found[0]] = text.replace(old, new)
    return "".join(lines) + add


def assemble(ir: str) -> bytes:
    return llvm.parse_assembly(ir, context=llvm.create_context()).as_bitcode()


def printed_label(ir: str, fragment: str) -> str:
    """The label LLVM gives the one node containing `fragment` when it prints the module
    (what reflection reads and reports; new nodes get renumbered)."""
    text = str(llvm.parse_assembly(ir, context=llvm.create_context()))
    labels = re.findall(rf"^(!\d+) = [^\n]*{re.escape(fragment)}", text, re.M)
    assert len(labels) == 1, f"{fragment!r} is in {len(labels)} printed nodes"
    return labels[0]


def pack_with_neighbour(name: str, bitcode: bytes, type: str = "kernel") -> bytes:
    return tm.pack([tm.FunctionSource(name, bitcode, type=type),
                    tm.FunctionSource(NEIGHBOUR, fixture_bitcode(NEIGHBOUR))])


def edited_library(fixture: str, line: str, old: str, new: str, add: str = "",
                   type: str = "kernel") -> Tuple[tm.Library, bytes, str]:
    """(library, its bytes, the edited IR) for one edit of `fixture` (see edit_ir)."""
    ir = edit_ir(fixture, line, old, new, add)
    data = pack_with_neighbour(fixture, assemble(ir), type=type)
    return tm.load(data), data, ir


@functools.lru_cache(maxsize=None)
def clean_reflection(name: str) -> tm.Reflection:
    """The reflection of the untouched fixture, packed alone."""
    return tm.load(tm.pack([tm.FunctionSource(name, fixture_bitcode(name))]))[name].reflection


def assert_message_is_clean(error: tm.ReflectionError) -> None:
    """The message and the printed traceback show no internal exception or object repr."""
    message = str(error)
    for internal in ("MalformedNode", "Traceback", " object at 0x", "torch_metallib."):
        assert internal not in message, message
    assert error.__cause__ is None and (error.__context__ is None or error.__suppress_context__)
    printed = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    assert "MalformedNode" not in printed and "During handling" not in printed, printed


def assert_others_unaffected(library: tm.Library, data: bytes, name: str) -> None:
    """The library loads (also with verify) and the untouched function still reflects."""
    for reloaded in (tm.load(data), tm.load(data, verify=True)):
        assert reloaded.function_names == (name, NEIGHBOUR)
    assert library[name].name == name and len(library[name].hash) == 64
    assert library[NEIGHBOUR].reflection == clean_reflection(NEIGHBOUR)
    assert library[NEIGHBOUR].signature == clean_reflection(NEIGHBOUR).signature


def assert_reflection_error(library: tm.Library, data: bytes, name: str, node: Optional[str],
                            *words: str) -> tm.ReflectionError:
    """Reflecting `name` raises a ReflectionError for `node` whose message has `words`;
    the rest of the library is unaffected."""
    with pytest.raises(tm.ReflectionError) as info:
        library[name].reflection
    error = info.value
    assert isinstance(error, ValueError) and isinstance(error, tm.TorchMetallibError)
    assert error.function == name
    assert error.node == node
    message = str(error)
    for word in (f"{name}:", *([node] if node else []), *words):
        assert word in message, f"{word!r} not in {message!r}"
    assert_message_is_clean(error)
    assert_others_unaffected(library, data, name)
    return error


# --- malformed metadata ---------------------------------------------------------------

class Case(NamedTuple):
    fixture: str
    line: str  # the metadata line edited
    old: str
    new: str
    node: str  # the node reported: a literal "!air.kernel", or "@" + a fragment of it
    words: Tuple[str, ...]  # what the message must say (expected / found)
    add: str = ""


ARG_B = '@!"air.arg_name", !"b"'  # vector_add_float's argument node for `b`
ARG_A = '@!"air.arg_name", !"a"'
MAX_THREADS = '@!"air.max_work_group_size"'

CASES = {
    "no_kernel_metadata": Case(
        "vector_add_float", "!air.kernel", "!air.kernel = !{!15}", "", "!air.kernel",
        ("expected an entry for @vector_add_float", "found no !air.kernel metadata")),
    "empty_kernel_metadata": Case(
        "vector_add_float", "!air.kernel", "!air.kernel = !{!15}", "!air.kernel = !{}", "!air.kernel",
        ("expected an entry for @vector_add_float", "found 0 !air.kernel entries")),
    "two_access_keys": Case(
        "vector_add_float", "!19", '!"air.read",', '!"air.read", !"air.write",', ARG_B,
        ("argument 'b'", "expected one access key", "got ['read', 'write']")),
    "repeated_key": Case(
        "vector_add_float", "!19", '!"air.arg_name", !"b"', '!"air.arg_name", !"b", !"air.arg_name", !"c"',
        ARG_B, ("'air.arg_name' appears twice",)),
    "location_index_not_integer": Case(
        "vector_add_float", "!19", '!"air.location_index", i32 1,', '!"air.location_index", !"one",',
        ARG_B, ("expected an integer after 'air.location_index'", 'got !"one"')),
    "position_not_integer": Case(
        "vector_add_float", "!19", "!{i32 1, ", '!{!"one", ', ARG_B,
        ("expected the parameter position (an integer)", 'got !"one"')),
    "argument_missing": Case(
        "vector_add_float", "!17", "!18, !19, !20", "!18, !20", "!17",
        ("argument positions of @vector_add_float", "one node per parameter 0..3", "got [0, 2, 3]")),
    "address_space_7": Case(
        "vector_add_float", "!18", '!"air.address_space", i32 1', '!"air.address_space", i32 7', ARG_A,
        ("'air.address_space' of 'a'", "expected 1 (device), 2 (constant) or 3 (threadgroup)",
         "got 7")),
    "buffer_without_location_index": Case(
        "vector_add_float", "!19", '!"air.location_index", i32 1, i32 1, ', "", ARG_B,
        ("'air.buffer' argument 'b'", "has no 'air.location_index'")),
    "struct_info_wrong_length": Case(
        "struct_arg_axpy", "!21", ', !"uint", !"n"}', ', !"uint"}', '@!"alpha"',
        ("expected a member (offset, size, array length, type, name)", "got [4, 4, 0, 'uint']")),
    "struct_info_reference_cycle": Case(
        "struct_arg_axpy", "!21", "!{i32 0, i32 4,", '!{!"air.struct_type_info", !21, i32 0, i32 4,',
        '@!"alpha"', ("struct members nest deeper than 16 levels", "reference cycle")),
    "max_threads_not_integer": Case(
        "vector_add_float", "!15", "!17}", "!17, !90}", MAX_THREADS,
        ("expected ('air.max_work_group_size', positive integer)", "'many'"),
        add='!90 = !{!"air.max_work_group_size", !"many"}\n'),
    "max_threads_zero": Case(
        "vector_add_float", "!15", "!17}", "!17, !90}", MAX_THREADS,
        ("expected ('air.max_work_group_size', positive integer)", "got ['air.max_work_group_size', 0]"),
        add='!90 = !{!"air.max_work_group_size", i32 0}\n'),
    "function_constant_wrong_shape": Case(
        "function_constant_scale", "!30", ", i1 true}", "}", '@!"alpha", i32 1',
        ("expected a function constant (initializer global, type, name, index, required)",
         "got [@_Z5alpha.MTL_FC_INIT_1_f, 'float', 'alpha', 1]")),
    # LLVM's assembler rejects a reference to an undefined node (see the test below), so
    # the nearest AIR-shaped input is a reference to a node that is not a tuple !{...}.
    "reference_to_non_tuple_node": Case(
        "struct_arg_axpy", "!20", '!"air.struct_type_info", !21', '!"air.struct_type_info", !90',
        "@!DIFile(",
        ("expected a tuple node !{...}", "got '!DIFile(filename"),
        add='!90 = !DIFile(filename: "p.metal", directory: "/tmp")\n'),
}


def expected_node(case: Case, ir: str) -> str:
    return printed_label(ir, case.node[1:]) if case.node.startswith("@") else case.node


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_malformed_metadata_raises_reflection_error(case):
    library, data, ir = edited_library(case.fixture, case.line, case.old, case.new, case.add)
    assert_reflection_error(library, data, case.fixture, expected_node(case, ir), *case.words)


def test_unparseable_bitcode():
    """Bytes with the bitcode magic but garbage after it: pack and load take them (they
    check the magic only), reflection reports that llvmlite cannot parse them, node None."""
    garbage = BITCODE_MAGIC + bytes(range(7, 250, 3)) * 4
    data = pack_with_neighbour("vector_add_float", garbage)
    library = tm.load(data)
    assert bytes(library["vector_add_float"].bitcode).startswith(BITCODE_MAGIC)
    assert_reflection_error(library, data, "vector_add_float", None,
                            "llvmlite", "cannot parse the function's bitcode", "corrupt")


def test_undefined_node_reference_cannot_be_assembled():
    """Why no case above references a node that does not exist: LLVM refuses such IR, and
    every node a module references is printed with it."""
    ir = edit_ir("vector_add_float", "!17", "!21}", "!99}")
    with pytest.raises(RuntimeError, match=r"undefined metadata '!99'"):
        assemble(ir)


def test_reference_to_missing_node(monkeypatch):
    """The reader's own check for a node absent from the printed module: drop !19's line
    from the text reflection reads. The failure is reported for !19, is not cached, and the
    same function reflects once the text is whole again."""
    name = "vector_add_float"
    data = pack_with_neighbour(name, fixture_bitcode(name))
    library = tm.load(data)

    module_text = reflection_module.ModuleText

    def without_node_19(text):
        text, count = re.subn(r"^!19 = [^\n]*\n", "", text, flags=re.M)
        assert count == 1
        return module_text(text)

    with monkeypatch.context() as patch:
        patch.setattr(reflection_module, "ModuleText", without_node_19)
        with pytest.raises(tm.ReflectionError) as info:
            library[name].reflection
    error = info.value
    assert (error.function, error.node) == (name, "!19")
    assert f"{name}: AIR metadata node !19: no such node in the module" in str(error)
    assert_message_is_clean(error)
    assert library[name].reflection == clean_reflection(name)
    assert_others_unaffected(library, data, name)


def test_vertex_function_is_read_from_its_own_entry():
    """A vertex function is listed in !air.vertex: one whose module has only an
    !air.kernel entry is malformed, and the message names the metadata it looked for."""
    library, data, _ = edited_library("vector_add_float", "!air.kernel", "!air.kernel = !{!15}", "",
                                      type="vertex")
    assert library["vector_add_float"].type == "vertex"
    assert_reflection_error(library, data, "vector_add_float", "!air.vertex",
                            "expected an entry for @vector_add_float; found no !air.vertex metadata")


def test_function_type_without_argument_table_is_refused_by_name():
    """A visible function has no argument table: reflection says so instead of calling the
    metadata malformed."""
    library, data, _ = edited_library("vector_add_float", "!air.kernel", "!air.kernel = !{!15}", "",
                                      type="visible")
    error = assert_reflection_error(library, data, "vector_add_float", None,
                                    "reflection reads kernel, vertex and fragment functions",
                                    "this is a visible function")
    assert "please report" not in str(error)


# --- metadata this version does not know is kept --------------------------------------

def test_unknown_argument_key_is_kept_in_extra():
    """A future key with values inside an argument node lands in Argument.extra; the
    argument is otherwise what it was without the key."""
    library, data, _ = edited_library("vector_add_float", "!19", '!"air.read", ',
                                      '!"air.read", !"air.future_key", i32 7, !"x", ')
    reflection = library["vector_add_float"].reflection
    clean = clean_reflection("vector_add_float")
    b = clean.arguments[1]
    assert b.name == "b" and b.extra == ()
    assert reflection.arguments[1] == b._replace(extra=(("air.future_key", (7, "x")),))
    assert reflection.arguments[1].extra == (("air.future_key", (7, "x")),)
    others = (0, 2, 3)
    assert [reflection.arguments[i] for i in others] == [clean.arguments[i] for i in others]
    assert reflection.signature == clean.signature
    assert_others_unaffected(library, data, "vector_add_float")


def test_unknown_kernel_attribute_is_kept_in_extra():
    """A future kernel attribute node (4th element of the !air.kernel entry) lands in
    Reflection.extra and does not set max_total_threads_per_threadgroup."""
    library, data, _ = edited_library("vector_add_float", "!15", "!17}", "!17, !90}",
                                      add='!90 = !{!"air.future_attribute", i32 3}\n')
    reflection = library["vector_add_float"].reflection
    assert reflection.extra == (("air.future_attribute", (3,)),)
    assert reflection.max_total_threads_per_threadgroup is None
    assert library["vector_add_float"].max_total_threads_per_threadgroup is None
    assert reflection.arguments == clean_reflection("vector_add_float").arguments
    assert_others_unaffected(library, data, "vector_add_float")


# --- caching ----------------------------------------------------------------------------

def counting_reflect(monkeypatch) -> list:
    """Replaces the reflect KernelFunction calls with a wrapper; returns its call log."""
    calls = []

    def wrapper(*args, **kwargs):
        calls.append(args[0])
        return reflection_module.reflect(*args, **kwargs)

    monkeypatch.setattr(function_module, "reflect", wrapper)
    return calls


def test_failed_reflection_is_not_cached(monkeypatch):
    """Every access to a function whose reflection failed retries and raises again; the
    other function's reflection is computed once and cached."""
    calls = counting_reflect(monkeypatch)
    case = CASES["address_space_7"]
    library, data, _ = edited_library(case.fixture, case.line, case.old, case.new)
    function = library["vector_add_float"]
    errors = []
    for _ in range(2):
        with pytest.raises(tm.ReflectionError) as info:
            function.arguments
        errors.append(info.value)
    with pytest.raises(tm.ReflectionError):
        function.signature
    assert calls == ["vector_add_float"] * 3
    assert errors[0] is not errors[1] and str(errors[0]) == str(errors[1])
    first = library[NEIGHBOUR].reflection
    assert library[NEIGHBOUR].arguments is first.arguments
    assert library[NEIGHBOUR].reflection is first
    assert first == clean_reflection(NEIGHBOUR)
    assert calls == ["vector_add_float"] * 3 + [NEIGHBOUR]


def test_concurrent_first_access_reflects_once(monkeypatch):
    """Threads asking for the same function's reflection at once get one shared object,
    computed by a single reflect call."""
    calls = counting_reflect(monkeypatch)
    name = "vector_add_float"
    library = tm.load(pack_with_neighbour(name, fixture_bitcode(name)))
    threads_count = 8
    barrier = threading.Barrier(threads_count)
    results = [None] * threads_count
    failures = []

    def read(slot):
        try:
            barrier.wait()
            results[slot] = library[name].reflection
        except BaseException as error:  # noqa: BLE001 - reported by the main thread
            failures.append(error)

    threads = [threading.Thread(target=read, args=(slot,)) for slot in range(threads_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert all(result is results[0] for result in results)
    assert results[0] == clean_reflection(name)
    assert calls == [name]

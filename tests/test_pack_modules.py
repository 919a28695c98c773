"""`tm.pack_modules` and `python -m torch_metallib pack` on the project's AIR fixtures: what is
derived from a module, the inputs accepted, and the modules refused."""

import subprocess
import sys

import llvmlite.binding as llvm
import pytest

import torch_metallib as tm
from conftest import FIXTURE_CONSTANTS, FIXTURES, fixture_bitcode
from torch_metallib.reflection.module_source import read_module
from torch_metallib.reflection.pack_modules import file_version_for

KERNEL = "function_constant_scale"


def ir(name=KERNEL) -> str:
    return (FIXTURES / f"{name}.ll").read_text()


def test_modules_pack_like_hand_written_sources(fixture_sources, tmp_path):
    """The fixtures packed from their .ll files equal the library packed by hand with the
    names, constants and versions written out (tests/fixtures/pack_fixtures.py)."""
    paths = []
    for source in fixture_sources:
        path = tmp_path / f"{source.name}.ll"
        path.write_text((FIXTURES / f"{source.name}.ll").read_text())
        paths.append(path)
    assert tm.pack_modules(paths) == tm.pack(fixture_sources)
    library = tm.load(tm.pack_modules(paths))
    assert tuple(library[KERNEL].declared_constants) == FIXTURE_CONSTANTS[KERNEL]


def test_bitcode_inputs_raw_wrapped_bytes_and_modules_agree(tmp_path):
    wrapped = fixture_bitcode(KERNEL)           # Apple's 20-byte wrapper, as llvmlite writes it
    raw = bytes(tm.load(tm.pack_modules([wrapped]))[KERNEL].bitcode)
    (tmp_path / "k.air").write_bytes(wrapped)
    (tmp_path / "k.bc").write_bytes(raw)
    module = llvm.parse_assembly(ir(), context=llvm.create_context())
    packed = {tm.pack_modules([x]) for x in (wrapped, raw, tmp_path / "k.air", str(tmp_path / "k.bc"), module)}
    assert len(packed) == 1


@pytest.mark.parametrize("triple, platform, version, file_version", [
    ("air64_v26-apple-macosx14.0.0", "macos", (14, 0, 0), (1, 2, 7)),
    ("air64-apple-macosx12.6.0", "macos", (12, 6, 0), (1, 2, 6)),
    ("air64_v27-apple-macosx15.5.0", "macos", (15, 5, 0), (1, 2, 8)),
    ("air64_v28-apple-macosx26.2.0", "macos", (26, 2, 0), (1, 2, 9)),
    ("air64-apple-ios17.0.0", "ios", (17, 0, 0), (1, 2, 7)),
    ("air64-apple-ios17.0.0-simulator", "ios_simulator", (17, 0, 0), (1, 2, 7)),
    ("air64-apple-ios17.0-macabi", "maccatalyst", (17, 0, 0), (1, 2, 7)),
    ("air64_v28-apple-xros26.0", "visionos", (26, 0, 0), (1, 2, 9)),
    ("air64-apple-macosx", "macos", (26, 5, 0), (1, 2, 9)),     # no deployment target: the SDK's
])
def test_platform_and_versions_come_from_the_triple(triple, platform, version, file_version):
    text = ir().replace('target triple = "air64_v26-apple-macosx14.0.0"', f'target triple = "{triple}"')
    source = read_module(text.encode())
    assert (source.platform, source.platform_version, source.sdk_version) == (platform, version, (26, 5))
    assert file_version_for(platform, version) == file_version
    library = tm.load(tm.pack_modules([text.encode()]))
    assert (library.platform, library.platform_version, library.file_version) == (platform, version, file_version)
    assert (library[KERNEL].air_version, library[KERNEL].language_version) == ((2, 6), (3, 1))


def test_versions_come_from_the_metadata():
    text = ir().replace("!10 = !{i32 2, i32 6, i32 0}", "!10 = !{i32 2, i32 8, i32 0}") \
               .replace('!11 = !{!"Metal", i32 3, i32 1, i32 0}', '!11 = !{!"Metal", i32 4, i32 0, i32 0}')
    function = tm.load(tm.pack_modules([text.encode()]))[KERNEL]
    assert (function.air_version, function.language_version) == ((2, 8), (4, 0))


def test_the_header_takes_the_highest_target_and_overrides():
    newer = ir("vector_add_float").replace("macosx14.0.0", "macosx15.5.0").encode()
    library = tm.load(tm.pack_modules([ir().encode(), newer]))
    assert (library.platform_version, library.file_version) == ((15, 5, 0), (1, 2, 8))
    library = tm.load(tm.pack_modules([ir().encode()], platform_version=(13, 0, 0), file_version=(1, 2, 6)))
    assert (library.platform_version, library.file_version) == ((13, 0, 0), (1, 2, 6))


def edit(old, new, name=KERNEL):
    text = ir(name)
    assert old in text
    return text.replace(old, new).encode()


@pytest.mark.parametrize("modules, words", [
    ([edit("!air.kernel = !{!15}", "!air.kernel = !{!15}\n!air.visible = !{!15}")],
     "lists @function_constant_scale, which another function list lists too"),
    ([edit("!air.kernel = !{!15}\n", "")], "no entry function; expected a function listed in !air.kernel"),
    ([edit("!air.kernel = !{!15}", "!air.kernel = !{!15}\n!air.mesh = !{!15}")], "!air.mesh functions are not supported"),
    ([edit("!air.version = !{!10}\n", "")], "!air.version: expected one node !{i32 2, i32 6, i32 0}, got none"),
    ([edit("!air.language_version = !{!11}\n", "")], '!air.language_version: expected one node !{!"Metal"'),
    ([edit("air64_v26-apple-macosx14.0.0", "x86_64-unknown-linux-gnu")],
     "target triple: expected an AIR triple such as 'air64_v26-apple-macosx14.0.0'"),
    ([edit('!"bool", !"use_bias"', '!"double", !"use_bias"')], "type 'double' is not an MTLDataType name"),
    ([ir().encode(), edit("macosx14.0.0", "ios17.0.0", "vector_add_float")], "the modules target 2 platforms"),
    ([b"hello"], "LLVM cannot parse the IR text: <string>:1:1: error: expected top-level entity"),
    ([b"\x00\x01garbage"], "expected LLVM bitcode ('BC' 0xC0DE, or Apple's wrapper 0x0B17C0DE) or LLVM IR text"),
    ([b"\xde\xc0\x17\x0b" + bytes(4) + (99).to_bytes(4, "little") + bytes(8)], "Darwin bitcode wrapper"),
    ([b"BC\xc0\xde" + bytes(12)], "cannot parse the function's bitcode"),
], ids=["listed-twice", "no-entry", "mesh", "no-air-version", "no-language-version", "not-air", "bad-constant-type",
        "mixed-platforms", "bad-text", "not-a-module", "bad-wrapper", "bad-bitcode"])
def test_modules_without_what_a_library_needs_are_refused(modules, words):
    with pytest.raises(tm.ReflectionError) as error:
        tm.pack_modules(modules)
    assert words in str(error.value)
    assert str(error.value).startswith("pack: ")


def linked(*names):
    """One module defining the fixture kernels `names` (llvmlite's linker appends their metadata)."""
    context = llvm.create_context()
    modules = [llvm.parse_assembly(ir(name), context=context) for name in names]
    for module in modules[1:]:
        modules[0].link_in(module)
    return modules[0]


def test_a_module_with_several_functions_is_cut_into_one_per_function():
    """As in Apple's libraries: each function gets a module holding only what it uses, and only
    the function constants it reads (vector_add_float reads none of its neighbour's)."""
    import torch

    library = tm.load(tm.pack_modules([linked("vector_add_float", KERNEL, "threadgroup_sum_float")]))
    assert library.function_names == ("vector_add_float", KERNEL, "threadgroup_sum_float")
    assert library.vector_add_float.declared_constants == [] and library.threadgroup_sum_float.declared_constants == []
    assert tuple(library[KERNEL].declared_constants) == FIXTURE_CONSTANTS[KERNEL]
    for name in library.function_names:
        module = llvm.parse_bitcode(bytes(library[name].bitcode), context=llvm.create_context())
        assert [f.name for f in module.functions if not f.is_declaration and not f.name.startswith("_GLOBAL__")] \
            == [name]
        alone = tm.load(tm.pack_modules([ir(name).encode()]))[name]
        assert library[name].signature == alone.signature and library[name].arguments == alone.arguments
    a, b, c = torch.randn(100), torch.randn(100), torch.empty(100)
    library.vector_add_float(a, b, c)
    assert torch.equal(c, a + b)
    bias, out = torch.randn(100), torch.empty(100)
    library[KERNEL](a, out, bias, constants={"use_bias": True, "alpha": 2.0})
    expected = torch.empty(100)
    tm.load(tm.pack_modules([ir().encode()]))[KERNEL](a, expected, bias, constants={"use_bias": True, "alpha": 2.0})
    assert torch.equal(out, expected)


def test_cut_function_constants_are_apples(mlx_lib):
    """Kernels MLX compiles from one source file (sdpa_vector*: 6, 7 and no constants), linked
    into one module and cut again, list the constants Apple's tool listed for each."""
    names = [next(n for n in mlx_lib.function_names if n.startswith(prefix)) for prefix in (
        "sdpa_vector_float16_t_64_64", "sdpa_vector_2pass_1_float16_t_64_64", "sdpa_vector_2pass_2_float16_t_64")]
    context = llvm.create_context()
    modules = [llvm.parse_bitcode(bytes(mlx_lib[name].bitcode), context=context) for name in names]
    for module in modules[1:]:
        modules[0].link_in(module)
    library = tm.load(tm.pack_modules([modules[0]]))
    assert [len(library[n].declared_constants) for n in names] == [6, 7, 0]
    for name in names:
        assert library[name].declared_constants == mlx_lib[name].declared_constants
        assert library[name].arguments == mlx_lib[name].arguments


def test_duplicate_functions_are_refused_as_pack_does():
    with pytest.raises(ValueError, match="duplicate name"):
        tm.pack_modules([ir().encode(), ir().encode()])


def test_the_error_names_the_file(tmp_path):
    path = tmp_path / "kernel.ll"
    path.write_bytes(edit("!air.version = !{!10}\n", ""))
    with pytest.raises(tm.ReflectionError, match=f"pack: {path}: !air.version"):
        tm.pack_modules([path])


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "torch_metallib", *map(str, args)], capture_output=True, text=True,
                          timeout=300)


def test_cli_packs_modules(tmp_path, fixture_sources):
    paths = [FIXTURES / f"{source.name}.ll" for source in fixture_sources]
    out = tmp_path / "lib.metallib"
    result = run_cli("pack", *paths, "-o", out)
    assert result.returncode == 0, result.stderr
    assert out.read_bytes() == tm.pack(fixture_sources)
    assert "kernel function_constant_scale: AIR 2.6, Metal 3.1, 2 function constants" in result.stdout
    assert f"wrote {out}: {len(paths)} functions, macos 14.0.0, format 1.2.7" in result.stdout
    result = run_cli("pack", paths[0], "-o", out, "--platform-version", "15.5", "--file-version", "1.2.8")
    assert result.returncode == 0, result.stderr
    assert (tm.load(out).platform_version, tm.load(out).file_version) == ((15, 5, 0), (1, 2, 8))


def test_cli_warns_about_bitcode_metal_would_refuse(tmp_path, mlx_lib):
    """IR text is packed as llvmlite's LLVM writes it (opaque pointers): the command says
    Metal is expected to refuse it; an Apple-built module, repacked, draws no warning."""
    out = tmp_path / "lib.metallib"
    result = run_cli("pack", FIXTURES / "vector_add_float.ll", "-o", out)
    assert result.returncode == 0 and "warning: 1 of 1 functions (vector_add_float)" in result.stderr, result.stderr
    apple = tmp_path / "apple.air"
    apple.write_bytes(bytes(mlx_lib[mlx_lib.function_names[0]].bitcode))
    result = run_cli("pack", apple, "-o", out)
    assert result.returncode == 0 and "warning" not in result.stderr, result.stderr


def test_cli_reports_a_bad_module_without_a_traceback(tmp_path):
    bad = tmp_path / "bad.ll"
    bad.write_bytes(edit("!air.kernel = !{!15}\n", ""))
    result = run_cli("pack", bad, "-o", tmp_path / "lib.metallib")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith(f"error: pack: {bad}: no entry function")
    assert not (tmp_path / "lib.metallib").exists()

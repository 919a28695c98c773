"""The writer on the project's own AIR fixtures: pack, read back, round trip."""

import hashlib
import struct

import llvmlite.binding as llvm
import pytest

import torch_metallib as tm
from conftest import FIXTURE_CONSTANTS, FIXTURE_KERNELS, FIXTURES, fixture_bitcode, raw_bitcode
from _bytes_diff import first_difference


def test_fixture_set_is_complete():
    assert {"vector_add_float", "scale_shift_float", "function_constant_scale",
            "threadgroup_sum_float", "struct_arg_axpy"} <= set(FIXTURE_KERNELS)


def test_packed_fixtures_read_back(fixture_metallib, fixture_sources):
    lib = tm.load(fixture_metallib, verify=True)
    assert lib.function_names == tuple(s.name for s in fixture_sources)
    assert (lib.file_version, lib.file_type, lib.platform, lib.platform_version) == \
        ((1, 2, 7), "executable", "macos", (14, 0, 0))
    for source in fixture_sources:
        function = lib[source.name]
        assert function.type == "kernel"
        assert function.air_version == (2, 6) and function.language_version == (3, 1)
        assert bytes(function.bitcode) == raw_bitcode(source.bitcode)
        assert tuple(function.declared_constants) == FIXTURE_CONSTANTS.get(source.name, ())
        assert hashlib.sha256(bytes(function.module)).hexdigest() == function.hash


def test_modules_use_apples_wrapper_and_padding(fixture_metallib, fixture_sources):
    lib = tm.load(fixture_metallib)
    for source in fixture_sources:
        module = bytes(lib[source.name].module)
        bitcode = raw_bitcode(source.bitcode)
        magic, version, offset, size, cputype = struct.unpack_from("<5I", module)
        assert (magic, version, offset, size, cputype) == \
            (0x0B17C0DE, 0, 20, len(bitcode), 0xFFFFFFFF)
        assert module[20:20 + size] == bitcode
        assert len(module) % 16 == 0 and len(module) - (20 + size) < 16
        assert module[20 + size:] == bytes(len(module) - 20 - size)


def test_packed_bitcode_parses_back_to_the_kernel(fixture_metallib):
    lib = tm.load(fixture_metallib)
    for name in lib:
        module = llvm.parse_bitcode(bytes(lib[name].bitcode), context=llvm.create_context())
        assert name in [f.name for f in module.functions]


def test_pack_is_deterministic_and_round_trips(fixture_sources, fixture_metallib):
    assert tm.pack(fixture_sources) == fixture_metallib
    written = tm.load(fixture_metallib).to_bytes()
    assert written == fixture_metallib, first_difference(written, fixture_metallib)
    other = tm.pack(fixture_sources[:2])
    assert tm.load(other).uuid != tm.load(fixture_metallib).uuid


def test_subset_of_packed_library(fixture_metallib):
    lib = tm.load(fixture_metallib)
    data = lib.subset(["struct_arg_axpy", "vector_add_float"])
    sub = tm.load(data, verify=True)
    assert sub.function_names == ("struct_arg_axpy", "vector_add_float")
    assert bytes(sub["vector_add_float"].bitcode) == raw_bitcode(fixture_bitcode("vector_add_float"))


def test_pack_accepts_an_llvmlite_module_and_raw_bitcode():
    module = llvm.parse_assembly((FIXTURES / "vector_add_float.ll").read_text(),
                                 context=llvm.create_context())
    from_module = tm.pack([tm.FunctionSource("vector_add_float", module)])
    raw = raw_bitcode(module.as_bitcode())
    assert tm.pack([tm.FunctionSource("vector_add_float", raw)]) == from_module
    assert bytes(tm.load(from_module)["vector_add_float"].bitcode) == raw


def _source(**changes):
    fields = dict(name="k", bitcode=fixture_bitcode("vector_add_float"))
    fields.update(changes)
    return tm.FunctionSource(**fields)


@pytest.mark.parametrize("sources, kwargs, error, words", [
    ([_source(), _source()], {}, ValueError, "duplicate name"),
    ([_source(bitcode=b"; text IR")], {}, ValueError, "bitcode magic"),
    ([_source(bitcode=fixture_bitcode("vector_add_float")[:30])], {}, ValueError,
     "malformed Darwin bitcode wrapper"),
    ([_source(name="")], {}, ValueError, "name must be 1 to 65534"),
    ([_source(name="a\0b")], {}, ValueError, "name must be 1 to 65534"),
    ([_source(type="compute")], {}, ValueError, "unknown function type 'compute'"),
    ([_source(function_constants=[tm.FunctionConstant("c", "float64", 0)])], {}, ValueError,
     "unknown function-constant type 'float64'"),
    ([_source(function_constants=[tm.FunctionConstant("a", "bool", 3),
                                  tm.FunctionConstant("b", "int", 3)])], {}, ValueError, "unique"),
    ([_source(function_constants=[tm.FunctionConstant("a", "bool", 70000)])], {}, ValueError,
     "index must be 0..65535"),
    ([_source(air_version=(2,))], {}, ValueError, "air_version must be 2 integers"),
    ([_source()], {"platform": "plan9"}, ValueError, "unknown platform 'plan9'"),
    ([_source()], {"platform_version": (14, 300, 0)}, ValueError, "minor and patch"),
    (["not a FunctionSource"], {}, TypeError, "expected FunctionSource"),
], ids=["duplicate-names", "text-not-bitcode", "truncated-wrapper", "empty-name", "nul-in-name", "bad-type",
        "bad-constant-type", "duplicate-constant-index", "constant-index-range",
        "short-air-version", "bad-platform", "platform-minor-range", "not-a-source"])
def test_pack_rejects_bad_input(sources, kwargs, error, words):
    with pytest.raises(error, match=words):
        tm.pack(sources, **kwargs)

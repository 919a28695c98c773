"""Reflection of the project's own AIR fixtures, checked against the Metal source each
fixture carries in its header comment (tests/fixtures/*.ll)."""

import re

import pytest

import torch_metallib as tm
from conftest import FIXTURE_KERNELS, FIXTURES
from torch_metallib import Argument, StructField


@pytest.fixture(scope="module")
def lib(fixture_metallib):
    return tm.load(fixture_metallib)


def metal_signature(kernel: str) -> str:
    """The `kernel void ...(...)` declaration in the fixture's header, whitespace collapsed."""
    header = "\n".join(line[1:] for line in (FIXTURES / f"{kernel}.ll").read_text().splitlines()
                       if line.startswith(";"))
    source = re.search(r"kernel void \w+\(.*?\]\]\)", header, re.S).group(0)
    return re.sub(r"\(\s+", "(", re.sub(r"\s+", " ", source))


@pytest.mark.parametrize("kernel", FIXTURE_KERNELS)
def test_signature_is_the_metal_source(lib, kernel):
    assert lib[kernel].signature == metal_signature(kernel)


def test_threadgroup_memory_argument(lib):
    k = lib.threadgroup_sum_float
    scratch = k.arguments[2]
    assert scratch == Argument(
        name="scratch", position=2, kind="threadgroup", binding=0, binding_count=1,
        address_space="threadgroup", access="read_write", type_name="float", type_size=4,
        type_align=4, ir_type="ptr addrspace(3)")
    # [[threadgroup(0)]] is its own namespace: buffer(0) is `in`, threadgroup(0) is scratch.
    assert [(a.kind, a.binding, a.name) for a in k.buffers] == \
        [("buffer", 0, "in"), ("buffer", 1, "out"), ("threadgroup", 0, "scratch")]
    assert [(a.builtin, a.components, a.component_bits) for a in k.builtins] == [
        ("thread_position_in_threadgroup", 1, 32), ("threadgroup_position_in_grid", 1, 32),
        ("threads_per_threadgroup", 1, 32)]
    assert k.intrinsics == ("air.wg.barrier",) and k.uses_barriers and not k.uses_simdgroup_ops
    assert k.threadgroup_memory_static == 0  # only the argument: its size is set at dispatch


def test_struct_argument(lib):
    # struct Params { float alpha; uint n; };  constant Params& p [[buffer(2)]]
    p = lib.struct_arg_axpy.arguments[2]
    assert (p.kind, p.address_space, p.binding, p.type_name) == ("buffer", "constant", 2, "Params")
    assert (p.type_size, p.type_align, p.buffer_size) == (8, 4, 8)
    assert p.struct_fields == (StructField(0, 4, 0, "float", "alpha"), StructField(4, 4, 0, "uint", "n"))


def test_function_constants_and_guarded_argument(lib):
    k = lib.function_constant_scale
    # constant bool use_bias [[function_constant(0)]]; constant float alpha [[function_constant(1)]];
    assert k.function_constants == (tm.FunctionConstant("use_bias", "bool", 0, True),
                                    tm.FunctionConstant("alpha", "float", 1, True))
    assert k.function_constants == tuple(k.declared_constants)
    assert [a.function_constant for a in k.arguments] == [None, None, "use_bias", None]
    assert k.intrinsics == ("air.normalize_function_constant_predicate.i8",)


def test_scalar_references(lib):
    k = lib.scale_shift_float
    assert [(a.name, a.address_space, a.buffer_size, a.type_name) for a in k.buffers] == [
        ("in", "device", None, "float"), ("out", "device", None, "float"),
        ("scale", "constant", 4, "float"), ("shift", "constant", 4, "float")]
    assert [a.access for a in k.buffers] == ["read", "read_write", "read", "read"]

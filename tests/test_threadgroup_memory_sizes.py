"""Threadgroup memory below what the kernel's own type declares is refused before running:
a threadgroup argument of a struct type (air.arg_type_size) needs at least one struct."""

import pathlib

import llvmlite.binding as llvm
import pytest
import torch

import torch_metallib as tm

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "threadgroup_sum_float.ll"
FLOAT_SCRATCH = ('!"air.arg_type_size", i32 4, !"air.arg_type_align_size", i32 4, '
                 '!"air.arg_type_name", !"float", !"air.arg_name", !"scratch"')


@pytest.fixture(scope="module")
def kernel():
    """threadgroup_sum_float with its scratch declared as `threadgroup Tile*`, 48 bytes."""
    text = FIXTURE.read_text()
    assert FLOAT_SCRATCH in text
    text = text.replace(FLOAT_SCRATCH, FLOAT_SCRATCH.replace("i32 4, !\"air.arg_type_align", "i32 48, !\"air.arg_type_align")
                        .replace('!"float", !"air.arg_name"', '!"Tile", !"air.arg_name"'))
    module = llvm.parse_assembly(text, context=llvm.create_context())
    library = tm.load(tm.pack([tm.FunctionSource("threadgroup_sum_float", module.as_bitcode())]))
    return library.threadgroup_sum_float


def test_reflection_sees_the_struct_size(kernel):
    scratch = next(a for a in kernel.arguments if a.name == "scratch")
    assert (scratch.kind, scratch.type_name, scratch.type_size) == ("threadgroup", "Tile", 48)


def test_less_than_one_struct_is_refused_and_nothing_runs(kernel):
    out = torch.full((1,), -1.0)
    with pytest.raises(tm.DispatchError, match=r"threadgroup_memory\[0\] \(scratch\): expected at least 48 bytes, "
                                               r"the size of argument 2 'scratch' .* got 32"):
        kernel(torch.ones(4), out, threads=4, group_size=4, threadgroup_memory={0: 32})
    assert out.item() == -1.0


def test_enough_for_the_struct_runs(kernel):
    out = torch.zeros(1)
    kernel(torch.arange(4.0), out, threads=4, group_size=4, threadgroup_memory={0: 48})
    assert out.item() == 6.0

"""Argument buffers: MLX 0.0.2's gather kernels take their index arrays in a struct whose
members carry [[id(n)]]:

    template <typename IdxT, int NIDX> struct Indices {
      const array<device IdxT*, NIDX> buffers [[id(0)]];
      device int* shapes [[id(NIDX + 1)]];
      device size_t* strides [[id(NIDX + 2)]];
      const int ndim [[id(NIDX + 3)]];
    };

Reflection lists the members, a call passes them as a dict (or a sequence in id order),
and the CPU backend lays the struct out as Metal does; results are checked against torch.
"""

import struct

import pytest
import torch

import torch_metallib as tm
from _argument_buffers import (check_gather_rows_matches_torch, check_gather_with_two_index_arrays_matches_torch,
                               check_scatter_prod_with_repeated_indices_matches_torch)


def test_members_are_reflected_with_their_ids(mlx002):
    for nidx in (1, 2, 5):
        (argument,) = [a for a in mlx002[f"gatherfloat32int32_{nidx}"].arguments if a.kind == "indirect_buffer"]
        assert (argument.name, argument.binding, argument.type_name) == ("indices", 1, "Indices")
        table = [(f.name, f.offset, f.indirect.binding, f.indirect.kind, f.indirect.type_name)
                 for f in argument.struct_fields]
        pointers = 8 * nidx
        assert table == [
            ("buffers", 0, 0, "buffer", "int"),
            ("shapes", pointers, nidx + 1, "buffer", "int"),
            ("strides", pointers + 8, nidx + 2, "buffer", "ulong"),
            ("ndim", pointers + 16, nidx + 3, "indirect_constant", "int"),
        ]
        assert argument.struct_fields[0].fields[0].array_length == nidx
        assert argument.struct_fields[1].indirect.address_space == "device"


@pytest.mark.slow
def test_every_function_of_the_library_reflects(mlx002):
    failures = []
    for name in mlx002.function_names:
        try:
            mlx002[name].reflection
        except tm.ReflectionError as error:
            failures.append(str(error))
    assert not failures, failures[:3]


@pytest.mark.parametrize("form", ["dict", "sequence"])
def test_gather_rows_matches_torch(mlx002, form):
    check_gather_rows_matches_torch(mlx002, form)


def test_gather_with_two_index_arrays_matches_torch(mlx002):
    check_gather_with_two_index_arrays_matches_torch(mlx002)


def test_plan_lays_out_the_struct_and_lists_its_pointers(mlx002):
    kernel = mlx002.gatherfloat32int32_2
    first, second = torch.zeros(3, dtype=torch.int32), torch.ones(3, dtype=torch.int32)
    shapes, strides = torch.tensor([3, 3], dtype=torch.int32), torch.tensor([1, 1], dtype=torch.int64)
    spec = kernel._dispatch_state().spec
    indices = {"buffers": [first, second], "shapes": shapes, "strides": strides, "ndim": 1}
    scalars = [torch.tensor([4, 1], dtype=torch.int32), torch.tensor([1, 1], dtype=torch.int64), 2,
               torch.tensor([1, 1], dtype=torch.int32), 1, torch.tensor([0, 1], dtype=torch.int32)]
    plan = spec.bind((torch.zeros(4), indices, torch.zeros(3), *scalars), {}, 3, None, None, None)
    ((binding, data, slots),) = plan.argument_buffers
    assert binding == 1
    assert struct.unpack_from("<4Qi", data) == (first.data_ptr(), second.data_ptr(), shapes.data_ptr(),
                                                strides.data_ptr(), 1)
    assert [(offset, tensor.data_ptr(), writable) for offset, tensor, writable in slots] == [
        (0, first.data_ptr(), True), (8, second.data_ptr(), True), (16, shapes.data_ptr(), True),
        (24, strides.data_ptr(), True)]


def members(**changes):
    base = {"buffers": [torch.zeros(3, dtype=torch.int32)], "shapes": torch.tensor([3], dtype=torch.int32),
            "strides": torch.tensor([1], dtype=torch.int64), "ndim": 1}
    base.update(changes)
    return {key: value for key, value in base.items() if value is not None}


@pytest.mark.parametrize("value, error, words", [
    (members(ndim=None), tm.KernelArgumentError, ["member 'ndim' [[id(4)]] (int): missing",
                                                  "pass indices={'ndim': ..., ...}"]),
    (members(offsets=torch.zeros(1)), tm.KernelArgumentError, ["no member named 'offsets'", "buffers [[id(0)]]"]),
    (members(shapes=torch.zeros(1)), tm.KernelArgumentError, ["member 'shapes' [[id(2)]] (device int*)",
                                                              "got torch.float32"]),
    (members(buffers=[torch.zeros(3, dtype=torch.int32)] * 2), tm.KernelArgumentError,
     ["member 'buffers' [[id(0)]]", "expected a tensor, got"]),
    (members(ndim=torch.ones(1)), tm.KernelArgumentError, ["member 'ndim'", "expected an integer that fits int"]),
    (members(ndim=2**40), tm.KernelArgumentError, ["member 'ndim'", "out of range"]),
    ([1, 2], tm.KernelArgumentError, ["expected a dict of its members", "a sequence of 4 values in id order"]),
    (torch.zeros(8), tm.KernelArgumentError, ["argument buffer Indices", "expected a dict"]),
])
def test_bad_argument_buffers_are_refused_and_write_nothing(mlx002, value, error, words):
    out = torch.full((3,), 7.0)
    with pytest.raises(error) as caught:
        mlx002.gatherfloat32int32_1(torch.zeros(4), value, out, torch.tensor([4], dtype=torch.int32),
                                    torch.tensor([1], dtype=torch.int64), 1, torch.tensor([1], dtype=torch.int32),
                                    1, torch.tensor([0], dtype=torch.int32), threads=3)
    message = str(caught.value)
    assert message.startswith("gatherfloat32int32_1: argument 1 'indices"), message
    for word in words:
        assert word in message, (word, message)
    assert torch.equal(out, torch.full((3,), 7.0))


def test_scatter_prod_with_repeated_indices_matches_torch(mlx002):
    check_scatter_prod_with_repeated_indices_matches_torch(mlx002)

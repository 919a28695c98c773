"""The Metal-shaped command list: every call's binding plan becomes the
commands a compute encoder is given, and the CPU backend takes its addresses from them, so
every CPU test runs through it. Here each argument kind is checked exactly: buffer index
and byte offset of a sliced tensor, packed scalar bytes, values over Metal's 4 KB setBytes
limit, threadgroup lengths, constant values, grid and group sizes, argument buffers."""

import struct

import pytest
import torch

import torch_metallib as tm
from _public_corpus import subset_files


@pytest.fixture(scope="module")
def fixture_lib(fixture_metallib):
    return tm.load(fixture_metallib)


def _plan(kernel, *args, threads=None, group_size=None, constants=None, threadgroup_memory=None, **kwargs):
    return kernel._dispatch_state().spec.bind(args, kwargs, threads, group_size, constants, threadgroup_memory)


def test_sliced_tensors_bind_their_storage_at_a_byte_offset(mlx_lib):
    storage = torch.arange(100, dtype=torch.float32)
    a, b, c = storage[3:67], storage[10:74], torch.empty(64)
    commands = _plan(mlx_lib.vv_Addfloat32, a, b, c, threads=64).commands
    assert commands["function"] == "vv_Addfloat32"
    assert [(index, offset, writable) for index, _, offset, writable in commands["buffers"]] == \
        [(0, 12, False), (1, 40, False), (2, 0, True)]
    assert all(t.untyped_storage().data_ptr() == storage.untyped_storage().data_ptr()
               for _, t, _, _ in commands["buffers"][:2])
    # `size` (buffer(3)) is unused and left out: zeros of its size, as bytes
    assert commands["bytes"] == [(3, b"\0" * 16, False, False)]
    assert commands["grid"] == (64, 1, 1) and commands["threadgroup"] == []


def test_scalars_are_packed_bytes_with_the_metal_type(mlx_lib):
    out = torch.empty(8)
    commands = _plan(mlx_lib.arangefloat32, 0.5, 2.0, out).commands
    assert commands["bytes"] == [(0, struct.pack("<f", 0.5), False, False), (1, struct.pack("<f", 2.0), False, False)]
    assert [index for index, *_ in commands["buffers"]] == [2]


def test_values_over_4_kb_go_in_a_buffer(mlx_lib):
    fn = mlx_lib.g2_Addfloat32
    big = list(range(1024))  # 1024 longs: 8 KB for a_strides
    commands = _plan(fn, torch.zeros(4), torch.zeros(4), torch.zeros(4), big, [1, 1], threads=(2, 2)).commands
    (strides_a, strides_b) = commands["bytes"]
    assert strides_a[0] == 3 and len(strides_a[1]) == 8192 and strides_a[2] is True
    assert strides_a[1] == struct.pack("<1024q", *big)
    assert strides_b == (4, struct.pack("<2q", 1, 1), False, False)


def test_threadgroup_lengths_grid_and_group(fixture_lib):
    commands = _plan(fixture_lib.threadgroup_sum_float, torch.ones(256), torch.zeros(4), threads=256, group_size=64,
                     threadgroup_memory={0: 256}).commands
    assert commands["threadgroup"] == [(0, 256)] and commands["threadgroup_total"] == 256
    assert commands["grid"] == (256, 1, 1) and commands["group"] == (64, 1, 1)


def test_function_constants_are_the_pipeline_key(fixture_lib):
    x, y = torch.randn(10), torch.empty(10)
    commands = _plan(fixture_lib.function_constant_scale, x, y, constants={"use_bias": False, "alpha": 3.0}).commands
    assert commands["function"] == "function_constant_scale"
    assert commands["constants"] == ((0, False), (1, 3.0))


def test_argument_buffers_are_bytes_with_pointer_slots():
    lib = tm.load(next(p for p in subset_files() if p.name == "mlx-0.0.2-mlx.metallib"))
    kernel = lib.gatherfloat32int32_1
    index = torch.tensor([2, 0], dtype=torch.int32)
    members = {"buffers": [index], "shapes": torch.tensor([2], dtype=torch.int32),
               "strides": torch.tensor([1], dtype=torch.int64), "ndim": 1}
    plan = _plan(kernel, torch.zeros(4, 6), members, torch.zeros(2, 6), torch.tensor([4, 6], dtype=torch.int32),
                 torch.tensor([6, 1], dtype=torch.int64), 2, torch.tensor([1, 6], dtype=torch.int32), 6,
                 torch.tensor([0], dtype=torch.int32), threads=12)
    (entry,) = [b for b in plan.commands["bytes"] if b[3]]
    ((binding, data, slots),) = plan.argument_buffers
    assert entry[0] == binding == 1 and entry[1] == data[:len(entry[1])]


def test_cpu_results_come_from_the_commands(mlx_lib):
    """A sliced input's offset in the command is what the CPU backend reads at."""
    storage = torch.arange(100, dtype=torch.float32)
    c = torch.empty(64)
    mlx_lib.vv_Addfloat32(storage[3:67], storage[10:74], c, threads=64)
    assert torch.equal(c, storage[3:67] + storage[10:74])


def test_launch_record_is_the_command_list_in_short(mlx_lib, fixture_lib):
    """The CUDA backend launches from Plan.launch_record: each buffer's storage address plus
    its byte offset, the bytes, the threadgroup lengths, grid and group of the commands."""
    storage = torch.arange(100, dtype=torch.float32)
    plans = [_plan(mlx_lib.vv_Addfloat32, storage[3:67], storage[10:74], torch.empty(64), threads=64),
             _plan(fixture_lib.threadgroup_sum_float, torch.ones(256), torch.zeros(4), threads=256, group_size=64,
                   threadgroup_memory={0: 256})]
    for plan in plans:
        commands = plan.commands
        buffers, data, threadgroup, grid, group = plan.launch_record
        assert buffers == [(b, t.untyped_storage().data_ptr() + offset) for b, t, offset, _ in commands["buffers"]]
        assert data == [(b, d) for b, d, _, _ in commands["bytes"]]
        assert (threadgroup, grid, group) == (commands["threadgroup"], commands["grid"], commands["group"])
    assert plans[0].launch_record[0][0][1] == storage.data_ptr() + 3 * 4

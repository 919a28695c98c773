"""Checked execution bounds each tensor by its view, not its storage: users pass slices,
and their neighbours are other slices. A kernel that indexes past a view on purpose
names the argument in `storage_bounds`. A written argument whose elements overlap (an
expanded view) is refused before anything runs, checked or not, on every backend.

Every call here stays inside its tensors' storages, so unchecked runs are harmless."""

import pytest
import torch

import torch_metallib as tm

GRID = 1000


def _neighbours_untouched(big: torch.Tensor, start: int, stop: int, fill: float) -> None:
    assert bool((big[:start] == fill).all()) and bool((big[stop:] == fill).all()), "a neighbour was written"


@pytest.mark.parametrize("kernel", ["v_copyfloat32float32", "vv_Addfloat32"])
def test_sliced_output_on_a_larger_grid_raises(mlx_lib, kernel):
    src = torch.randn(GRID)
    big = torch.full((2 * GRID,), -1.0)
    out = big[5:15]
    inputs = [src] if kernel.startswith("v_copy") else [src, torch.zeros(GRID)]
    with tm.checked(), pytest.raises(tm.KernelMemoryError) as error:
        getattr(mlx_lib, kernel)(*inputs, out, GRID, threads=GRID)
    message = str(error.value)
    name, index = ("dst", 1) if kernel.startswith("v_copy") else ("c", 2)
    assert message.startswith(f"{kernel}: thread (10, 0, 0) writes 4 bytes at byte offset 40 of argument "
                              f"{index} '{name}' (buffer({index}), device float*)"), message
    assert "expected byte offsets 0 to 40 (the 40 bytes its view spans)" in message, message
    assert f"storage_bounds={{'{name}'}}" in message, message
    _neighbours_untouched(big, 5, 15, -1.0)
    assert torch.equal(out, src[:10])


def test_sliced_output_raises_under_the_environment_variable(mlx_lib, monkeypatch):
    monkeypatch.setenv("TORCH_METALLIB_CHECKED", "1")
    big = torch.full((2 * GRID,), -1.0)
    with pytest.raises(tm.KernelMemoryError, match="byte offset 40 of argument 1 'dst'"):
        mlx_lib.v_copyfloat32float32(torch.randn(GRID), big[5:15], GRID, threads=GRID)
    _neighbours_untouched(big, 5, 15, -1.0)


def test_softmax_output_of_one_row_on_a_four_row_grid_raises(mlx_lib):
    axis = 1000
    x = torch.randn(4, axis)
    big = torch.full((6, axis), -1.0)
    out = big[1]  # one row; the grid has four
    with tm.checked(), pytest.raises(tm.KernelMemoryError) as error:
        mlx_lib.block_softmax_float32(x, out, axis, threads=(4 * 256, 1, 1), group_size=(256, 1, 1))
    message = str(error.value)
    assert message.startswith("block_softmax_float32: thread (256, 0, 0) writes "), message
    assert "of argument 1 'out' (buffer(1), device float*); expected byte offsets 0 to 4000" in message, message
    assert bool((big[0] == -1).all()) and bool((big[2:] == -1).all()), "a neighbouring row was written"
    torch.testing.assert_close(out, torch.softmax(x[0], 0))


# --- no false positives: views the kernel stays inside -------------------------------------

def test_views_inside_their_span_run_checked(mlx_lib):
    g = torch.Generator().manual_seed(0)
    base = torch.randn(8, 16, generator=g)
    cases = {
        "transposed": base[:, :8].t(),                        # strides (1, 16)
        "column slice": base[:, 5:13],                        # offset 5, strides (16, 1)
        "expanded input": base[:, :1].expand(8, 8),           # read-only: may overlap
        "every other column": base[:, ::2],                   # strides (16, 2)
    }
    y = torch.randn(8, 8, generator=g)
    for case, x in cases.items():
        checked, plain = torch.empty(8, 8), torch.empty(8, 8)
        mlx_lib.g2_Addfloat32(x, y, checked, list(x.stride()), list(y.stride()), threads=(8, 8), checked=True)
        mlx_lib.g2_Addfloat32(x, y, plain, list(x.stride()), list(y.stride()), threads=(8, 8), checked=False)
        assert torch.equal(checked, plain) and torch.equal(plain, x + y), case


def test_sliced_tensors_covering_the_grid_run_checked(mlx_lib):
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(3 * GRID, generator=g), torch.randn(3 * GRID, generator=g)
    big = torch.full((3 * GRID,), -1.0)
    mlx_lib.vv_Addfloat32(a[7:7 + GRID], b[GRID:], big[5:5 + GRID], threads=GRID, checked=True)
    assert torch.equal(big[5:5 + GRID], a[7:7 + GRID] + b[GRID:2 * GRID])
    _neighbours_untouched(big, 5, 5 + GRID, -1.0)


def test_softmax_over_row_views_runs_checked(mlx_lib):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(8, 1000, generator=g)[2:6]
    checked_big, plain = torch.full((7, 1000), -1.0), torch.empty(4, 1000)
    with tm.checked():
        mlx_lib.block_softmax_float32(x, checked_big[1:5], 1000, threads=(4 * 256, 1, 1), group_size=(256, 1, 1))
    mlx_lib.block_softmax_float32(x, plain, 1000, threads=(4 * 256, 1, 1), group_size=(256, 1, 1))
    assert torch.equal(checked_big[1:5], plain)
    assert bool((checked_big[0] == -1).all()) and bool((checked_big[5:] == -1).all())


# --- storage bounds, for kernels that index past a view on purpose -------------------------

def test_storage_bounds_lets_a_deliberate_call_run(mlx_lib):
    a, b = torch.randn(GRID), torch.randn(GRID)
    big = torch.full((2 * GRID,), -1.0)
    mlx_lib.vv_Addfloat32(a, b, big[5:15], threads=20, checked=True, storage_bounds={"c"})
    assert torch.equal(big[5:25], a[:20] + b[:20])
    _neighbours_untouched(big, 5, 25, -1.0)
    with tm.checked(storage_bounds={"c"}):  # the block's names, for the kernels that have them
        mlx_lib.vv_Addfloat32(a, b, big[30:40], threads=20)
        mlx_lib.v_copyfloat32float32(a, big[5:15], GRID, threads=10)  # no 'c' here: ignored
    assert torch.equal(big[30:50], a[:20] + b[:20])


def test_storage_bounds_still_bound_the_storage_and_only_the_named_arguments(mlx_lib):
    a, b = torch.randn(GRID), torch.randn(GRID)
    big = torch.full((2 * GRID,), -1.0)
    with pytest.raises(tm.KernelMemoryError) as error:
        mlx_lib.vv_Addfloat32(torch.randn(4 * GRID), torch.randn(4 * GRID), big[5:15], threads=3 * GRID,
                              checked=True, storage_bounds={"c"})
    message = str(error.value)
    assert "at byte offset 7980 of argument 2 'c'" in message, message
    assert "expected byte offsets -20 to 7980 (its storage's 8000 bytes" in message, message
    with pytest.raises(tm.KernelMemoryError, match="byte offset 40 of argument 2 'c'"):
        mlx_lib.vv_Addfloat32(a, b, big[5:15], threads=20, checked=True, storage_bounds={"a"})
    with pytest.raises(tm.KernelArgumentError, match=r"vv_Addfloat32: storage_bounds: no argument named 'out'; "
                                                     r"expected one of: a, b, c, size"):
        mlx_lib.vv_Addfloat32(a, b, big[5:15], threads=10, storage_bounds={"out"})


# --- written arguments whose elements overlap -----------------------------------------------

@pytest.mark.parametrize("checked", [False, True])
def test_expanded_output_is_refused_and_nothing_is_written(mlx_lib, checked):
    a, b = torch.randn(64), torch.randn(64)
    base = torch.zeros(64)
    with pytest.raises(tm.KernelArgumentError) as error:
        mlx_lib.vv_Addfloat32(a, b, base[:1].expand(64), threads=64, checked=checked)
    message = str(error.value)
    assert message.startswith("vv_Addfloat32: argument 2 'c' (buffer(2), device float*): the kernel writes to it; "
                              "expected a tensor whose elements do not overlap, got sizes [64] and strides [0]"), message
    assert torch.equal(base, torch.zeros(64))
    grid = torch.zeros(8, 8)
    with pytest.raises(tm.KernelArgumentError, match="argument 2 'c'"):
        mlx_lib.g2_Addfloat32(torch.randn(8, 8), torch.randn(8, 8), grid[:, :1].expand(8, 8), [8, 1], [8, 1],
                              threads=(8, 8), checked=checked)
    assert torch.equal(grid, torch.zeros(8, 8))


def test_expanded_output_is_refused_on_the_meta_device(mlx_lib):
    """The refusal is in the binding plan, which every backend runs from."""
    a, b = torch.randn(64, device="meta"), torch.randn(64, device="meta")
    with pytest.raises(tm.KernelArgumentError, match="argument 2 'c'.*do not overlap"):
        mlx_lib.vv_Addfloat32(a, b, torch.empty(1, device="meta").expand(64), threads=64)


def test_expanded_mutated_argument_of_an_operator_is_refused(mlx_lib):
    """ops.define's operators bind through the same plan; a mutated argument is refused
    before the dense copy a non-contiguous one gets would hide its overlap."""
    from torch_metallib import ops

    op = ops.define("tm_checked_views_tests::sigmoid_in_place(Tensor(a!) x) -> ()", mlx_lib,
                    "v_Sigmoid{dtype}{dtype}", dtypes=[torch.float32],
                    bind={"in": "x", "out": "x", "size": 0}, threads=ops.numel("x"))
    base = torch.zeros(32)
    with pytest.raises(tm.KernelArgumentError, match="argument 'x': the kernel writes to it; expected a tensor "
                                                     "whose elements do not overlap, got sizes \\[32\\]"):
        op(base[:1].expand(32))
    assert torch.equal(base, torch.zeros(32))
    x = torch.randn(64)[::2]  # not overlapping, not contiguous: runs on a dense copy
    expected = torch.sigmoid(x)
    op(x)
    torch.testing.assert_close(x, expected)

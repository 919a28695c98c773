"""MLX 0.0.2's gather and scatter kernels, whose index arrays come in an argument buffer (see
tests/test_argument_buffers.py), called and checked against torch: the CPU tests and the GPU
backends' mirrors of them (tests/test_cuda.py, test_metal_sim.py, test_mps.py) share these."""

import torch


def gather(kernel, src, indices, axes, out, slice_sizes, form="dict"):
    """Calls an MLX gather kernel; `indices` are same-shape index tensors, one per axis."""
    shape = list(indices[0].shape)
    members = {
        "buffers": list(indices),
        "shapes": torch.tensor(shape * len(indices), dtype=torch.int32),
        "strides": torch.tensor([s for t in indices for s in t.stride()], dtype=torch.int64),
        "ndim": len(shape),
    }
    if form == "sequence":
        members = [members["buffers"], members["shapes"], members["strides"], members["ndim"]]
    slice_size = 1
    for size in slice_sizes:
        slice_size *= size
    kernel(src, members, out, torch.tensor(src.shape, dtype=torch.int32),
           torch.tensor(src.stride(), dtype=torch.int64), src.dim(),
           torch.tensor(slice_sizes, dtype=torch.int32), slice_size,
           torch.tensor(axes, dtype=torch.int32), threads=out.numel())


def check_gather_rows_matches_torch(mlx002, form):
    torch.manual_seed(0)
    src = torch.randn(10, 6)
    index = torch.tensor([3, 0, 9, 3, 7], dtype=torch.int32)
    out = torch.full((5, 6), float("nan"))
    gather(mlx002.gatherfloat32int32_1, src, [index], [0], out, [1, 6], form)
    assert torch.equal(out, src[index.long()])


def check_gather_with_two_index_arrays_matches_torch(mlx002):
    torch.manual_seed(1)
    src = torch.randn(10, 6, dtype=torch.float16)
    rows = torch.randint(0, 10, (4, 7), dtype=torch.int64)
    cols = torch.randint(0, 6, (4, 7), dtype=torch.int64)
    out = torch.empty(4, 7, dtype=torch.float16)
    gather(mlx002.gatherfloat16int64_2, src, [rows, cols], [0, 1], out, [1, 1])
    assert torch.equal(out, src[rows, cols])


def check_scatter_prod_with_repeated_indices_matches_torch(mlx002):
    """scatterfloat32int32_prod_1: out[idx[k]] *= updates[k], each an atomic multiply that
    MLX 0.0.2 builds from air.atomic.global.cmpxchg.weak.f32 in a retry loop; indices repeat,
    so threads on different OS threads race for the same element. Factors are powers of two,
    so every order of the products gives the same float."""
    g = torch.Generator().manual_seed(4)
    slots, count = 50, 1000
    index = torch.randint(0, slots, (count,), generator=g, dtype=torch.int32)
    updates = torch.tensor([0.5, 1.0, 2.0, 2.0])[torch.randint(0, 4, (count,), generator=g)].reshape(count, 1)
    out = torch.ones(slots)
    members = {"buffers": [index], "shapes": torch.tensor([count], dtype=torch.int32),
               "strides": torch.tensor([1], dtype=torch.int64), "ndim": 1}
    mlx002.scatterfloat32int32_prod_1(
        members, updates, out, torch.tensor([count, 1], dtype=torch.int32), torch.tensor([1, 1], dtype=torch.int64),
        torch.tensor([2], dtype=torch.int64), torch.tensor([1], dtype=torch.int64),
        torch.tensor([slots], dtype=torch.int32), torch.tensor([1], dtype=torch.int64),
        torch.tensor([1], dtype=torch.int64), torch.tensor([0], dtype=torch.int32), threads=count, group_size=10)
    want = torch.ones(slots)
    for k in range(count):
        want[index[k]] *= updates[k, 0]
    assert torch.equal(out, want)

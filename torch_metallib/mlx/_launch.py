"""Launch rules MLX's host code uses for several kernel families, as ops rules."""

import torch

from .. import ops

FLOATS = [torch.float32, torch.float16, torch.bfloat16]
SIMD = 32
N_READS = 4              # elements per thread in the row kernels (softmax, logsumexp, norms)
LOOPED_LIMIT = 4096      # the block kernels' longest row: 1,024 threads x 4 elements
LOOPED_GROUP = 1024      # MLX launches the looped kernels with the pipeline's maximum


def rows(name: str):
    """The number of rows of `name`'s last dimension."""
    return ops.numel(name) // ops.size(name, -1)


def row_group(name: str):
    """MLX's threadgroup for one row held in the block kernels: ceil(n / 4) threads,
    rounded up to whole SIMD-groups (normalization.cpp, softmax.cpp, logsumexp.cpp)."""
    return ops.cdiv(ops.cdiv(ops.size(name, -1), N_READS), SIMD) * SIMD


def row_launch(name: str, looped: bool) -> dict:
    """threads and group_size for one threadgroup per row of `name`."""
    group = LOOPED_GROUP if looped else row_group(name)
    return {"threads": rows(name) * group, "group_size": group}


def row_limits(name: str, looped: bool) -> list:
    """Rows the kernels handle: the block kernels hold a row in one threadgroup (n <= 4096);
    the looped ones take any row (MLX uses them above 4096). An empty row has no
    threadgroup to run."""
    size = ops.size(name, -1)
    return [size >= 1] if looped else [size >= 1, size <= LOOPED_LIMIT]

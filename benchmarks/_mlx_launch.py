"""How MLX's host code launches the kernels the benchmarks run, so that they are measured at
the shapes MLX gives them (a threadgroup larger than MLX's leaves threads idle, or worse)."""

__all__ = ["mlx_row_group", "mlx_softmax_group"]

SIMD_SIZE = 32
SOFTMAX_N_READS = 4
SOFTMAX_LOOPED_LIMIT = 4096  # softmax.cpp: longer rows take looped_softmax_*
MAX_GROUP = 1024  # the pipelines' maxTotalThreadsPerThreadgroup on Apple GPUs


def mlx_row_group(axis: int, n_reads: int) -> int:
    """The threadgroup MLX's host code gives a kernel that reduces one row of `axis`
    elements in one threadgroup, `n_reads` per thread (softmax.cpp, normalization.cpp):
    whole SIMD-groups, just enough threads for the row. More leaves threads idle: softmax
    over rows of 1,024 in groups of 1,024 ran at a third of the speed of MLX's 256, and
    layer_norm's threads past the row (lid * 8 > axis_size) loop from axis_size - lid * 8
    up to 8, thousands of iterations (3.9 ms instead of 0.18 on 4096 x 4096, H100)."""
    return -(-axis // (n_reads * SIMD_SIZE)) * SIMD_SIZE


def mlx_softmax_group(axis: int) -> int:
    """softmax.cpp's threadgroup for rows of `axis`: just enough for a block softmax, the
    pipeline's maximum for a looped one."""
    return MAX_GROUP if axis > SOFTMAX_LOOPED_LIMIT else mlx_row_group(axis, SOFTMAX_N_READS)

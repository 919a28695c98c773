"""MLX's NAX GEMM kernels (``steel_gemm_fused_nax_*``, macOS 26 build of MLX 0.32.4) on the
CPU against torch: Metal 4's matmul2d on cooperative tensors (backends/cpu/tensor_ops.py),
16x32x16 products on one SIMD-group, left and right transposed or not, half, bfloat and
float operands accumulated in float.

Each kernel is called exactly as its non-NAX twin (same arguments, function constants and
dispatch; tests/test_cpu_mlx_matmul.py's harness, its float64 reference and its rigorous
element-wise bound), on shapes where no dimension is a multiple of any tile, so every edge
path runs. Each element of a lane's cooperative tensor stands for one matrix position: a
layout off by one lane bit fails every element here.
"""

import pytest

import torch_metallib as tm
from test_cpu_mlx_matmul import TRANSPOSES, UNALIGNED_SHAPES, _run_steel_gemm
from test_mlx_gated_delta import _mac26_path

# (bm, bn, bk, wm, wn): every tile the library instantiates, each for all three types.
TILES = [(64, 64, 256, 2, 2), (64, 128, 64, 2, 4), (64, 128, 512, 2, 4), (128, 64, 512, 4, 2),
         (64, 128, 256, 2, 4), (128, 128, 64, 4, 4), (128, 128, 256, 4, 4), (128, 128, 512, 4, 4)]
DTYPES = ["float32", "float16", "bfloat16"]


class _NaxKernels:
    """The NAX twin of each steel_gemm_fused kernel the harness asks for."""

    def __init__(self, library):
        self.library = library

    def __getitem__(self, name):
        return self.library[name.replace("steel_gemm_fused_", "steel_gemm_fused_nax_")]


@pytest.fixture(scope="module")
def nax_kernels():
    return _NaxKernels(tm.load(_mac26_path()))


def _cases():
    """12 kernels: every transpose with every type, each tile at least once."""
    for index, (transpose, dtype) in enumerate((t, d) for t in TRANSPOSES for d in DTYPES):
        tile = TILES[index % len(TILES)]
        yield pytest.param(transpose, dtype, tile, id=f"{transpose}_{dtype}_bm{tile[0]}_bn{tile[1]}_bk{tile[2]}")


@pytest.mark.parametrize("transpose,dtype,tile", list(_cases()))
def test_nax_gemm_matches_torch(nax_kernels, transpose, dtype, tile):
    _run_steel_gemm(nax_kernels, transpose, dtype, tile, UNALIGNED_SHAPES[transpose], seed=TILES.index(tile))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_nax_gemm_addmm(nax_kernels, dtype):
    """D = alpha*A@B + beta*C: the epilogue reads C around the cooperative product."""
    _run_steel_gemm(nax_kernels, "nt", dtype, (64, 128, 64, 2, 4), (70, 150, 40), seed=9,
                    addmm=(0.5, -2.0, True, False))


def test_nax_gemm_batched(nax_kernels):
    _run_steel_gemm(nax_kernels, "tn", "float16", (64, 64, 256, 2, 2), (40, 70, 300), batch=3, seed=4)

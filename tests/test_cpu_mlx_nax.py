"""MLX's NAX GEMM kernels (macOS 26 build of MLX 0.32.4) on the CPU against torch: Metal 4's
matmul2d (air/tensor_ops.py) on one SIMD-group, left and right transposed or not,
half, bfloat and float operands accumulated in float.

``steel_gemm_fused_nax_*`` multiply 16x32x16 cooperative tensors.

Each kernel is called exactly as its non-NAX twin (same arguments, function constants and
dispatch; tests/test_cpu_mlx_matmul.py's harness, its float64 reference and its rigorous
element-wise bound), on shapes where no dimension is a multiple of any tile, so every edge
path runs. Each element of a lane's cooperative tensor stands for one matrix position: a
layout off by one lane bit fails every element here.

``steel_gemm_thin_nax_*`` (host code written from the kernel's source: steel/gemm/kernels/
steel_gemm_thin_nax.h) multiply 32x32x64 blocks whose operands are tensors in device
memory (Metal 4's tensor_inline, the ``air.*_private_tensor`` intrinsics), views that stop
at the matrix's edge so matmul2d masks the rest; split K adds partial sums through
threadgroup tensors (``store_tg``/``load_tg``), and the epilogue finds each element's
position with ``get_coordinate``.
"""

import pytest

import torch_metallib as tm
from _mlx_matmul import (DTYPES as TORCH_DTYPES, TRANSPOSES, UNALIGNED_SHAPES, _assert_close,
                         _assert_sentinels, _axpby_reference, _constants_needed, _filled, _generator,
                         _grid, _matmul_tolerance, _operand, _pack_struct, _randn, _run_steel_gemm)
from _public_corpus import mac26_path

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
def nax_library():
    return tm.load(mac26_path())


@pytest.fixture(scope="module")
def nax_kernels(nax_library):
    return _NaxKernels(nax_library)


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


# === steel_gemm_thin_nax_{nn,nt}_{T}_um2_un2_sm{SM}_sn{SN}_ks{KS} ============================

THIN_BK = 64  # the kernel's K chunk
THIN_CONFIGS = [(1, 1, 4), (1, 2, 2)]  # (SM, SN, KS) instantiated, each with UM = UN = 2


def _run_thin_gemm(library, transpose_b, dtype, config, shape, *, seed=0, addmm=None):
    """D = A @ op(B) (+ epilogue) with steel_gemm_thin_nax: one threadgroup of SM*SN*KS
    SIMD-groups per (SM*32) x (SN*32) block of D, K split KS ways."""
    sm, sn, ks = config
    M, N, K = shape
    torch_dtype = TORCH_DTYPES[dtype]
    fn = library[f"steel_gemm_thin_nax_{'nt' if transpose_b else 'nn'}_{dtype}_um2_un2_sm{sm}_sn{sn}_ks{ks}"]
    g = _generator(seed)
    a_store, lda, a = _operand(g, torch_dtype, 1, M, K, False, 0)
    b_store, ldb, b = _operand(g, torch_dtype, 1, K, N, transpose_b, 0)
    d = _filled(M * N, torch_dtype)
    tiles_m, tiles_n = -(-M // (32 * sm)), -(-N // (32 * sn))
    params = _pack_struct(
        fn, "params", M=M, N=N, K=K, lda=lda, ldb=ldb, ldd=N, tiles_n=tiles_n, tiles_m=tiles_m,
        batch_stride_a=0, batch_stride_b=0, batch_stride_d=0, swizzle_log=0,
        gemm_k_iterations_aligned=-(-K // (THIN_BK * ks)), batch_ndim=1)
    kwargs = dict(A=a_store, B=b_store, D=d, params=params)
    exact = a @ b
    tolerance = _matmul_tolerance(a, b, K, torch_dtype, exact)
    if addmm is not None:
        alpha, beta = addmm
        c_store = _randn((1, M, N), g, torch_dtype)
        kwargs["C"] = c_store
        kwargs["addmm_params"] = _pack_struct(fn, "addmm_params", ldc=N, fdc=1, batch_stride_c=0,
                                              alpha=alpha, beta=beta)
        exact, tolerance = _axpby_reference(a, b, K, torch_dtype, exact, c_store.double(), alpha, beta)
    constants = _constants_needed(fn, dict(
        use_out_source=addmm is not None, do_axpby=addmm is not None,
        align_M=M % (32 * sm) == 0, align_N=N % (32 * sn) == 0, align_K=K % THIN_BK == 0))
    fn(**kwargs, constants=constants, **_grid((tiles_m * tiles_n, 1, 1), (32 * sm * sn * ks, 1, 1)))

    _assert_sentinels(d, M * N)
    _assert_close(d[:M * N].view(1, M, N), exact, tolerance, fn.name)


# (M, N, K): every path of the K loop. Aligned blocks and K (a cooperative left operand
# loaded from a slice, B read as a tensor); a K tail (both operands tensors, K past the
# slice masked); blocks at the edge (views that stop there, M and N past them masked);
# M smaller than a block; blocks moved back inside.
THIN_SHAPES = [(64, 64, 512), (64, 128, 200), (40, 100, 300), (20, 50, 70), (96, 70, 130)]


@pytest.mark.parametrize("config", THIN_CONFIGS, ids=lambda c: f"sm{c[0]}_sn{c[1]}_ks{c[2]}")
@pytest.mark.parametrize("transpose_b", [False, True], ids=["nn", "nt"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_thin_nax_gemm_matches_torch(nax_library, dtype, transpose_b, config):
    for index, shape in enumerate(THIN_SHAPES):
        _run_thin_gemm(nax_library, transpose_b, dtype, config, shape, seed=index)


def test_thin_nax_gemm_axpby(nax_library):
    """D = alpha*A@B + beta*C: the epilogue finds C's element through get_coordinate."""
    _run_thin_gemm(nax_library, True, "float16", (1, 2, 2), (70, 90, 150), seed=11, addmm=(0.5, -2.0))

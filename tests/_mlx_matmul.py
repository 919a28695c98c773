"""MLX's matrix kernels called as MLX's host code calls them (mlx/backend/metal/matmul.cpp):
structs packed from reflection, outputs guarded by sentinels, float64 references with
element-wise bounds, and steel_gemm_fused run end to end. tests/test_cpu_mlx_matmul.py's
module docstring gives the tolerances; the CPU, CUDA, Metal and checked-mode tests share it."""

import struct

import torch

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
EPS32 = 2.0 ** -23
UNIT_ROUNDOFF = {torch.float32: 2.0 ** -24, torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}
# Absolute error of rounding a tiny value to T (half-spacing of the subnormals, doubled).
TINY = {dtype: torch.finfo(dtype).smallest_normal * torch.finfo(dtype).eps for dtype in UNIT_ROUNDOFF}
SENTINEL = -7.0  # exact in every type, never a result here
STRUCT_FORMATS = {"int": "i", "uint": "I", "long": "q", "ulong": "Q", "float": "f"}


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(shape, generator, dtype, scale=1.0) -> torch.Tensor:
    return (torch.randn(shape, generator=generator, dtype=torch.float64) * scale).to(dtype)


def _argument(fn, name):
    (argument,) = [a for a in fn.arguments if a.name == name]
    return argument


def _pack_struct(fn, name, **values) -> bytes:
    """The `name` argument's struct with `values`, laid out by the kernel's reflection."""
    argument = _argument(fn, name)
    assert sorted(f.name for f in argument.struct_fields) == sorted(values), argument.struct_fields
    data = bytearray(argument.type_size)
    for field in argument.struct_fields:
        fmt = "<" + STRUCT_FORMATS[field.type_name]
        assert struct.calcsize(fmt) == field.size and field.array_length == 0, field
        struct.pack_into(fmt, data, field.offset, values[field.name])
    return bytes(data)


def _grid(groups, group):
    """threads (the whole grid, in threads) for MLX's dispatchThreadgroups(groups, group)."""
    return dict(threads=tuple(g * t for g, t in zip(groups, group)), group_size=tuple(group))


def _filled(count: int, dtype, tail: int = 4) -> torch.Tensor:
    """An output buffer of `count` elements plus `tail` sentinels, all set to SENTINEL."""
    return torch.full((count + tail,), SENTINEL, dtype=dtype)


def _assert_sentinels(buffer: torch.Tensor, count: int) -> None:
    assert bool((buffer[count:] == SENTINEL).all()), "the kernel wrote past the end of its output"


def _assert_close(out, exact, tolerance, what=""):
    """out (any dtype) against float64 `exact`, element-wise within `tolerance`."""
    assert out.shape == exact.shape, (out.shape, exact.shape)
    error = (out.double() - exact).abs()
    bad = error > tolerance
    if bool(bad.any()):
        index = tuple(int(i) for i in bad.nonzero()[0])
        worst = float((error - tolerance).max())
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {bad.numel()} elements out of tolerance; first at {index}: "
            f"got {float(out[index])}, expected {float(exact[index])}, tolerance {float(tolerance[index])}; "
            f"worst excess {worst}")


def _matmul_tolerance(a, b, k, dtype, exact):
    """Element-wise bound for a float32-accumulated product of a and b (float64) rounded to dtype."""
    return k * EPS32 * (a.abs() @ b.abs()) + UNIT_ROUNDOFF[dtype] * exact.abs() + TINY[dtype]


def _axpby_reference(a, b, k, dtype, ab_exact, c, alpha, beta):
    """(exact, element-wise bound) of alpha * (a @ b) + beta * c, the product accumulated
    in float32, the epilogue in float, the result rounded to dtype."""
    exact = alpha * ab_exact + beta * c
    tolerance = (abs(alpha) * _matmul_tolerance(a, b, k, torch.float32, ab_exact)
                 + 4 * EPS32 * (abs(alpha) * ab_exact.abs() + abs(beta) * c.abs())
                 + UNIT_ROUNDOFF[dtype] * exact.abs() + TINY[dtype])
    return exact, tolerance


def _constants_needed(fn, constants: dict) -> dict:
    """The constants MLX sets, after checking the kernel declares exactly those."""
    assert {c.name for c in fn.function_constants} == set(constants), fn.function_constants
    return constants


# === steel GEMM: steel_gemm_fused_{nn,nt,tn,tt}_{T}_{T}_bm.._bn.._bk.._wm.._wn.. =============

TILES = [  # (bm, bn, bk, wm, wn): every configuration the library instantiates
    (64, 64, 16, 2, 2),
    (64, 64, 16, 1, 2),
    (64, 32, 32, 2, 2),
    (32, 64, 16, 1, 2),
    (32, 32, 16, 2, 2),
    (64, 32, 8, 4, 1),
]
TRANSPOSES = ["nn", "nt", "tn", "tt"]
# None of M, N, K is a multiple of any tile size (or of 8): every edge path of the kernel.
UNALIGNED_SHAPES = {"nn": (70, 90, 50), "nt": (100, 75, 83), "tn": (129, 66, 41), "tt": (65, 130, 97)}


def _steel_name(transpose, dtype, tile):
    bm, bn, bk, wm, wn = tile
    return f"steel_gemm_fused_{transpose}_{dtype}_{dtype}_bm{bm}_bn{bn}_bk{bk}_wm{wm}_wn{wn}"


def _operand(generator, dtype, batch, rows, cols, transposed, pad):
    """A (batch, rows, cols) operand stored as MLX expects: row-major with leading dimension
    cols + pad, or, transposed, as (batch, cols, rows) with leading dimension rows + pad.
    Returns (storage, leading dimension, the logical operand in float64)."""
    stored_rows, stored_cols = (cols, rows) if transposed else (rows, cols)
    storage = _randn((batch, stored_rows, stored_cols + pad), generator, dtype)
    logical = storage[..., :stored_cols].double()
    if transposed:
        logical = logical.transpose(-1, -2)
    return storage, stored_cols + pad, logical


def _run_steel_gemm(mlx_lib, transpose, dtype, tile, shape, *, seed=0, pad=0, batch=1,
                    broadcast_b=False, swizzle_log=0, addmm=None, nd_batch=None):
    """D = op(A) @ op(B) (+ epilogue) with steel_gemm_fused, as steel_matmul_regular[_axpby]
    dispatches it. addmm: None, or (alpha, beta, do_axpby, bias_row) for D = alpha*AB + beta*C
    (do_axpby) or AB + C, C a full (batch, M, N) matrix or (bias_row) an (N,) row broadcast.
    nd_batch: a 2-d batch shape for the has_batch path (B broadcast along its second dim)."""
    bm, bn, bk, wm, wn = tile
    M, N, K = shape
    torch_dtype = DTYPES[dtype]
    fn = mlx_lib[_steel_name(transpose, dtype, tile)]
    g = _generator(seed)
    if nd_batch is not None:
        batch = nd_batch[0] * nd_batch[1]
    a_store, lda, a = _operand(g, torch_dtype, batch, M, K, transpose[0] == "t", pad)
    if nd_batch is not None:  # B has one matrix per index of the first batch dimension
        b_store, ldb, b = _operand(g, torch_dtype, nd_batch[0], K, N, transpose[1] == "t", pad)
        b = b.repeat_interleave(nd_batch[1], 0)
    else:
        b_store, ldb, b = _operand(g, torch_dtype, 1 if broadcast_b else batch, K, N, transpose[1] == "t", pad)
    ldd = N + pad
    d = _filled(batch * M * ldd, torch_dtype)

    tiles_n, tiles_m = -(-N // bn), -(-M // bm)
    params = _pack_struct(
        fn, "params", M=M, N=N, K=K, lda=lda, ldb=ldb, ldd=ldd, tiles_n=tiles_n, tiles_m=tiles_m,
        batch_stride_a=a_store[0].numel(), batch_stride_b=0 if broadcast_b else b_store[0].numel(),
        batch_stride_d=M * ldd, swizzle_log=swizzle_log, gemm_k_iterations_aligned=K // bk,
        batch_ndim=len(nd_batch) if nd_batch else 1)
    kwargs = dict(A=a_store, B=b_store, D=d, params=params)
    exact = a @ b
    tolerance = _matmul_tolerance(a, b, K, torch_dtype, exact)
    if nd_batch is not None:
        kwargs["batch_shape"] = list(nd_batch)
        # A's strides over the batch shape, then B's (0 along the broadcast dimension).
        kwargs["batch_strides"] = [nd_batch[1] * a_store[0].numel(), a_store[0].numel(), b_store[0].numel(), 0]
    if addmm is not None:
        alpha, beta, do_axpby, bias_row = addmm
        c_store = _randn((1, N) if bias_row else (batch, M, N), g, torch_dtype)
        kwargs["C"] = c_store
        kwargs["addmm_params"] = _pack_struct(
            fn, "addmm_params", ldc=0 if bias_row else N, fdc=1,
            batch_stride_c=0 if bias_row else M * N, alpha=alpha, beta=beta)
        c = c_store.double().reshape((1, 1, N) if bias_row else (batch, M, N))
        if not do_axpby:
            alpha, beta = 1.0, 1.0  # the kernel's TransformAdd ignores alpha and beta
        exact, tolerance = _axpby_reference(a, b, K, torch_dtype, exact, c, alpha, beta)
    constants = _constants_needed(fn, dict(
        has_batch=nd_batch is not None, use_out_source=addmm is not None,
        do_axpby=bool(addmm and addmm[2]), align_M=M % bm == 0, align_N=N % bn == 0, align_K=K % bk == 0))

    tile_span = 1 << swizzle_log
    groups = (tiles_n * tile_span, -(-tiles_m // tile_span), batch)
    fn(**kwargs, constants=constants, **_grid(groups, (32, wn, wm)))

    _assert_sentinels(d, batch * M * ldd)
    out = d[:batch * M * ldd].view(batch, M, ldd)
    assert bool((out[..., N:] == SENTINEL).all()), "the kernel wrote into D's padding columns"
    _assert_close(out[..., :N], exact.expand(batch, M, N), tolerance.expand(batch, M, N), fn.name)


def check_steel_gemm_unaligned(mlx_lib, tile, transpose, dtype):
    """A shape with partial tiles in M, N and K: every edge path of the kernel."""
    _run_steel_gemm(mlx_lib, transpose, dtype, tile, UNALIGNED_SHAPES[transpose], seed=TILES.index(tile))


ALIGNMENT_CASES = [  # shape -> (align_M, align_N, align_K) for the 64x32x32 tile
    (128, 128, 64),   # all aligned: the unguarded main loop
    (64, 100, 96),    # only N ragged
    (100, 64, 96),    # only M ragged
    (128, 96, 45),    # only K ragged
]


def check_steel_gemm_alignment_paths(mlx_lib, shape, transpose, dtype):
    _run_steel_gemm(mlx_lib, transpose, dtype, (64, 32, 32, 2, 2), shape, seed=sum(shape))

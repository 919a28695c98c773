"""Apple-built MLX matrix kernels on the CPU against torch (float64 references): steel GEMM
(simdgroup_matrix 8x8 multiply-accumulate, threadgroup tiles, barriers), gemv / gemv_t
(uniform<int>, SIMD shuffles), gemv_wide (dot of float4) and sdpa_vector (single-query
attention: simd_sum / simd_max, threadgroup transposes).

Each kernel is called the way MLX's host code calls it (mlx/backend/metal/matmul.cpp,
scaled_dot_product_attention.cpp): MLX uses dispatchThreadgroups(grid, group), so a call
here passes threads = grid * group. Structs are packed from the kernel's own reflection
(offsets and sizes of `struct_fields`). Every output buffer has sentinel elements after it
(and, where the kernel takes a leading dimension, padding columns) that must stay untouched.

Tolerances (u_T: unit roundoff of the output type, 2**-24 / 2**-11 / 2**-8 for float32 /
float16 / bfloat16; eps = 2**-23, float32's machine epsilon):

* Matrix products. MLX accumulates in float32 in an order of its own. Whatever the order,
  a float32 dot product of length K is within gamma_K * sum_k |a_ik||b_kj|, gamma_K =
  K*u/(1-K*u) < K*eps, of the exact one (Higham, Accuracy and Stability, 3.1); products of
  float16 / bfloat16 values are exact in float32, so that bound covers them too. The result
  is then rounded once to T: + u_T*|exact|. So, element-wise,
      |out - exact| <= K*eps*(|A|@|B|) + u_T*|exact| + (tiny: float16 subnormal spacing).
  The bound is rigorous rather than statistical, yet far below what a wrong index,
  transpose, tile edge or a lost K-block does (errors of order |A||B|/sqrt(K) and more).
  Epilogues (alpha*x + beta*c) add a few roundings, bounded by 4 units of the epilogue's
  precision relative to each term: u_T for MLX's gemv, whose axpby runs in T; eps for
  steel GEMM and gemv_wide, which run it in float32 before the final rounding to T.
* Attention. An output is a convex combination of V rows; perturbing each score by at
  most delta moves every softmax weight by a relative 2*delta (to first order), hence the
  output by <= 2*delta*max|V| (4*delta used, covering the second-order terms). delta
  gathers the score's float32 dot product ((D+2)*eps*scale*max(|q|@|k|^T)), the running
  max/sum rescaling over N keys (N*eps) and the exponentials (16*eps; Metal's fast::exp).
  Then the output rounding u_T*|exact|, and for the two-pass kernel the per-block partial
  outputs stored in T (u_T*max|V|).
"""

import math
import re

import pytest
import torch

import torch_metallib as tm
from _mlx_matmul import (ALIGNMENT_CASES, DTYPES, EPS32, TILES, TINY, TRANSPOSES, UNIT_ROUNDOFF, _argument,
                         _assert_close, _assert_sentinels, _constants_needed, _filled, _generator, _grid,
                         _matmul_tolerance, _randn, _run_steel_gemm, _steel_name, check_steel_gemm_alignment_paths,
                         check_steel_gemm_unaligned)


def test_gemm_params_layout(mlx_lib):
    """The structs are packed from reflection; pin that reflection to MLX's params.h."""
    fn = mlx_lib[_steel_name("nn", "float32", TILES[0])]
    params = _argument(fn, "params")
    assert (params.type_name, params.type_size) == ("mlx::steel::GEMMParams", 72)
    assert [(f.name, f.offset, f.type_name) for f in params.struct_fields] == [
        ("M", 0, "int"), ("N", 4, "int"), ("K", 8, "int"), ("lda", 12, "int"), ("ldb", 16, "int"),
        ("ldd", 20, "int"), ("tiles_n", 24, "int"), ("tiles_m", 28, "int"),
        ("batch_stride_a", 32, "long"), ("batch_stride_b", 40, "long"), ("batch_stride_d", 48, "long"),
        ("swizzle_log", 56, "int"), ("gemm_k_iterations_aligned", 60, "int"), ("batch_ndim", 64, "int")]
    addmm = _argument(fn, "addmm_params")
    assert addmm.type_size == 24 and addmm.function_constant == "use_out_source"
    assert [(f.name, f.offset) for f in addmm.struct_fields] == [
        ("ldc", 0), ("fdc", 4), ("batch_stride_c", 8), ("alpha", 16), ("beta", 20)]


def _unaligned_cases():
    """48 of the 72 float kernels (each first call compiles the kernel: ~1 s): float32 with
    every tile and transpose; float16 and bfloat16 share the transposes of each tile, so every
    (tile, transpose) and (tile, dtype) and (transpose, dtype) pair is covered."""
    for index, tile in enumerate(TILES):
        half_transposes = ("nn", "tt") if index % 2 == 0 else ("nt", "tn")
        for transpose in TRANSPOSES:
            dtypes = ["float32", "float16" if transpose in half_transposes else "bfloat16"]
            for dtype in dtypes:
                yield pytest.param(tile, transpose, dtype, id=_steel_name(transpose, dtype, tile)[17:])


@pytest.mark.parametrize("tile,transpose,dtype", _unaligned_cases())
def test_steel_gemm_unaligned(mlx_lib, tile, transpose, dtype):
    check_steel_gemm_unaligned(mlx_lib, tile, transpose, dtype)


@pytest.mark.parametrize("seed", [1, 2])
def test_steel_gemm_permuted_schedule(mlx_lib, seed):
    """Threads reordered within every barrier interval: the result must not depend on the
    order (a barrier the CPU backend dropped or misplaced shows up here)."""
    with tm.cpu_schedule("permuted", seed=seed):
        _run_steel_gemm(mlx_lib, "nt", "float16", (32, 32, 16, 2, 2), (40, 36, 40), seed=seed)


@pytest.mark.parametrize("transpose,dtype", [("nt", "float16"), ("tn", "float32"), ("nn", "bfloat16")])
@pytest.mark.parametrize("shape", ALIGNMENT_CASES, ids=lambda s: "x".join(map(str, s)))
def test_steel_gemm_alignment_paths(mlx_lib, shape, transpose, dtype):
    check_steel_gemm_alignment_paths(mlx_lib, shape, transpose, dtype)


@pytest.mark.parametrize("transpose,dtype,tile", [
    ("nn", "float32", (32, 32, 16, 2, 2)),
    ("tt", "float16", (64, 64, 16, 2, 2)),
    ("nt", "bfloat16", (32, 64, 16, 1, 2)),
])
def test_steel_gemm_leading_dimensions(mlx_lib, transpose, dtype, tile):
    """lda, ldb, ldd wider than the matrices: the padding must be neither read into the
    result nor written."""
    _run_steel_gemm(mlx_lib, transpose, dtype, tile, (75, 70, 37), pad=5, seed=3)


@pytest.mark.parametrize("broadcast_b", [False, True])
def test_steel_gemm_batched(mlx_lib, broadcast_b):
    """grid z = batch; batch_stride_a/b/d in params (batch_stride_b = 0: B broadcast)."""
    _run_steel_gemm(mlx_lib, "nt", "float32", (32, 32, 16, 2, 2), (40, 70, 33), batch=3,
                    broadcast_b=broadcast_b, seed=4)


def test_steel_gemm_nd_batch(mlx_lib):
    """has_batch: offsets from batch_shape and per-operand batch_strides (B broadcast)."""
    _run_steel_gemm(mlx_lib, "tn", "float16", (32, 32, 16, 2, 2), (36, 50, 29), nd_batch=(2, 3), seed=5)


@pytest.mark.parametrize("swizzle_log", [1, 2])
def test_steel_gemm_swizzle(mlx_lib, swizzle_log):
    """Threadgroup swizzling: grid (tiles_n << s, ceil(tiles_m >> s)); the groups that land
    past the last tile must exit without writing."""
    _run_steel_gemm(mlx_lib, "nn", "float32", (32, 32, 16, 2, 2), (170, 100, 40), swizzle_log=swizzle_log, seed=6)


@pytest.mark.parametrize("dtype,transpose,addmm", [
    ("float32", "nn", (0.5, -2.0, True, False)),
    ("float16", "nt", (1.5, 0.25, True, True)),
    ("bfloat16", "tn", (3.0, 5.0, False, False)),   # AB + C: alpha, beta ignored
    ("float32", "tt", (3.0, 5.0, False, True)),
])
def test_steel_gemm_addmm(mlx_lib, dtype, transpose, addmm):
    """use_out_source (+ do_axpby): D = alpha*AB + beta*C, C full or a broadcast row."""
    _run_steel_gemm(mlx_lib, transpose, dtype, (64, 32, 32, 2, 2), (70, 45, 66), batch=2, addmm=addmm, seed=7)


# === gemv (out = mat @ vec), gemv_t (out = vec @ mat) ======================================

GEMV_CONFIG = re.compile(r"_bm(\d+)_bn(\d+)_sm(\d+)_sn(\d+)_tm(\d+)_tn(\d+)_nc(\d)_axpby(\d)$")
# Barriers that finished threads skip (Apple GPUs let them pass, and so does the CPU
# backend's default schedule): GEMVKernel with BN > 1 has a threadgroup_barrier inside
# `if (thrN == 0)`; GEMVTKernel's main loop (with a barrier) runs only `if (out_col <
# out_vec_size)`, so with out_vec_size not a multiple of BN*SN*TN the last threadgroup's
# trailing threads skip every barrier and finish.


def _run_gemv(mlx_lib, name, out_len, in_len, *, batch=1, axpby=None, nd_batch=None, pad=0, seed=0):
    """gemv_*: out = mat @ vec with mat (out_len, in_len); gemv_t_*: out = vec @ mat with
    mat (in_len, out_len); as MLX's gemv dispatch: group (32, BN, BM), grid (ceil(out_len /
    outputs per group), 1, batch). axpby: (alpha, beta): out = alpha*out + beta*bias."""
    fn = mlx_lib[name]
    bm, bn, sm, sn, tm_, tn, nc, has_axpby = map(int, GEMV_CONFIG.search(name).groups())
    assert has_axpby == (axpby is not None) and nc == (nd_batch is not None)
    transposed = name.startswith("gemv_t_")
    dtype = next(d for n, d in DTYPES.items() if f"_{n}_" in name)
    g = _generator(seed)
    if nd_batch is not None:
        batch = nd_batch[0] * nd_batch[1]
    rows, cols = (in_len, out_len) if transposed else (out_len, in_len)
    # nd_batch: one matrix per index of the first batch dimension, one vector per index.
    mat_count = nd_batch[0] if nd_batch else batch
    mat = _randn((mat_count, rows, cols + pad), g, dtype)
    vec = _randn((batch, in_len), g, dtype)
    out = _filled(batch * out_len, dtype)
    per_group = bn * sn * tn if transposed else bm * sm * tm_

    m = mat[..., :cols].double()
    if nd_batch:
        m = m.repeat_interleave(nd_batch[1], 0)
    v = vec.double()[:, None, :]  # (batch, 1, in_len)
    a, b = (v, m) if transposed else (m, v.transpose(-1, -2))
    exact = (a @ b).reshape(batch, out_len)
    tolerance = _matmul_tolerance(a, b, in_len, dtype, a @ b).reshape(batch, out_len)

    kwargs = dict(mat=mat, in_vec=vec, out_vec=out, in_vec_size=in_len, out_vec_size=out_len,
                  marix_ld=cols + pad, batch_ndim=len(nd_batch) if nd_batch else 1)
    if nd_batch:
        kwargs.update(batch_shape=list(nd_batch), vector_batch_stride=[nd_batch[1] * in_len, in_len],
                      matrix_batch_stride=[mat[0].numel(), 0])
    else:
        kwargs.update(batch_shape=[batch], vector_batch_stride=[in_len], matrix_batch_stride=[mat[0].numel()])
    if axpby is not None:
        alpha, beta = axpby
        bias = _randn((batch, out_len, 2), g, dtype)  # bias_stride 2: every other element
        bias_batch_stride = [nd_batch[1] * 2 * out_len, 2 * out_len] if nd_batch else [2 * out_len]
        kwargs.update(bias=bias, alpha=alpha, beta=beta, bias_stride=2, bias_batch_stride=bias_batch_stride)
        c = bias[..., 0].double()
        # MLX's gemv epilogue runs in T: T(alpha) * T(result) + T(beta) * bias.
        tolerance = (abs(alpha) * tolerance + 4 * UNIT_ROUNDOFF[dtype] * (abs(alpha) * exact.abs() + abs(beta) * c.abs())
                     + TINY[dtype])
        exact = alpha * exact + beta * c
    fn(**kwargs, **_grid((-(-out_len // per_group), 1, batch), (32, bn, bm)))

    _assert_sentinels(out, batch * out_len)
    _assert_close(out[:batch * out_len].view(batch, out_len), exact, tolerance, name)


GEMV_CASES = [  # (name, out_len, in_len)
    ("gemv_float32_bm4_bn1_sm1_sn32_tm4_tn4_nc0_axpby0", 130, 200),
    ("gemv_float16_bm4_bn1_sm1_sn32_tm4_tn4_nc0_axpby0", 67, 129),
    ("gemv_bfloat16_bm4_bn1_sm1_sn32_tm4_tn4_nc0_axpby0", 99, 150),
    ("gemv_float16_bm4_bn1_sm1_sn32_tm1_tn4_nc0_axpby0", 3, 190),
    ("gemv_bfloat16_bm8_bn1_sm1_sn32_tm4_tn4_nc0_axpby0", 150, 77),
    ("gemv_float32_bm1_bn1_sm8_sn4_tm4_tn4_nc0_axpby0", 101, 64),
    ("gemv_bfloat16_bm1_bn1_sm8_sn4_tm1_tn4_nc0_axpby0", 45, 130),
    pytest.param("gemv_float32_bm1_bn8_sm1_sn32_tm4_tn4_nc0_axpby0", 64, 200),
    # gemv_t: out_len a multiple of BN*SN*TN, in_len ragged; then ragged out_len (skipped barriers).
    ("gemv_t_float32_bm1_bn2_sm8_sn4_tm4_tn1_nc0_axpby0", 64, 101),
    ("gemv_t_float16_bm1_bn2_sm8_sn4_tm4_tn4_nc0_axpby0", 96, 70),
    ("gemv_t_bfloat16_bm1_bn4_sm8_sn4_tm4_tn4_nc0_axpby0", 128, 133),
    ("gemv_t_float32_bm1_bn16_sm8_sn4_tm4_tn4_nc0_axpby0", 256, 45),
    ("gemv_t_float16_bm1_bn16_sm4_sn8_tm4_tn4_nc0_axpby0", 512, 37),
    pytest.param("gemv_t_float32_bm1_bn4_sm8_sn4_tm4_tn4_nc0_axpby0", 150, 130),
    pytest.param("gemv_t_bfloat16_bm1_bn2_sm8_sn4_tm4_tn1_nc0_axpby0", 13, 50),
]


@pytest.mark.parametrize("name,out_len,in_len", GEMV_CASES)
def test_gemv(mlx_lib, name, out_len, in_len):
    _run_gemv(mlx_lib, name, out_len, in_len, batch=2, seed=out_len)


@pytest.mark.parametrize("name,out_len,in_len", [
    ("gemv_float32_bm4_bn1_sm1_sn32_tm4_tn4_nc0_axpby1", 70, 90),
    ("gemv_float16_bm1_bn1_sm8_sn4_tm4_tn4_nc0_axpby1", 66, 50),
    ("gemv_t_bfloat16_bm1_bn4_sm8_sn4_tm4_tn4_nc0_axpby1", 64, 77),
])
def test_gemv_axpby(mlx_lib, name, out_len, in_len):
    """out = alpha * (mat @ vec) + beta * bias[i * bias_stride]."""
    _run_gemv(mlx_lib, name, out_len, in_len, batch=2, axpby=(0.75, -1.5), seed=1)


@pytest.mark.parametrize("name,out_len,in_len,axpby", [
    ("gemv_float16_bm4_bn1_sm1_sn32_tm4_tn4_nc1_axpby0", 50, 70, None),
    ("gemv_t_float32_bm1_bn2_sm8_sn4_tm4_tn4_nc1_axpby1", 64, 40, (2.0, 0.5)),
])
def test_gemv_nd_batch(mlx_lib, name, out_len, in_len, axpby):
    """nc1: vector/matrix/bias offsets from batch_shape and strides (matrix broadcast)."""
    _run_gemv(mlx_lib, name, out_len, in_len, nd_batch=(2, 3), axpby=axpby, seed=2)


def test_gemv_leading_dimension(mlx_lib):
    _run_gemv(mlx_lib, "gemv_float32_bm4_bn1_sm1_sn32_tm4_tn4_nc0_axpby0", 40, 90, pad=7, seed=3)
    _run_gemv(mlx_lib, "gemv_t_float16_bm1_bn2_sm8_sn4_tm4_tn1_nc0_axpby0", 24, 33, pad=3, seed=4)


# === gemv_wide: out[M, N] = x[M, K] @ mat[N, K]^T for a few vectors (float4 dot products) ===

def _run_gemv_wide(mlx_lib, name, m, n, k, *, chunk_groups, batch=1, axpby=None, seed=0):
    fn = mlx_lib[name]
    vecs, k_lanes = map(int, re.search(r"_nv(\d+)_kl(\d+)$", name).groups())
    dtype = next(d for nm, d in DTYPES.items() if f"_{nm}_" in name)
    g = _generator(seed)
    mat = _randn((batch, n, k + 4), g, dtype)   # matrix_ld = k + 4 (a multiple of 4, as float4 loads need)
    x = _randn((batch, m, k + 8), g, dtype)     # vector_ld = k + 8
    out = _filled(batch * m * n, dtype)
    a, b = x[..., :k].double(), mat[..., :k].double().transpose(-1, -2)
    exact = a @ b
    tolerance = _matmul_tolerance(a, b, k, dtype, exact)
    kwargs = dict(mat=mat, in_vec=x, out_vec=out, in_vec_size=k, out_vec_size=n, M=m, matrix_ld=k + 4,
                  vector_ld=k + 8, batch_ndim=1, batch_shape=[batch], vector_batch_stride=[x[0].numel()],
                  matrix_batch_stride=[mat[0].numel()])
    if axpby is not None:
        alpha, beta = axpby
        bias = _randn((batch, m, n), g, dtype)
        kwargs.update(bias=bias, alpha=alpha, beta=beta, bias_batch_stride=[m * n], bias_ld=n, bias_fd=1)
        c = bias.double()
        tolerance = (abs(alpha) * _matmul_tolerance(a, b, k, torch.float32, exact)
                     + 4 * EPS32 * (abs(alpha) * exact.abs() + abs(beta) * c.abs())
                     + UNIT_ROUNDOFF[dtype] * (alpha * exact + beta * c).abs() + TINY[dtype])
        exact = alpha * exact + beta * c
    constants = _constants_needed(fn, dict(gemv_wide_has_batch=False, gemv_wide_do_axpby=axpby is not None))
    rows_per_group = 4  # (32 / k_lanes) rows per simdgroup, k_lanes / 8 simdgroups
    fn(**kwargs, constants=constants, **_grid((chunk_groups, -(-n // rows_per_group), batch), (32, k_lanes // 8, 1)))
    _assert_sentinels(out, batch * m * n)
    _assert_close(out[:batch * m * n].view(batch, m, n), exact, tolerance, name)


@pytest.mark.parametrize("name,m,n,k,chunk_groups", [
    ("gemv_wide_float16_nv2_kl16", 5, 37, 1032, 1),      # K spans the unrolled main loop and its tail
    ("gemv_wide_bfloat16_nv3_kl32", 7, 30, 200, 3),     # K only in the tail loop
    ("gemv_wide_float16_nv4_kl32", 4, 21, 1100, 2),
    ("gemv_wide_bfloat16_nv5_kl16", 9, 18, 644, 1),
])
def test_gemv_wide(mlx_lib, name, m, n, k, chunk_groups):
    """Vector chunks round-robin over grid.x groups; rows past N and vectors past M are
    clamped for reading and never written."""
    _run_gemv_wide(mlx_lib, name, m, n, k, chunk_groups=chunk_groups, batch=2, seed=k)


def test_gemv_wide_axpby(mlx_lib):
    _run_gemv_wide(mlx_lib, "gemv_wide_float16_nv3_kl16", 5, 22, 516, chunk_groups=2, axpby=(0.5, 2.0), seed=9)


# === sdpa_vector: softmax(scale * q k^T) v for a few queries per head =======================

SDPA_CONSTANTS = dict(has_mask=False, query_transposed=False, do_causal=False, bool_mask=False,
                      float_mask=False, has_sinks=False)


def _sdpa_inputs(dtype, batch, q_heads, kv_heads, q_len, n, d, v_dim, seed):
    g = _generator(seed)
    q = _randn((batch, q_heads, q_len, d), g, dtype)
    k = _randn((batch, kv_heads, n, d), g, dtype)
    v = _randn((batch, kv_heads, n, v_dim), g, dtype)
    return q, k, v


def _sdpa_exact(q, k, v, scale, keep=None, sinks=None):
    """float64 attention; k, v shared by q_heads / kv_heads query heads (GQA)."""
    gqa = q.shape[1] // k.shape[1]
    q, k, v = q.double(), k.double().repeat_interleave(gqa, 1), v.double().repeat_interleave(gqa, 1)
    scores = (q @ k.transpose(-1, -2)) * scale
    if keep is not None:
        scores = scores.masked_fill(~keep, -math.inf)
    if sinks is not None:
        sink = sinks.double()[None, :, None, None].expand(*scores.shape[:-1], 1)
        weights = torch.softmax(torch.cat([scores, sink], -1), -1)[..., :-1]
    else:
        weights = torch.softmax(scores, -1)
    return weights @ v


def _sdpa_tolerance(q, k, v, scale, exact, dtype, partials_in_t=False):
    gqa = q.shape[1] // k.shape[1]
    k = k.double().repeat_interleave(gqa, 1)
    score_abs = scale * float((q.double().abs() @ k.abs().transpose(-1, -2)).max())
    n, d = k.shape[-2], q.shape[-1]
    delta = (d + 2) * EPS32 * score_abs + n * EPS32 + 16 * EPS32
    v_max = float(v.double().abs().max())
    tolerance = 4 * delta * v_max + UNIT_ROUNDOFF[dtype] * exact.abs() + TINY[dtype]
    return tolerance + (UNIT_ROUNDOFF[dtype] * v_max if partials_in_t else 0)


def _sdpa_name(kind, dtype, d, v_dim):
    type_name = "float" if dtype == "float32" else f"{dtype}_t"
    return f"sdpa_vector_{kind}{type_name}_{d}_{v_dim}" if v_dim else f"sdpa_vector_{kind}{type_name}_{d}"


def _run_sdpa_vector(mlx_lib, dtype, d, v_dim, *, batch=1, q_heads=4, kv_heads=2, q_len=1, n=77,
                     scale=None, mask=None, causal=False, query_transposed=False, sinks=False, seed=0):
    """sdpa_vector as MLX's sdpa_vector(): group 1024 threads (32 simdgroups, one key each
    per step), grid (batch * q_heads, q_len, 1); k/v head and sequence strides.
    mask: None or "bool"; the float mask variant is not exercised here. Returns the output
    buffer, checked against torch."""
    torch_dtype = DTYPES[dtype]
    fn = mlx_lib[_sdpa_name("", dtype, d, v_dim)]
    scale = scale if scale is not None else d ** -0.5
    q, k, v = _sdpa_inputs(torch_dtype, batch, q_heads, kv_heads, q_len, n, d, v_dim, seed)
    out = _filled(batch * q_heads * q_len * v_dim, torch_dtype)
    g = _generator(seed + 1)
    keep = None
    kwargs = dict(queries=q.transpose(1, 2).contiguous() if query_transposed else q.contiguous(),
                  keys=k, values=v, out=out, gqa_factor=q_heads // kv_heads, N=n,
                  k_head_stride=n * d, k_seq_stride=d, v_head_stride=n * v_dim, v_seq_stride=v_dim,
                  scale=scale)
    if query_transposed:  # (q_len, batch * q_heads, d): what MLX passes for a non-row-contiguous q
        assert batch == 1
    if mask == "bool":
        keep = torch.rand((batch, q_heads, q_len, n), generator=g) < 0.6
        keep[..., n - 1] = True  # no fully masked row
        kwargs.update(bmask=keep, mask_kv_seq_stride=1, mask_q_seq_stride=n, mask_head_stride=q_len * n)
    if causal:  # MLX's causal mask is aligned to the end: query i sees keys <= n - q_len + i
        keep = torch.arange(n)[None, :] <= (n - q_len + torch.arange(q_len))[:, None]
    sink_values = None
    if sinks:
        sink_values = _randn((q_heads,), g, torch_dtype, scale=2.0)
        kwargs.update(sinks=sink_values, num_q_heads=q_heads)
    constants = _constants_needed(fn, dict(SDPA_CONSTANTS, has_mask=mask is not None, bool_mask=mask == "bool",
                                           do_causal=causal, query_transposed=query_transposed,
                                           has_sinks=sinks))
    fn(**kwargs, constants=constants, **_grid((batch * q_heads, q_len, 1), (1024, 1, 1)))

    exact = _sdpa_exact(q, k, v, scale, keep, sink_values)
    count = batch * q_heads * q_len * v_dim
    _assert_sentinels(out, count)
    _assert_close(out[:count].view(exact.shape), exact, _sdpa_tolerance(q, k, v, scale, exact, torch_dtype),
                  fn.name)
    return out


@pytest.mark.parametrize("dtype,d,v_dim,n", [
    ("float32", 64, 64, 77),
    ("float16", 128, 128, 45),
    ("bfloat16", 64, 64, 100),
    ("float32", 96, 64, 33),     # key and value head dims differ
    ("float16", 256, 256, 31),   # fewer keys than simdgroups
])
def test_sdpa_vector(mlx_lib, dtype, d, v_dim, n):
    _run_sdpa_vector(mlx_lib, dtype, d, v_dim, n=n, batch=2, seed=d + n)


def test_sdpa_vector_bool_mask(mlx_lib):
    _run_sdpa_vector(mlx_lib, "float16", 64, 64, q_len=2, mask="bool", seed=11)


def test_sdpa_vector_causal(mlx_lib):
    _run_sdpa_vector(mlx_lib, "float32", 128, 128, q_len=3, causal=True, seed=12)


def test_sdpa_vector_transposed_query(mlx_lib):
    _run_sdpa_vector(mlx_lib, "bfloat16", 64, 64, q_len=2, query_transposed=True, seed=13)


def test_sdpa_vector_sinks(mlx_lib):
    """Attention sinks: one extra logit per head in the softmax's denominator."""
    _run_sdpa_vector(mlx_lib, "float32", 64, 64, q_len=1, sinks=True, scale=0.5, seed=14)


@pytest.mark.parametrize("dtype,d", [("float32", 64), ("float16", 128), ("bfloat16", 64)])
def test_sdpa_vector_2pass(mlx_lib, dtype, d):
    """sdpa_vector_2pass_1 (grid (kv_heads, batch, blocks), group (32, gqa, q_len): a
    block's partial output, sum and max per query) then sdpa_vector_2pass_2 (group 1024,
    grid (batch * q_heads, q_len)) combines the 32 blocks."""
    torch_dtype = DTYPES[dtype]
    batch, q_heads, kv_heads, q_len, n, blocks = 2, 4, 2, 2, 150, 32
    gqa = q_heads // kv_heads
    scale = d ** -0.5
    q, k, v = _sdpa_inputs(torch_dtype, batch, q_heads, kv_heads, q_len, n, d, d, seed=d)
    rows = batch * q_heads * q_len
    partials = _filled(rows * blocks * d, torch_dtype)
    sums, maxs = _filled(rows * blocks, torch.float32), _filled(rows * blocks, torch.float32)
    pass1 = mlx_lib[_sdpa_name("2pass_1_", dtype, d, d)]
    pass1(queries=q, keys=k, values=v, out=partials, sums=sums, maxs=maxs, N=n,
          k_head_stride=n * d, k_seq_stride=d, v_head_stride=n * d, v_seq_stride=d, scale=scale,
          constants=_constants_needed(pass1, dict(SDPA_CONSTANTS, blocks=blocks)),
          **_grid((kv_heads, batch, blocks), (32, gqa, q_len)))
    for buffer, count in ((partials, rows * blocks * d), (sums, rows * blocks), (maxs, rows * blocks)):
        _assert_sentinels(buffer, count)
    # Block b of a query holds the keys b, b + 32, ...: check its max score (exactly the
    # float32 scores' max, up to their rounding) against torch before combining.
    scores = (q.double() @ k.double().repeat_interleave(gqa, 1).transpose(-1, -2)) * scale
    block_max = scores.new_full((batch, q_heads, q_len, blocks), -math.inf)
    for b in range(blocks):
        block_max[..., b] = scores[..., b::blocks].max(-1).values
    score_tol = (d + 2) * EPS32 * scale * float((q.double().abs() @ k.double().abs().repeat_interleave(gqa, 1)
                                                  .transpose(-1, -2)).max())
    _assert_close(maxs[:rows * blocks].view(block_max.shape), block_max,
                  torch.full_like(block_max, score_tol), "maxs")

    out = _filled(rows * d, torch_dtype)
    pass2 = mlx_lib[_sdpa_name("2pass_2_", dtype, d, None)]
    pass2(partials=partials, sums=sums, maxs=maxs, out=out, blocks=blocks,
          **_grid((batch * q_heads, q_len, 1), (1024, 1, 1)))
    exact = _sdpa_exact(q, k, v, scale)
    _assert_sentinels(out, rows * d)
    _assert_close(out[:rows * d].view(exact.shape), exact,
                  _sdpa_tolerance(q, k, v, scale, exact, torch_dtype, partials_in_t=True), pass2.name)

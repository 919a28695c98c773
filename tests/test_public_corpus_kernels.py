"""One kernel (or more) per producer of the public corpus runs on the CPU backend and
matches torch: other toolchains and AIR versions (2.4 typed pointers, 2.7, 2.8), the older
group-size convention, struct arguments laid out from reflection, function constants and
cooperative kernels. (MLX 0.32's kernels have their own tests; MLX 0.0.2's gather with its
argument buffer is in test_argument_buffers.py.)"""

import itertools
import struct

import pytest
import torch

import torch_metallib as tm
from _public_corpus import subset_files


@pytest.fixture(scope="module")
def library():
    files = subset_files()
    cache = {}

    def get(prefix: str) -> tm.Library:
        if prefix not in cache:
            cache[prefix] = tm.load(next(p for p in files if p.name.startswith(prefix)))
        return cache[prefix]

    return get


def test_gpt4all_air_2_4_elementwise(library):
    lib = library("gpt4all-2.7.0")
    assert lib.kernel_scale.air_version == (2, 4)
    x, y = torch.randn(1000, generator=torch.Generator().manual_seed(0)), torch.empty(1000)
    lib.kernel_scale(x, y, 2.5)
    assert torch.equal(y, x * 2.5)
    lib.kernel_relu(x, y)
    assert torch.equal(y, torch.relu(x))


def test_metalcore_silu(library):
    lib = library("metalcore")
    x, y = torch.randn(4096, generator=torch.Generator().manual_seed(1)), torch.empty(4096)
    lib.silu_fwd_scalar(x, y)
    torch.testing.assert_close(y, torch.nn.functional.silu(x), rtol=2e-6, atol=1e-6)


def test_skmetal_in_place_scale(library):
    lib = library("skmetal")
    x = torch.randn(1000, generator=torch.Generator().manual_seed(2))
    a = x.clone()
    lib.scale_f32(a, 3.0, 1000)
    assert torch.equal(a, x * 3.0)


def test_pennylane_air_2_8_complex_copy(library):
    lib = library("pennylane-metal")
    assert lib.copy_complex_state.air_version == (2, 8)
    state = torch.randn(32, dtype=torch.complex64, generator=torch.Generator().manual_seed(3))
    copy = torch.zeros_like(state)
    lib.copy_complex_state(torch.view_as_real(state), torch.view_as_real(copy), 32, threads=32)
    assert torch.equal(copy, state)


def test_metal_graph_struct_argument(library):
    """MGFillParams {float f_value; uint u_value; uint count; uint pad0;}, from reflection."""
    lib = library("metal-graph")
    fields = [(f.name, f.offset, f.type_name) for f in lib.mg_fill_f32.arguments[0].struct_fields]
    assert fields == [("f_value", 0, "float"), ("u_value", 4, "uint"), ("count", 8, "uint"), ("pad0", 12, "uint")]
    out = torch.zeros(100)
    lib.mg_fill_f32(struct.pack("<fIII", 1.5, 0, 100, 0), out, threads=100)
    assert torch.equal(out, torch.full((100,), 1.5))
    ramp = torch.full((100,), -1, dtype=torch.int32)
    lib.mg_iota_u32(struct.pack("<fIII", 0.0, 0, 100, 0), ramp, threads=100)
    assert torch.equal(ramp, torch.arange(100, dtype=torch.int32))


def test_metal_linalg_transpose_with_function_constants(library):
    lib = library("metal-linalg-2.19.0-_core@a7a50")
    kernel = lib.preprocess_transpose
    assert [c.name for c in kernel.function_constants] == ["M", "N"]
    rows, cols = 5, 7
    a = torch.randn(rows, cols, generator=torch.Generator().manual_seed(4))
    out = torch.full((rows * cols,), float("nan"))
    kernel(a, out, rows, cols, threads=(cols, rows, 1), constants={"M": rows, "N": cols})
    assert torch.equal(out.view(cols, rows), a.t())


def test_executorch_older_convention_rms_norm(library):
    """ExecuTorch 1.3.1 ships MLX's rms kernel in the older group-size convention: a
    cooperative kernel (SIMD-group sums, barriers)."""
    lib = library("executorch-1.3.1")
    assert lib.group_size_convention == "older"
    rows, size = 3, 1024
    g = torch.Generator().manual_seed(5)
    x, w = torch.randn(rows, size, generator=g), torch.randn(size, generator=g)
    out, group = torch.empty(rows, size), size // 4
    lib.rmsfloat32(x, w, out, 1e-5, size, 1, threads=rows * group, group_size=group)
    expected = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-5) * w.double()
    assert (out.double() - expected).abs().max() <= 1e-5 * expected.abs().max()


def test_metalq_single_qubit_gate_with_struct_values(library):
    """metalq's apply_gate_single: a complex state (struct Complex {float real, imag}) and a
    2x2 gate passed by value (struct GateMatrix2x2 {Complex val[4]}), one thread per pair of
    amplitudes; compared with the gate applied to that qubit's axis by torch."""
    lib = library("metalq")
    qubits, target = 4, 2
    g = torch.Generator().manual_seed(6)
    state = torch.randn(2 ** qubits, dtype=torch.complex64, generator=g)
    gate = torch.randn(2, 2, dtype=torch.complex64, generator=g)
    amplitudes = torch.view_as_real(state).clone()
    gate_bytes = struct.pack("<8f", *torch.view_as_real(gate).flatten().tolist())
    lib.apply_gate_single(amplitudes, target, gate_bytes, threads=2 ** (qubits - 1))
    axis = qubits - 1 - target  # bit `target` of the index is this axis of the row-major tensor
    expected = torch.movedim(torch.tensordot(gate, state.view([2] * qubits), dims=([1], [axis])), 0, axis)
    torch.testing.assert_close(torch.view_as_complex(amplitudes), expected.reshape(-1), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("group", [32, 256])
def test_mlx_lstsq_cholesky_of_a_diagonal_block(library, group):
    """mlx-lstsq's factorDiagonalBlockL (AIR 2.7, cooperative: threadgroup tiles, simd_sum,
    barriers) factors a symmetric positive definite block in place, column-major: its lower
    triangle becomes torch.linalg.cholesky's factor; the upper triangle is left alone. A
    block that is not positive definite sets `info` to the failing pivot, 1-based (LAPACK's
    convention)."""
    lib = library("mlx-lstsq")
    n = 32
    m = torch.randn(n, n, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    spd = m @ m.T + n * torch.eye(n, dtype=torch.float64)
    a, info = spd.float().clone(), torch.zeros(1, dtype=torch.int32)
    lib.factorDiagonalBlockL(a, info, n, n, 0, threads=group, group_size=group)
    assert info.item() == 0
    column_major = a.T.double()
    torch.testing.assert_close(column_major.tril(), torch.linalg.cholesky(spd), rtol=0, atol=2e-5)
    assert torch.equal(column_major.triu(1), spd.float().T.triu(1).double())
    broken = torch.eye(n)
    broken[5, 5] = -1.0
    lib.factorDiagonalBlockL(broken, info, n, n, 0, threads=group, group_size=group)
    assert info.item() == 6


@pytest.mark.parametrize("causal", [False, True])
def test_metal_flash_sdpa_varlen_attention(library, causal):
    """metal-flash-sdpa's steel attention (MLX's, made variable-length): packed sequences
    delimited by cu_seqlens, a 176-byte AttnParams struct by value, function constants,
    SIMD-group matrices and barriers; dispatched as the wheel's host code does (threadgroups
    (ceil(max_seqlen_q / 32), heads, batch) of (32, 4, 1)). Causal masks align bottom-right."""
    lib = library("metal-flash-sdpa")
    kernel = lib.steel_attention_float32_bq32_bk32_bd64_wm4_wn1_maskbool_
    heads, dim, lens_q, lens_k = 2, 64, [20, 45], [33, 45]
    g = torch.Generator().manual_seed(8)
    q = torch.randn(sum(lens_q), heads, dim, generator=g)
    k, v = (torch.randn(sum(lens_k), heads, dim, generator=g) for _ in range(2))
    cu_q, cu_k = (torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32) for lens in (lens_q, lens_k))
    scale, batch = dim ** -0.5, len(lens_q)
    # B H D qL kL gqa scale softcapping NQ NK NQ_aligned NK_aligned qL_rem kL_rem qL_off,
    # four long[3] strides (unused for packed tensors), total_q/k tokens, max_seqlen_q/k.
    params = struct.pack("<6i2f7i4x12q4i", batch, heads, dim, 0, 0, 1, scale, 1.0, *[0] * 7, *[0] * 12,
                         q.shape[0], k.shape[0], max(lens_q), max(lens_k))
    assert len(params) == kernel.arguments[4].type_size
    out = torch.full_like(q, float("nan"))
    kernel(q, k, v, out, params, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
           threads=(-(-max(lens_q) // 32) * 32, heads * 4, batch), group_size=(32, 4, 1),
           constants={"has_mask": False, "do_causal": causal})
    expected = []
    for b in range(batch):
        qs, ks, vs = (t[c[b]:c[b + 1]].transpose(0, 1) for t, c in ((q, cu_q), (k, cu_k), (v, cu_k)))
        mask = torch.ones(qs.shape[1], ks.shape[1], dtype=torch.bool).tril(ks.shape[1] - qs.shape[1]) \
            if causal else None
        expected.append(torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask).transpose(0, 1))
    torch.testing.assert_close(out, torch.cat(expected), rtol=1e-5, atol=1e-5)


def _mfa_gemm(lib, kernel, dtype, shape, transposed, simd=(16, 16, 32), splits=(2, 2), alpha=1.0, beta=0.0,
              **constants):
    """Runs diffusion-rs's Metal FlashAttention GEMM (C = alpha * op(A) @ op(B) + beta * C)
    as MFA's host code dispatches it: threadgroups of 32 * M_splits * N_splits threads over
    (ceil(N / N_group), ceil(M / M_group)), with threadgroup memory for one A and one B tile
    (or the C tile, if larger). Returns (C, the float64 reference)."""
    (m, n, k), (a_trans, b_trans) = shape, transposed
    (m_simd, n_simd, k_simd), (m_splits, n_splits) = simd, splits
    m_group, n_group = m_simd * m_splits, n_simd * n_splits
    g = torch.Generator().manual_seed(m * n + k)
    a = torch.randn(k, m, generator=g).to(dtype).t() if a_trans else torch.randn(m, k, generator=g).to(dtype)
    b = torch.randn(n, k, generator=g).to(dtype).t() if b_trans else torch.randn(k, n, generator=g).to(dtype)
    c0 = torch.randn(m, n, generator=g).to(dtype)
    c = c0.clone()
    values = dict(M=m, N=n, K=k, A_trans=a_trans, B_trans=b_trans, alpha=alpha, beta=beta, batched=False,
                  fused_activation=False, block_sparse=False, triangular=False, grouped_query=False,
                  M_simd=m_simd, N_simd=n_simd, K_simd=k_simd, M_splits=m_splits, N_splits=n_splits, masked=False)
    values.update(constants)
    tile_bytes = max(m_group * k_simd + k_simd * n_group, m_group * n_group) * a.element_size()
    group = 32 * m_splits * n_splits
    lib[kernel](a.t().contiguous() if a_trans else a, b.t().contiguous() if b_trans else b, c,
                threads=(-(-n // n_group) * group, -(-m // m_group), 1), group_size=(group, 1, 1),
                constants=values, threadgroup_memory={0: -(-tile_bytes // 16) * 16})
    return c, alpha * (a.double() @ b.double()) + beta * c0.double()


@pytest.mark.parametrize("shape", [(64, 48, 40), (33, 17, 9)])
@pytest.mark.parametrize("transposed", [(False, False), (True, True), (False, True)])
def test_diffusion_rs_mfa_sgemm(library, shape, transposed):
    """diffusion-rs's sgemm (Metal FlashAttention, AIR 2.5): tiles loaded with SIMD-group
    async copies (edge tiles zero-filled), SIMD-group matrices, 24 function constants, and
    arguments guarded by predicates the kernel derives from them (D, the function table)."""
    lib = library("diffusion-rs")
    c, expected = _mfa_gemm(lib, "sgemm", torch.float32, shape, transposed)
    torch.testing.assert_close(c.double(), expected, rtol=0, atol=2e-5)
    c, expected = _mfa_gemm(lib, "sgemm", torch.float32, shape, transposed, simd=(8, 8, 16), splits=(1, 2),
                            alpha=0.5, beta=2.0)
    torch.testing.assert_close(c.double(), expected, rtol=0, atol=2e-5)


def test_diffusion_rs_mfa_hgemm_accumulates_in_half(library):
    """hgemm multiplies and accumulates in half (v64f16 products), so it is held to a few
    half-precision steps of the result's magnitude, not to float accuracy."""
    c, expected = _mfa_gemm(library("diffusion-rs"), "hgemm", torch.float16, (64, 48, 40), (False, True))
    assert (c.double() - expected).abs().max() <= 4 * 2.0 ** -10 * expected.abs().max()

"""torch_metallib.mlx: the ready-made operators over MLX's kernels against float64 torch
references on the CPU backend, their backward kernels, their preconditions, one
``torch.compile(fullgraph=True)`` graph through several of them, and torch.library.opcheck
for every operator.

Tolerances are derived from the kernels' arithmetic and explained where they are defined:
MLX computes these kernels in float32 whatever the storage type T is (loads widen to
float32; one rounding into T at the store), so a bound is the float32 part (a tree sum of
n terms: about log2(n) roundings, plus a few for the division, rsqrt or exp) relative to
the magnitudes the error scales with, plus half an ulp of T for the final rounding (one
ulp where the kernel rounds twice, as the norms do before multiplying by the weight)."""

import math
import os
import subprocess
import sys

import pytest
import torch

import torch_metallib as tm
from torch_metallib import mlx

E32 = torch.finfo(torch.float32).eps
FLOATS = [torch.float32, torch.float16, torch.bfloat16]
DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
EPS = 1e-5
dtypes = pytest.mark.parametrize("dtype", FLOATS, ids=DTYPE_NAMES.get)


def _data(shape, dtype=torch.float32, seed=0, scale=1.0, grad=False) -> torch.Tensor:
    """Seeded normal data rounded to `dtype` (the reference then sees the same values)."""
    x = (torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype)
    return x.requires_grad_(grad)


def _half_ulp(dtype) -> float:
    return torch.finfo(dtype).eps / 2


def _floor(dtype) -> float:
    """Two steps of `dtype` below its normal range: results that round to subnormals."""
    info = torch.finfo(dtype)
    return 2 * info.smallest_normal * info.eps


def _sum_part(n: int) -> float:
    """float32 error, relative to the summed magnitudes, of MLX's row sums: a tree of depth
    ~log2(n) (per thread, simd_sum, across SIMD-groups) plus a few operations after it."""
    return (4 + math.log2(max(n, 1))) * E32


def _assert_close(actual, reference, bound, what):
    """|actual - reference| <= bound elementwise (reference and bound in float64); the
    message names the worst element and its ratio to the bound."""
    assert actual.shape == reference.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(reference.shape)}"
    bound = torch.as_tensor(bound, dtype=torch.float64).expand_as(reference)
    error = (actual.detach().double() - reference).abs()
    ratio = error / bound
    worst = int(ratio.flatten().argmax())
    assert bool((error <= bound).all()), (
        f"{what}: element {worst} is {actual.flatten()[worst].item()!r}, "
        f"reference {reference.flatten()[worst].item()!r}: "
        f"error {error.flatten()[worst].item():.3g} exceeds the bound {bound.flatten()[worst].item():.3g} "
        f"({ratio.flatten()[worst].item():.2f}x)")


# --- the library ----------------------------------------------------------------------------

def test_every_operator_is_in_one_namespace(defined):
    assert mlx.NAMESPACE == "tm_mlx"
    assert all(op.name.startswith("tm_mlx::") for op in defined.values())
    assert {"rms_norm", "rms_norm_looped", "layer_norm", "rope", "softmax", "logsumexp",
            "sdpa_vector_128_128", "mm", "bmm", "addmm"} <= set(defined)
    assert mlx.load() is defined  # defined once


def test_a_missing_library_names_the_command_that_fetches_it(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_METALLIB_CORPUS_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError) as raised:
        mlx.library_path()
    assert "python -m torch_metallib corpus" in str(raised.value)
    assert str(tmp_path) in str(raised.value)


# --- RMS norm ------------------------------------------------------------------------------

def _rms(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


@dtypes
@pytest.mark.parametrize("n", [1, 100, 4096, 5000])   # 5000: the looped kernel
def test_rms_norm(defined, dtype, n):
    x, w = _data((2, 3, n), dtype, seed=n), _data((n,), dtype, seed=n + 1)
    y = mlx.rms_norm(x, w, EPS)
    reference = _rms(x.double(), w.double())
    # float32 mean of squares and rsqrt (the sum part), then x * r rounded to T and the
    # product with w rounded to T: two roundings, eps of T relative to the result.
    bound = (torch.finfo(dtype).eps + _sum_part(n)) * reference.abs() + _floor(dtype)
    _assert_close(y, reference, bound, f"rms_norm {dtype} n={n}")


def _rms_gradient_scales(x, w, g):
    """float64 magnitudes the gradient errors scale with: gx = r*w*g - x*r^3*mean(g*w*x)
    cancels, so its error is relative to |r*w*g| + |x| r^3 mean|g*w*x|; gw's row terms
    g*x*r do not cancel, but torch sums them over the rows (one float32 rounding per row
    for float32, one rounding into T for the others)."""
    r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)
    return (r * w * g).abs() + x.abs() * r.pow(3) * (g * w * x).abs().mean(-1, keepdim=True), (g * x * r).abs()


@dtypes
@pytest.mark.parametrize("n", [100, 5000])
def test_rms_norm_gradients(defined, dtype, n):
    x, w = _data((2, 3, n), dtype, seed=n + 2, grad=True), _data((n,), dtype, seed=n + 3, grad=True)
    g = _data((2, 3, n), dtype, seed=n + 4)
    gx, gw = torch.autograd.grad(mlx.rms_norm(x, w, EPS), (x, w), g)
    xd, wd = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    rgx, rgw = torch.autograd.grad(_rms(xd, wd), (xd, wd), g.double())
    gx_scale, gw_scale = _rms_gradient_scales(xd.detach(), wd.detach(), g.double())
    eps = torch.finfo(dtype).eps
    _assert_close(gx, rgx, (eps + _sum_part(n)) * gx_scale + _floor(dtype), f"rms_norm x.grad {dtype} n={n}")
    rows = 6   # each row partial rounded into T, then summed by torch (rows roundings) and rounded into T
    gw_bound = (2 * eps + _sum_part(n) + rows * eps) * gw_scale.sum((0, 1)) + _floor(dtype)
    _assert_close(gw, rgw, gw_bound, f"rms_norm w.grad {dtype} n={n}")


# --- layer norm ----------------------------------------------------------------------------

def _layer_norm_scales(x, w):
    """|w * x_hat| and the float32 part's scale: the mean's error, (log2 n) E32 mean|x|,
    moves x_hat by that over sigma; the variance's moves it relative to |x_hat|."""
    mean = x.mean(-1, keepdim=True)
    sigma = (x.var(-1, unbiased=False, keepdim=True) + EPS).sqrt()
    x_hat = (x - mean) / sigma
    return (w * x_hat).abs(), w.abs() * (x_hat.abs() + x.abs().mean(-1, keepdim=True) / sigma), x_hat, sigma


@dtypes
@pytest.mark.parametrize("n", [7, 1000, 4096, 6000])
def test_layer_norm(defined, dtype, n):
    x = _data((5, n), dtype, seed=n + 5, scale=2) + 0.5
    w, b = _data((n,), dtype, seed=n + 6), _data((n,), dtype, seed=n + 7)
    y = mlx.layer_norm(x, w, b, EPS)
    reference = torch.nn.functional.layer_norm(x.double(), (n,), w.double(), b.double(), EPS)
    # x_hat rounded to T, times w rounded, plus b rounded: 3 half-ulps of T, two of them
    # relative to |w x_hat|, one to |out|; plus the float32 part.
    scaled, float_scale, _, _ = _layer_norm_scales(x.double(), w.double())
    half = _half_ulp(dtype)
    bound = 2 * half * scaled + half * reference.abs() + _sum_part(n) * float_scale + _floor(dtype)
    _assert_close(y, reference, bound, f"layer_norm {dtype} n={n}")
    assert torch.equal(mlx.layer_norm(x), mlx.layer_norm(x, torch.ones_like(w), torch.zeros_like(b)))


@dtypes
@pytest.mark.parametrize("n", [100, 5000])
def test_layer_norm_gradients(defined, dtype, n):
    x = _data((2, 3, n), dtype, seed=n + 8, grad=True)
    w, b = _data((n,), dtype, seed=n + 9, grad=True), _data((n,), dtype, seed=n + 10, grad=True)
    g = _data((2, 3, n), dtype, seed=n + 11)
    gx, gw, gb = torch.autograd.grad(mlx.layer_norm(x, w, b, EPS), (x, w, b), g)
    xd, wd, bd = (t.detach().double().requires_grad_() for t in (x, w, b))
    rgx, rgw, rgb = torch.autograd.grad(torch.nn.functional.layer_norm(xd, (n,), wd, bd, EPS), (xd, wd, bd),
                                        g.double())
    _, _, x_hat, sigma = _layer_norm_scales(xd.detach(), wd.detach())
    wg = wd.detach() * g.double()
    # gx = (w g - mean(w g) - x_hat mean(w g x_hat)) / sigma cancels: its error is relative
    # to the terms' magnitudes; the float32 part also moves x_hat (see the forward).
    gx_scale = (wg.abs() + wg.abs().mean(-1, keepdim=True)
                + (x_hat.abs() + 1) * (wg * x_hat).abs().mean(-1, keepdim=True)) / sigma
    eps = torch.finfo(dtype).eps
    _assert_close(gx, rgx, (eps + 2 * _sum_part(n)) * gx_scale + _floor(dtype), f"layer_norm x.grad {dtype} n={n}")
    rows = 6
    gw_scale = (g.double() * (x_hat.abs() + 1)).abs().sum((0, 1))
    _assert_close(gw, rgw, (2 * eps + 2 * _sum_part(n) + rows * eps) * gw_scale + _floor(dtype),
                  f"layer_norm w.grad {dtype} n={n}")
    _assert_close(gb, rgb, (rows * eps) * g.double().abs().sum((0, 1)) + _floor(dtype), f"layer_norm b.grad {dtype}")


# --- rotary embedding ----------------------------------------------------------------------

def _rope_reference(x, positions, base, scale, traditional):
    """float64 RoPE of x (B, H, T, D) at positions (B, T)."""
    d = x.shape[-1]
    inv_freq = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    theta = (scale * positions.double())[:, None, :, None] * inv_freq       # (B, 1, T, D/2)
    cos, sin = theta.cos(), theta.sin()
    if traditional:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1).flatten(-2), x1, x2, theta
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1), x1, x2, theta


def _rope_bound(x1, x2, theta, base, dtype, traditional):
    """The kernel computes the frequency as exp2(-(i / (D/2)) * log2(base)) and theta =
    (scale * position) * frequency in float32: the exponent's rounding moves the frequency
    by ln2 * |exponent| * E32/2 relative, exp2 and the two products by a few E32 more, so
    theta is off by |theta| (ln2 log2(base) / 2 + 3) E32; cos and sin by E32 each. The
    rotated pair moves by (|x1| + |x2|) times that, plus two products and a sum in float32,
    and one rounding into T."""
    d_theta = theta * (math.log(base) / 2 + 3) * E32 + 2 * E32
    per_pair = (x1.abs() + x2.abs()) * (d_theta + 3 * E32)
    pair = torch.cat([per_pair, per_pair], -1) if not traditional else torch.stack([per_pair, per_pair], -1).flatten(-2)
    return pair, _half_ulp(dtype)


@dtypes
@pytest.mark.parametrize("traditional", [False, True], ids=["halves", "traditional"])
@pytest.mark.parametrize("offset", ["int", "per batch"])
def test_rope(defined, dtype, traditional, offset):
    batch, heads, t, d, base = 2, 5, 7, 32, 10000.0   # 5 heads: the last thread of four has one
    x = _data((batch, heads, t, d), dtype, seed=30 + traditional)
    offsets = torch.tensor([3, 250], dtype=torch.int32) if offset == "per batch" else 17
    y = mlx.rope(x, offsets, base=base, scale=0.5, traditional=traditional)
    start = offsets.double()[:, None] if offset == "per batch" else torch.full((batch, 1), 17.0, dtype=torch.float64)
    positions = start + torch.arange(t, dtype=torch.float64)
    reference, x1, x2, theta = _rope_reference(x.double(), positions, base, 0.5, traditional)
    pair, half = _rope_bound(x1, x2, theta, base, dtype, traditional)
    _assert_close(y, reference, pair + half * reference.abs() + _floor(dtype),
                  f"rope {dtype} {offset} traditional={traditional}")


@dtypes
def test_rope_gradient_rotates_back(defined, dtype):
    """RoPE is a rotation: its gradient is the inverse rotation of the upstream gradient,
    which MLX's kernel computes with the function constant forward = False."""
    x = _data((1, 4, 5, 64), dtype, seed=33, grad=True)
    g = _data((1, 4, 5, 64), dtype, seed=34)
    (gx,) = torch.autograd.grad(mlx.rope(x, 9, base=500000.0), x, g)
    positions = 9 + torch.arange(5, dtype=torch.float64)[None]
    reference, g1, g2, theta = _rope_reference(g.double(), positions, 500000.0, 1.0, False)
    inverse, _, _, _ = _rope_reference(g.double(), -positions, 500000.0, 1.0, False)
    pair, half = _rope_bound(g1, g2, theta, 500000.0, dtype, False)
    _assert_close(gx, inverse, pair + half * inverse.abs() + _floor(dtype), f"rope backward {dtype}")


# --- softmax and logsumexp -----------------------------------------------------------------

@dtypes
@pytest.mark.parametrize("n", [1, 100, 4096, 5000])
def test_softmax(defined, dtype, n):
    x = _data((3, 2, n), dtype, seed=40 + n, scale=3)
    y = mlx.softmax(x)
    xd = x.double()
    reference = torch.softmax(xd, -1)
    # float32: x - max rounds (E32/2 |x - max|, amplified by exp), exp a few E32, the
    # row sum and division the sum part; then one rounding into T.
    spread = (xd - xd.amax(-1, keepdim=True)).abs()
    bound = (_half_ulp(dtype) + _sum_part(n) + spread * E32) * reference + _floor(dtype)
    _assert_close(y, reference, bound, f"softmax {dtype} n={n}")


def test_softmax_gradient(defined):
    x, g = _data((4, 300), seed=44, grad=True), _data((4, 300), seed=45)
    (gx,) = torch.autograd.grad(mlx.softmax(x), x, g)
    xd = x.detach().double().requires_grad_()
    (reference,) = torch.autograd.grad(torch.softmax(xd, -1), xd, g.double())
    # y (g - sum(g y)) in torch's float32 on the kernel's y, relative to y (|g| + sum|g y|):
    # the kernel's error in y (the forward bound: the sum part plus E32 |x - max|, with
    # |x - max| < 20 for this data) and torch's sum of 300 products and three more roundings.
    y = torch.softmax(xd.detach(), -1)
    scale = y * (g.double().abs() + (g.double() * y).abs().sum(-1, keepdim=True))
    relative = _sum_part(300) + 20 * E32 + _sum_part(300) + 3 * E32
    _assert_close(gx, reference, relative * scale + 1e-30, "softmax backward")


@dtypes
@pytest.mark.parametrize("n", [1, 100, 4096, 6000])
def test_logsumexp(defined, dtype, n):
    x = _data((2, 3, n), dtype, seed=50 + n, scale=3)
    y = mlx.logsumexp(x)
    reference = torch.logsumexp(x.double(), -1)
    # max + log(sum(exp(x - max))): the sum's relative error is the sum part (plus exp's
    # E32 |x - max|), which log turns into an absolute one; the addition and the rounding
    # into T are relative to the result.
    spread = (x.double() - x.double().amax(-1, keepdim=True)).abs().amax(-1)
    bound = _sum_part(n) + spread * E32 + (_half_ulp(dtype) + E32) * reference.abs()
    _assert_close(y, reference, bound, f"logsumexp {dtype} n={n}")
    assert y.shape == x.shape[:-1] and y.dtype == dtype


def test_logsumexp_gradient(defined):
    x, g = _data((3, 200), seed=54, grad=True), _data((3,), seed=55)
    (gx,) = torch.autograd.grad(mlx.logsumexp(x), x, g)
    xd = x.detach().double().requires_grad_()
    (reference,) = torch.autograd.grad(torch.logsumexp(xd, -1), xd, g.double())
    # g * softmax(x): the softmax bound (|x - max| < 20 for this data), one more rounding.
    y = torch.softmax(xd.detach(), -1)
    _assert_close(gx, reference, (_sum_part(200) + 20 * E32 + E32) * y * g.double().abs()[:, None] + 1e-30,
                  "logsumexp backward")


# --- attention -----------------------------------------------------------------------------

def _attention_reference(q, k, v, scale, causal):
    gqa = q.shape[1] // k.shape[1]
    q, k, v = q.double(), k.double().repeat_interleave(gqa, 1), v.double().repeat_interleave(gqa, 1)
    scores = (q @ k.transpose(-1, -2)) * scale
    if causal:   # aligned to the end, as MLX's kernel: query i sees keys 0 .. N - Tq + i
        tq, n = q.shape[2], k.shape[2]
        keep = torch.arange(n)[None, :] <= (n - tq + torch.arange(tq))[:, None]
        scores = scores.masked_fill(~keep, -math.inf)
    return torch.softmax(scores, -1) @ v


def _attention_bound(q, k, v, scale, reference, dtype):
    """The kernel computes in float32 (sdpa_vector.h): each of a SIMD-group's 32 lanes holds
    D/32 elements of q (pre-scaled) and of a key, and their partial dots meet in a simd_sum
    (5 levels), so a score is off by Delta = (D/32 + 7) E32 times the largest scale |q|.|k|,
    and exp and the max subtraction add a few E32. Weights p_j perturbed by exp(delta_j)
    move the output by at most 2 Delta max|v|. Each SIMD-group then sums its N/32 keys'
    p_j v_j one after the other (rescaled as the running max grows) and the 32 groups'
    sums meet through threadgroup memory and simd_sum: (N/32 + 14) E32 relative to
    max|v|. One rounding into T."""
    gqa = q.shape[1] // k.shape[1]
    kd = k.double().repeat_interleave(gqa, 1)
    score_abs = scale * float((q.double().abs() @ kd.abs().transpose(-1, -2)).max())
    n, d = k.shape[-2], q.shape[-1]
    delta = (d / 32 + 7) * E32 * score_abs + 4 * E32
    v_max = float(v.double().abs().max())
    return (2 * delta + (n / 32 + 14) * E32) * v_max + _half_ulp(dtype) * reference.abs() + _floor(dtype)


@dtypes
@pytest.mark.parametrize("d, dv", [(64, 64), (96, 64), (128, 128)])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_scaled_dot_product_attention(defined, dtype, d, dv, causal):
    batch, heads, kv_heads, tq, n = 2, 4, 2, 3, 45
    q = _data((batch, heads, tq, d), dtype, seed=d + 60)
    k, v = _data((batch, kv_heads, n, d), dtype, seed=d + 61), _data((batch, kv_heads, n, dv), dtype, seed=d + 62)
    out = mlx.scaled_dot_product_attention(q, k, v, causal=causal)
    assert (out.shape, out.dtype) == ((batch, heads, tq, dv), dtype)
    reference = _attention_reference(q, k, v, d ** -0.5, causal)
    _assert_close(out, reference, _attention_bound(q, k, v, d ** -0.5, reference, dtype),
                  f"sdpa {dtype} {d}x{dv} causal={causal}")


def test_attention_head_dimensions_without_a_kernel_are_refused(defined):
    q, k = torch.randn(1, 2, 1, 32), torch.randn(1, 2, 5, 32)
    with pytest.raises(ValueError, match=r"no attention kernel for head dimensions \(D, Dv\) = \(32, 32\)"):
        mlx.scaled_dot_product_attention(q, k, k)
    # The operator itself refuses before its kernel reads 64 elements per head.
    with pytest.raises(tm.KernelArgumentError, match=r"expected size\(q, 3\) == 64, got 32"):
        defined["sdpa_vector_64_64"](q, k, k, 0.1, False)


# --- matrix products -----------------------------------------------------------------------

def _gemm_bound(a, b, reference, dtype):
    """steel GEMM accumulates in float32, K products one 8 x 8 block after another (per
    output element a serial sum of K terms): K E32 times sum |a||b| (the usual gamma_K
    bound), then one rounding into T."""
    k = a.shape[-1]
    return k * E32 * (a.double().abs() @ b.double().abs()) + _half_ulp(dtype) * reference.abs() + _floor(dtype)


@dtypes
@pytest.mark.parametrize("m, k, n", [(1, 1, 1), (64, 48, 256), (70, 33, 100), (5, 300, 7)], ids=str)
def test_matmul(defined, dtype, m, k, n):
    """Whole tiles (64 x 48 x 256: align_M, align_N, align_K true) and edges of each."""
    a, b = _data((m, k), dtype, seed=m + k), _data((k, n), dtype, seed=n)
    reference = a.double() @ b.double()
    _assert_close(mlx.matmul(a, b), reference, _gemm_bound(a, b, reference, dtype), f"matmul {dtype} {m}x{k}x{n}")


@dtypes
def test_batched_matmul_and_addmm(defined, dtype):
    a, b = _data((3, 20, 50), dtype, seed=100), _data((3, 50, 40), dtype, seed=101)
    reference = a.double() @ b.double()
    _assert_close(mlx.matmul(a, b), reference, _gemm_bound(a, b, reference, dtype), f"bmm {dtype}")
    a, b = a[0], b[0]
    for c in (_data((20, 40), dtype, seed=102), _data((40,), dtype, seed=103)):   # a matrix, a bias row
        reference = 0.5 * c.double() + 2.0 * (a.double() @ b.double())
        # alpha * (a @ b) + beta * c in float32: two more roundings relative to the terms.
        bound = 2 * _gemm_bound(a, b, reference, dtype) + 2 * E32 * 0.5 * c.double().abs()
        _assert_close(mlx.addmm(c, a, b, beta=0.5, alpha=2.0), reference, bound, f"addmm {dtype} c={tuple(c.shape)}")


def test_addmm_reads_only_its_inputs(defined):
    """The kernel reads C in whole 32-row tiles; mlx.addmm pads C so the last, partial tile
    reads nothing past it (checked execution would raise KernelMemoryError), for C a matrix
    and a bias row, and gradients reach the caller's C unpadded."""
    a, b = _data((20, 50), seed=110), _data((50, 40), seed=111)
    for c in (_data((20, 40), seed=112, grad=True), _data((40,), seed=113, grad=True)):
        with tm.checked():
            out = mlx.addmm(c, a, b, beta=0.5)
        torch.testing.assert_close(out, torch.addmm(c, a, b, beta=0.5), rtol=1e-5, atol=1e-5)
        (gc,) = torch.autograd.grad(out, c, torch.ones_like(out))
        assert gc.shape == c.shape
        torch.testing.assert_close(gc, torch.full_like(c, 0.5) if c.dim() == 2 else torch.full_like(c, 10.0))


def test_matmul_gradients(defined):
    a, b, g = _data((30, 20), seed=104, grad=True), _data((20, 25), seed=105, grad=True), _data((30, 25), seed=106)
    ga, gb = torch.autograd.grad(mlx.matmul(a, b), (a, b), g)
    ad, bd = a.detach().double(), b.detach().double()
    _assert_close(ga, g.double() @ bd.t(), 25 * E32 * (g.double().abs() @ bd.abs().t()) + 1e-30, "matmul a.grad")
    _assert_close(gb, ad.t() @ g.double(), 30 * E32 * (ad.abs().t() @ g.double().abs()) + 1e-30, "matmul b.grad")


# --- variants and edge cases ----------------------------------------------------------------

def test_looped_kernels_take_short_rows_too(defined):
    """The functions switch to the looped kernels above 4,096 elements, as MLX does; the
    looped operators take any row, and agree with the block ones (float32, 100 elements)."""
    x, w = _data((3, 100), seed=90), _data((100,), seed=91)
    # Each is within its float32 bound of the exact result (the tests above): their
    # difference within twice that, relative to what the error scales with (layer norm's
    # output can cancel against its bias, so its scale is the forward test's).
    _, layer_norm_scale, _, _ = _layer_norm_scales(x.double(), w.double())
    for name, args in [("rms_norm", (x, w, EPS)), ("layer_norm", (x, w, w, EPS)), ("softmax", (x,)),
                       ("logsumexp", (x,))]:
        block, looped = defined[name](*args), defined[name + "_looped"](*args)
        scale = layer_norm_scale + w.double().abs() if name == "layer_norm" else block.double().abs()
        _assert_close(looped, block.double(), 2 * (_sum_part(100) + E32) * scale + 1e-30,
                      f"{name}_looped against {name}")


def test_empty_inputs_give_empty_outputs(defined):
    w = torch.ones(8)
    assert mlx.rms_norm(torch.zeros(0, 8), w).shape == (0, 8)
    assert mlx.layer_norm(torch.zeros(2, 0, 8), w, w).shape == (2, 0, 8)
    assert mlx.softmax(torch.zeros(0, 8)).shape == (0, 8)
    assert mlx.logsumexp(torch.zeros(3, 0, 8)).shape == (3, 0)
    assert mlx.rope(torch.zeros(0, 2, 3, 8)).shape == (0, 2, 3, 8)
    q, k = torch.zeros(1, 2, 0, 64), torch.zeros(1, 2, 3, 64)
    assert mlx.scaled_dot_product_attention(q, k, k).shape == (1, 2, 0, 64)
    with pytest.raises(tm.KernelArgumentError, match=r"expected size\(x, -1\) >= 1, got 0"):
        mlx.softmax(torch.zeros(2, 0))


# --- preconditions -------------------------------------------------------------------------

@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_preconditions_refuse_calls_the_kernels_would_get_wrong(defined, device):
    x = torch.zeros(2, 5000, device=device)
    cases = [
        (lambda: defined["rms_norm"](x, torch.ones(5000, device=device), EPS), "size(x, -1) <= 4096"),
        (lambda: defined["rms_norm"](x[:, :10], torch.ones(9, device=device), EPS), "size(w, 0) == size(x, -1)"),
        (lambda: defined["softmax"](x), "size(x, -1) <= 4096"),
        (lambda: defined["logsumexp_looped"](x[None]), "dim(x) == 2"),
        (lambda: defined["rope"](torch.zeros(1, 2, 3, 5, device=device), torch.zeros(1, dtype=torch.int32,
                                 device=device), 1.0, 1.0, False, True), "size(x, 3) % 2 == 0"),
        (lambda: defined["mm"](torch.zeros(3, 4, device=device), torch.zeros(5, 2, device=device)),
         "size(b, 0) == size(a, -1)"),
    ]
    for call, precondition in cases:
        with pytest.raises(tm.KernelArgumentError) as raised:
            call()
        assert f"expected {precondition}" in str(raised.value)


# --- torch.compile -------------------------------------------------------------------------

@pytest.mark.usefixtures("fresh_dynamo")
def test_one_graph_through_norm_rope_attention_and_softmax(defined):
    def block(x, w, k, v):
        h = mlx.rms_norm(x, w, EPS)
        q = mlx.rope(h, 4)
        return mlx.softmax(mlx.scaled_dot_product_attention(q, k, v, causal=True))

    x, w = _data((1, 4, 2, 64), seed=70), _data((64,), seed=71)
    k, v = _data((1, 2, 6, 64), seed=72), _data((1, 2, 6, 64), seed=73)
    compiled = torch.compile(block, fullgraph=True)
    assert torch.equal(compiled(x, w, k, v), block(x, w, k, v))   # the same kernels run
    explained = torch._dynamo.explain(block)(x, w, k, v)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


@pytest.mark.usefixtures("fresh_dynamo")
def test_dynamic_shapes_compile_once_for_every_sequence_length(defined):
    def f(x, w):
        return mlx.rope(mlx.rms_norm(x, w, EPS), 3)

    compiled = torch.compile(f, fullgraph=True, dynamic=True)
    w = _data((64,), seed=74)
    for t in (3, 5, 8):
        x = _data((1, 2, t, 64), seed=75 + t)
        assert torch.equal(compiled(x, w), f(x, w)), t


_FIRST_USE_CHILD = """
import sys, torch
from torch_metallib import mlx
def f(x, w):
    return mlx.rms_norm(x, w, 1e-5)
x, w = torch.randn(2, 64), torch.randn(64)
try:
    torch.compile(f, fullgraph=True)(x, w)
except Exception as error:
    print("refused" if "call torch_metallib.mlx.load()" in str(error) else "other: " + str(error)[-500:])
torch._dynamo.reset()
mlx.load(sys.argv[1])
print("compiled" if torch.equal(torch.compile(f, fullgraph=True)(x, w), f(x, w)) else "differs")
"""


def test_first_use_while_compiling_says_to_load_first(mlx_path):
    """Defining operators cannot happen inside a traced graph: a first use under
    torch.compile(fullgraph=True) is refused with a message naming load(); after load()
    the same function compiles. In a child process, where nothing is defined yet."""
    child = subprocess.run([sys.executable, "-c", _FIRST_USE_CHILD, mlx_path], capture_output=True, text=True,
                           cwd=os.path.dirname(__file__), timeout=300)
    assert child.returncode == 0, child.stderr[-3000:]
    assert child.stdout.split() == ["refused", "compiled"], child.stdout


# --- opcheck -------------------------------------------------------------------------------

OPCHECK_TESTS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def _opcheck_sample(name):
    """(args) for operator `name`: inputs require grad where the operator has a backward."""
    grad = not name.endswith("_backward")
    n = 5000 if "looped" in name else 100
    if name.startswith(("rms_norm", "layer_norm")):
        x, w = _data((3, n), seed=80, grad=grad), _data((n,), seed=81, grad=grad)
        if name.endswith("_backward"):
            return (x, w, _data((3, n), seed=82), EPS)
        return (x, w, _data((n,), seed=83, grad=grad), EPS) if name.startswith("layer_norm") else (x, w, EPS)
    if name == "rope":
        return (_data((2, 3, 4, 16), seed=84, grad=True), torch.tensor([1, 5], dtype=torch.int32), 1.0,
                math.log2(10000.0), False, True)
    if name == "mm":
        return (_data((40, 20), seed=89, grad=True), _data((20, 33), seed=90, grad=True))
    if name == "bmm":
        return (_data((2, 40, 20), seed=91, grad=True), _data((2, 20, 33), seed=92, grad=True))
    if name == "addmm":   # a matrix C of whole 32-row tiles (mlx.addmm pads it); M = 40
        return (_data((64, 33), seed=93, grad=True), _data((40, 20), seed=94, grad=True),
                _data((20, 33), seed=95, grad=True), 0.5, 2.0)
    if name.startswith(("softmax", "logsumexp")):
        return (_data((3, n), seed=85, grad=True),)
    d, dv = map(int, name.split("_")[-2:])
    return (_data((1, 2, 1, d), seed=86), _data((1, 1, 3, d), seed=87), _data((1, 1, 3, dv), seed=88), 0.1, False)


OPERATORS = ["rms_norm", "rms_norm_backward", "rms_norm_looped", "rms_norm_looped_backward", "layer_norm",
             "layer_norm_backward", "layer_norm_looped", "layer_norm_looped_backward", "rope", "softmax",
             "logsumexp", "softmax_looped", "logsumexp_looped", "sdpa_vector_64_64", "sdpa_vector_96_64",
             "sdpa_vector_96_96", "sdpa_vector_128_128", "sdpa_vector_192_128", "sdpa_vector_192_192",
             "sdpa_vector_256_256", "sdpa_vector_512_512", "mm", "bmm", "addmm"]


def test_every_operator_has_an_opcheck(defined):
    # steel attention and quantized operators have theirs in test_mlx_attention.py and test_mlx_quantized.py
    others = {n for n in defined if n.startswith(("steel_attention_", "affine_"))}
    assert sorted(set(defined) - others) == sorted(OPERATORS)


@pytest.mark.parametrize("name", OPERATORS)
def test_opcheck(defined, name):
    result = torch.library.opcheck(defined[name].op, _opcheck_sample(name), test_utils=OPCHECK_TESTS)
    assert result == {test: "SUCCESS" for test in OPCHECK_TESTS}

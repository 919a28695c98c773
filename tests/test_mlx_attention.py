"""torch_metallib.mlx's attention for prefill (MLX's steel attention kernels) on the CPU
backend, against torch.nn.functional.scaled_dot_product_attention in float64 on the same
(rounded) inputs: no mask, causal, additive and boolean masks broadcast as MLX allows,
grouped-query attention, lengths that are whole blocks (32 queries, 32 or 16 keys) and
lengths that are not; which kernel the function picks; the preconditions; opcheck and one
torch.compile(fullgraph=True) graph.

Each function-constant combination (dtype, aligned or not, causal, mask kind) compiles its
kernel once (about a second on the CPU), so the fast tests use head dimension 64 with all
dtypes; the other head dimensions run in a slow-marked test.
"""

import math

import pytest
import torch
import torch.nn.functional as F

import torch_metallib as tm
from torch_metallib import mlx
from torch_metallib.mlx._steel_attention import STEEL_HEAD_DIMS, steel_dtypes

E32 = torch.finfo(torch.float32).eps
FLOATS = [torch.float32, torch.float16, torch.bfloat16]
dtypes = pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: str(d).replace("torch.", ""))
OPCHECK_TESTS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def _data(shape, dtype=torch.float32, seed=0) -> torch.Tensor:
    """Seeded normal data rounded to `dtype` (the reference then sees the same values)."""
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _qkv(dtype, tq, tk, d=64, dv=64, batch=2, heads=4, kv_heads=2, seed=0):
    return (_data((batch, heads, tq, d), dtype, seed), _data((batch, kv_heads, tk, d), dtype, seed + 1),
            _data((batch, kv_heads, tk, dv), dtype, seed + 2))


def _causal(tq, tk) -> torch.Tensor:
    """MLX's causal mask, aligned to the end: query i sees keys 0 .. tk - tq + i."""
    return torch.ones(tq, tk, dtype=torch.bool).tril(tk - tq)


def _reference(q, k, v, scale, mask=None, causal=False):
    """torch's SDPA in float64, the key and value heads repeated for grouped-query attention;
    torch's is_causal where it means MLX's alignment (tq == tk), else the mask built."""
    groups = q.shape[1] // k.shape[1]
    q, k, v = q.double(), k.double().repeat_interleave(groups, 1), v.double().repeat_interleave(groups, 1)
    tq, tk = q.shape[2], k.shape[2]
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.double()
    if causal and mask is None and tq == tk:
        return F.scaled_dot_product_attention(q, k, v, scale=scale, is_causal=True)
    if causal:
        keep = _causal(tq, tk)
        mask = keep if mask is None else (mask & keep if mask.dtype == torch.bool
                                          else mask.masked_fill(~keep, -math.inf))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def _bound(q, k, v, scale, reference, dtype, mask=None):
    """The kernel computes in float32 (steel_attention.h): a score is a sum of D products in
    8 x 8 matrix steps, off by (D + 8) E32 times the largest scale |q|.|k| (plus E32 times
    an additive mask's largest finite value, added after scaling); weights off by exp(delta)
    move the output by at most 2 delta max|v|. The weighted values and the weights' sum run
    over the N keys one block after another, rescaled once per block as the running max
    grows: (N + 2 N / 16 + 8) E32 relative to max|v|. One rounding into T."""
    groups = q.shape[1] // k.shape[1]
    kd = k.double().repeat_interleave(groups, 1)
    score_abs = scale * float((q.double().abs() @ kd.abs().transpose(-1, -2)).max())
    if mask is not None and mask.dtype != torch.bool:
        finite = mask.double()[mask.isfinite()]
        score_abs += float(finite.abs().max()) if finite.numel() else 0.0
    n, d = k.shape[-2], q.shape[-1]
    delta = (d + 8) * E32 * score_abs
    v_max = float(v.double().abs().max())
    info = torch.finfo(dtype)
    return ((2 * delta + (n + n / 8 + 8) * E32) * v_max + info.eps / 2 * reference.abs()
            + 2 * info.smallest_normal * info.eps)


def _assert_close(actual, reference, bound, what):
    assert actual.shape == reference.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(reference.shape)}"
    error = (actual.double() - reference).abs()
    ratio = error / bound
    worst = int(ratio.flatten().argmax())
    assert bool((error <= bound).all()), (
        f"{what}: element {worst} is {actual.flatten()[worst].item()!r}, reference "
        f"{reference.flatten()[worst].item()!r}: error {error.flatten()[worst].item():.3g} exceeds the bound "
        f"{bound.flatten()[worst].item():.3g} ({ratio.flatten()[worst].item():.2f}x)")


def _check(q, k, v, mask=None, causal=False, what=""):
    dtype, scale = q.dtype, q.shape[-1] ** -0.5
    out = mlx.scaled_dot_product_attention(q, k, v, mask=mask, causal=causal)
    assert (out.shape, out.dtype) == ((*q.shape[:3], v.shape[-1]), dtype)
    kernel_mask = mask.to(dtype) if mask is not None and mask.dtype != torch.bool else mask  # as MLX casts it
    reference = _reference(q, k, v, scale, kernel_mask, causal)
    _assert_close(out, reference, _bound(q, k, v, scale, reference, dtype, kernel_mask), what)


# --- results against torch ----------------------------------------------------------------

@dtypes
@pytest.mark.parametrize("tq, tk", [(64, 64), (37, 45)], ids=["aligned", "ragged"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_prefill_matches_torch(defined, dtype, tq, tk, causal):
    q, k, v = _qkv(dtype, tq, tk, seed=tq)   # 4 query heads over 2 key-value heads
    _check(q, k, v, causal=causal, what=f"{dtype} {tq}x{tk} causal={causal}")


@dtypes
@pytest.mark.parametrize("kind", ["float", "bool"])
def test_masks_broadcast_as_mlx_allows(defined, dtype, kind):
    tq, tk = 37, 45
    q, k, v = _qkv(dtype, tq, tk, seed=5)
    for shape in [(2, 4, tq, tk), (tq, tk), (2, 1, 1, tk), (1, 4, tq, 1)]:
        seed = sum(shape)
        if kind == "float":
            mask = _data(shape, torch.float32, seed) * 2
            if shape[-1] == tk:
                mask[..., 1::3] = -math.inf   # what additive masks hold to drop keys
        else:
            mask = torch.rand(shape, generator=torch.Generator().manual_seed(seed)) > 0.3
        if shape[-1] == tk:
            mask[..., 0] = 0 if kind == "float" else True   # every query keeps a key
        elif kind == "bool":
            mask[:] = True
        _check(q, k, v, mask=mask, what=f"{dtype} {kind} mask {shape}")


def test_a_mask_combines_with_causal_and_expanded_masks_are_read_in_place(defined):
    q, k, v = _qkv(torch.float32, 40, 70, seed=9)
    mask = _data((1, 1, 1, 70), seed=10)
    _check(q, k, v, mask=mask, causal=True, what="float mask and causal")
    expanded = mask.expand(2, 4, 40, 70)
    assert torch.equal(mlx.scaled_dot_product_attention(q, k, v, mask=expanded),
                       mlx.scaled_dot_product_attention(q, k, v, mask=mask))


@pytest.mark.parametrize("d, dv", [(96, 64), (128, 128)])
def test_other_head_dimensions(defined, d, dv):
    """(96, 64): values narrower than keys; (128, 128): key blocks of 16."""
    q, k, v = _qkv(torch.float32, 33, 50, d, dv, seed=d)
    _check(q, k, v, causal=True, what=f"{d}x{dv}")


@pytest.mark.slow
@pytest.mark.parametrize("d, dv, dtype", [(d, dv, dtype) for d, dv in STEEL_HEAD_DIMS for dtype in steel_dtypes(d, dv)],
                         ids=str)
def test_every_head_dimension(defined, d, dv, dtype):
    q, k, v = _qkv(dtype, 45, 70, d, dv, heads=2, kv_heads=1, seed=d + dv)
    _check(q, k, v, causal=True, what=f"{dtype} {d}x{dv}")
    mask = torch.rand(2, 1, 45, 70, generator=torch.Generator().manual_seed(d)) > 0.5
    mask[..., 0] = True
    _check(q, k, v, mask=mask, what=f"{dtype} {d}x{dv} bool mask")


# --- which kernel runs ----------------------------------------------------------------------

def test_up_to_eight_queries_without_a_mask_run_sdpa_vector(defined):
    """As MLX: sdpa_vector for Tq <= 8 without a mask, steel attention beyond or with a
    mask; both align the causal mask to the end, so they agree where both run."""
    q, k, v = _qkv(torch.float32, 12, 30, seed=20)
    for tq in (8, 9):
        chosen = mlx.scaled_dot_product_attention(q[:, :, :tq], k, v, causal=True)
        vector = defined["sdpa_vector_64_64"](q[:, :, :tq], k, v, 0.125, True)
        steel = defined["steel_attention_64_64"](q[:, :, :tq], k, v, 0.125, True)
        assert torch.equal(chosen, vector if tq <= 8 else steel)
        reference = _reference(q[:, :, :tq], k, v, 0.125, causal=True)
        _assert_close(vector, reference, _bound(q[:, :, :tq], k, v, 0.125, reference, torch.float32), "vector")
    mask = torch.zeros(1, 30)
    assert torch.equal(mlx.scaled_dot_product_attention(q[:, :, :2], k, v, mask=mask),
                       defined["steel_attention_64_64_mask"](q[:, :, :2], k, v, mask[None, None], 0.125, False))


def test_float32_at_head_dimension_192_has_no_steel_kernel(defined):
    """Its kernel needs more threadgroup memory than Metal has; up to 8 queries without a
    mask still run on sdpa_vector."""
    q, k = torch.zeros(1, 1, 9, 192), torch.zeros(1, 1, 9, 192)
    with pytest.raises(tm.KernelArgumentError, match="has kernels for torch.float16, torch.bfloat16"):
        mlx.scaled_dot_product_attention(q, k, k)
    assert mlx.scaled_dot_product_attention(q[:, :, :8], k, k).shape == (1, 1, 8, 192)


def test_head_dimensions_without_a_kernel_are_refused(defined):
    q, k = torch.randn(1, 2, 20, 32), torch.randn(1, 2, 20, 32)
    with pytest.raises(ValueError, match=r"no attention kernel for head dimensions \(D, Dv\) = \(32, 32\)"):
        mlx.scaled_dot_product_attention(q, k, k)
    q, k = torch.randn(1, 2, 2, 512), torch.randn(1, 2, 20, 512)   # sdpa_vector only, no masked kernel
    with pytest.raises(ValueError, match=r"\(512, 512\) with a mask"):
        mlx.scaled_dot_product_attention(q, k, k, mask=torch.zeros(2, 20))


# --- preconditions --------------------------------------------------------------------------

@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_preconditions_refuse_what_the_kernels_would_read_or_write_out_of_bounds(defined, device):
    def t(*shape, dtype=torch.float32):
        return torch.zeros(shape, dtype=dtype, device=device)

    q, k = t(1, 4, 40, 64), t(1, 2, 50, 64)
    plain, masked = defined["steel_attention_64_64"], defined["steel_attention_64_64_mask"]
    cases = [
        (lambda: plain(t(1, 4, 40, 32), t(1, 2, 50, 32), t(1, 2, 50, 32), 0.1, False), "size(q, 3) == 64"),
        (lambda: plain(q, k, t(1, 2, 50, 96), 0.1, False), "size(v, 3) == 64"),
        (lambda: plain(q, t(1, 3, 50, 64), t(1, 3, 50, 64), 0.1, False), "size(q, 1) % size(k, 1) == 0"),
        (lambda: plain(q, k, t(1, 2, 49, 64), 0.1, False), "size(v, 2) == size(k, 2)"),
        (lambda: plain(q, t(1, 2, 0, 64), t(1, 2, 0, 64), 0.1, False), "size(k, 2) >= 1"),
        (lambda: plain(t(1, 4, 60, 64), k, k, 0.1, True), "causal * size(q, 2) <= size(k, 2)"),
        (lambda: masked(q, k, k, t(1, 1, 3, 50), 0.1, False),
         "(size(mask, 2) == 1) + (size(mask, 2) == size(q, 2)) >= 1"),
        (lambda: masked(q, k, k, t(1, 1, 40, 49), 0.1, False), "size(mask, 3) == size(k, 2)"),
        (lambda: masked(q, k, k, t(40, 50), 0.1, False), "dim(mask) == 4"),
    ]
    for call, precondition in cases:
        with pytest.raises(tm.KernelArgumentError) as raised:
            call()
        assert f"expected {precondition}" in str(raised.value)
    with pytest.raises(tm.KernelArgumentError, match="float32"):   # an additive mask has q's dtype
        masked(q, k, k, t(1, 1, 40, 50, dtype=torch.float16), 0.1, False)


def test_the_function_refuses_masks_of_more_than_four_dimensions(defined):
    q, k, v = _qkv(torch.float32, 10, 10)
    with pytest.raises(ValueError, match=r"at most 4 dimensions, got shape \(1, 2, 4, 10, 10\)"):
        mlx.scaled_dot_product_attention(q, k, v, mask=torch.zeros(1, 2, 4, 10, 10))


# --- torch.library and torch.compile --------------------------------------------------------

@pytest.mark.parametrize("name", ["steel_attention_64_64", "steel_attention_64_64_mask",
                                  "steel_attention_64_64_bool_mask"])
def test_opcheck(defined, name):
    q, k, v = _qkv(torch.float32, 33, 40, batch=1, seed=30)
    masks = {"steel_attention_64_64_mask": (torch.zeros(1, 1, 33, 40),),
             "steel_attention_64_64_bool_mask": (torch.ones(1, 4, 1, 40, dtype=torch.bool),)}
    result = torch.library.opcheck(defined[name].op, (q, k, v, *masks.get(name, ()), 0.125, True),
                                   test_utils=OPCHECK_TESTS)
    assert result == {test: "SUCCESS" for test in OPCHECK_TESTS}


def test_one_graph_with_masks_and_causal(defined):
    torch._dynamo.reset()

    def attend(q, k, v, mask):
        return mlx.scaled_dot_product_attention(q, k, v, mask=mask) + mlx.scaled_dot_product_attention(
            q, k, v, causal=True)

    q, k, v = _qkv(torch.float32, 40, 40, seed=40)
    mask = torch.rand(40, 40, generator=torch.Generator().manual_seed(41)) > 0.2
    mask[:, 0] = True
    try:
        compiled = torch.compile(attend, fullgraph=True)
        assert torch.equal(compiled(q, k, v, mask), attend(q, k, v, mask))
        explained = torch._dynamo.explain(attend)(q, k, v, mask)
        assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    finally:
        torch._dynamo.reset()

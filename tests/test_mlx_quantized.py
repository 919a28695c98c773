"""torch_metallib.mlx's affine-quantized matrix products (MLX's affine_qmv_fast, affine_qmv,
affine_qmm_t, affine_qmm_n) on the CPU backend against x @ dequantize(w) in float64, the
torch quantize() against hand-computed packings and MLX's own affine_quantize kernel, the
operators' preconditions, torch.compile and torch.library.opcheck.

Tolerance: the kernels load x, the scales and biases into float32 and accumulate there
(qmv as scale * sum(x q) + bias * sum(x) per group; qmm_t / qmm_n dequantize each tile into
T first, one rounding of T per weight, then float32 MMA). The error is bounded by the
magnitudes summed, sum |x| (|scale| q + |bias|), times (8 + log2 K) float32 roundings, plus
one ulp of T per weight where T is not float32, plus half an ulp of T for the result.
"""

import math

import pytest
import torch

import torch_metallib as tm
from torch_metallib import mlx
from torch_metallib.mlx._quantized import BITS, GROUP_SIZES

E32 = torch.finfo(torch.float32).eps
DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
TYPE_NAMES = {torch.float32: "float", torch.float16: "float16_t", torch.bfloat16: "bfloat16_t"}


def _data(shape, dtype=torch.float32, seed=0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _quantized(shape, dtype, group_size, bits, seed):
    return mlx.quantize(_data(shape, dtype, seed), group_size, bits)


def _check(y, x, wq, s, b, group_size, bits, transpose, what):
    """y against x @ dequantize(w) (.T when transposed) in float64, with the bound above."""
    w = mlx.dequantize(wq, s.double(), b.double(), group_size, bits)
    w_abs = mlx.dequantize(wq, s.double().abs(), b.double().abs(), group_size, bits)
    if transpose:
        w, w_abs = w.T, w_abs.T
    reference = x.double() @ w
    magnitude = x.double().abs() @ w_abs
    k = x.shape[-1]
    weight_rounding = 0 if x.dtype == torch.float32 else torch.finfo(x.dtype).eps
    bound = magnitude * ((8 + math.log2(k)) * E32 + weight_rounding) + reference.abs() * torch.finfo(x.dtype).eps / 2
    assert y.dtype == x.dtype and y.shape == reference.shape, what
    error = (y.double() - reference).abs()
    worst = int((error / bound).flatten().argmax())
    assert bool((error <= bound).all()), (f"{what}: element {worst}: error {error.flatten()[worst]:.3g} exceeds "
                                          f"{bound.flatten()[worst]:.3g}")


# --- quantize -------------------------------------------------------------------------------

def test_quantize_packs_4_bits_as_mlx_does():
    """One group of 32: v = 0.5 q - 2 for q = 0..15 twice. max (5.5) is the endpoint of larger
    magnitude: scale = -(7.5 / 15) = -0.5, q0 = round(5.5 / -0.5) = -11, so scale = 5.5 / -11
    = -0.5 and bias = 5.5; stored q = (v - 5.5) / -0.5 = 15 - q, 8 to a word, first in the
    low nibble."""
    q = torch.arange(32) % 16
    w = (0.5 * q - 2).reshape(1, 32)
    wq, s, b = mlx.quantize(w, group_size=32, bits=4)
    assert wq.dtype == torch.uint32 and s.dtype == b.dtype == torch.float32
    assert wq.tolist() == [[0x89ABCDEF, 0x01234567, 0x89ABCDEF, 0x01234567]]
    assert s.tolist() == [[-0.5]] and b.tolist() == [[5.5]]
    assert torch.equal(mlx.dequantize(wq, s, b, group_size=32, bits=4), w)


def test_quantize_packs_8_bits_as_mlx_does():
    """v = 0.125 q - 31.875 for q = 0, 255, 1, 2, ..., 30: min (-31.875) is the larger
    endpoint, scale = 31.875 / 255 = 0.125, bias = -31.875, stored q = q, a byte each."""
    q = torch.tensor([0, 255] + list(range(1, 31)))
    w = (0.125 * q - 31.875).reshape(1, 32).to(torch.bfloat16)    # exact in bfloat16
    wq, s, b = mlx.quantize(w, group_size=32, bits=8)
    assert wq[0, 0].item() == 0x0201FF00 and wq[0, 1].item() == 0x06050403
    assert s.dtype == torch.bfloat16 and s.tolist() == [[0.125]] and b.tolist() == [[-31.875]]
    assert torch.equal(mlx.dequantize(wq, s, b, group_size=32, bits=8), w)


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("group_size", GROUP_SIZES)
def test_quantize_round_trip_is_within_a_step(bits, group_size):
    """Each group's endpoint of larger magnitude comes back exactly (scale = edge / q0);
    the rest within half a step of rounding, except near the other endpoint, which that
    rescaling can leave up to a step outside the range (q is clipped there)."""
    w = _data((5, 256), seed=bits * 1000 + group_size) * 3
    wq, s, b = mlx.quantize(w, group_size, bits)
    assert wq.shape == (5, 256 * bits // 32) and s.shape == b.shape == (5, 256 // group_size)
    back = mlx.dequantize(wq, s, b, group_size, bits)
    step = s.abs().repeat_interleave(group_size, -1)
    assert bool(((back - w).abs() <= step * (1 + 1e-5)).all())
    groups, back_groups = w.reshape(5, -1, group_size), back.reshape(5, -1, group_size)
    edge = groups.abs().argmax(-1, keepdim=True)
    assert torch.allclose(back_groups.gather(-1, edge), groups.gather(-1, edge), rtol=1e-6, atol=0)


@pytest.mark.parametrize("bits, group_size", [(4, 64), (8, 32)])
def test_quantize_matches_mlx_affine_quantize_kernel(mlx_lib, bits, group_size):
    """The same words, scales and biases as MLX's own affine_quantize kernel (launched as
    quantized.cpp does: one thread per max(group_size / 32, 1) values) on float32 groups
    holding both signs. (The Metal kernel differs from MLX's CPU path in two places this
    test avoids: it starts its maximum at 0, so an all-negative group spans [min, 0], and
    Metal's round takes ties away from zero.)"""
    w = _data((6, 256), seed=7) * 3
    wq, s, b = mlx.quantize(w, group_size, bits)
    out, scales, biases = torch.zeros_like(wq), torch.zeros_like(s), torch.zeros_like(b)
    threads = w.numel() // max(group_size // 32, 1)
    mlx_lib[f"affine_quantize_float_gs_{group_size}_b_{bits}"](
        w=w, out=out.view(torch.uint8), scales=scales, biases=biases, threads=threads, group_size=min(threads, 1024),
        checked=True)
    assert torch.equal(out, wq) and torch.equal(scales, s) and torch.equal(biases, b)


def test_quantize_refuses_layouts_mlx_has_no_kernel_for():
    with pytest.raises(ValueError, match="group_size must be one of"):
        mlx.quantize(torch.zeros(2, 64), group_size=16)
    with pytest.raises(ValueError, match="bits must be one of"):
        mlx.quantize(torch.zeros(2, 64), bits=3)
    with pytest.raises(ValueError, match=r"last dimension \(96\) must be a multiple of group_size \(64\)"):
        mlx.quantize(torch.zeros(2, 96))


# --- the products ---------------------------------------------------------------------------

def test_every_kernel_has_an_operator(defined):
    expected = {f"affine_{family}_gs{gs}_b{bits}" for family in ("qmv_fast", "qmv", "qmm_t", "qmm_t_aligned", "qmm_n")
                for gs in GROUP_SIZES for bits in BITS}
    assert expected == {name for name in defined if name.startswith("affine_")}
    assert all(set(defined[name].kernels) == set(DTYPE_NAMES) for name in expected)


# (dtype, bits, group_size, M, N, K, the operator quantized_matmul picks)
TRANSPOSED = [
    (torch.float32, 4, 64, 1, 64, 512, "qmv_fast"),
    (torch.float16, 8, 32, 3, 24, 256, "qmv_fast"),
    (torch.bfloat16, 4, 128, 2, 13, 384, "qmv"),       # N not whole 8-row tiles
    (torch.float32, 8, 128, 4, 5, 128, "qmv"),         # fewer than 8 rows
    (torch.float32, 4, 32, 1, 16, 96, "qmv"),          # K not a multiple of qmv_fast's step (512)
    (torch.float32, 4, 64, 33, 45, 192, "qmm_t"),      # ragged M and N
    (torch.float16, 8, 32, 40, 64, 96, "qmm_t_aligned"),
    (torch.bfloat16, 4, 128, 33, 32, 256, "qmm_t_aligned"),
]


@pytest.mark.parametrize("dtype, bits, group_size, m, n, k, family", TRANSPOSED,
                         ids=[f"{DTYPE_NAMES[c[0]]}-b{c[1]}-gs{c[2]}-{c[3]}x{c[4]}x{c[5]}-{c[6]}" for c in TRANSPOSED])
def test_quantized_matmul_transposed(defined, dtype, bits, group_size, m, n, k, family):
    x = _data((m, k), dtype, seed=m + n + k)
    wq, s, b = _quantized((n, k), dtype, group_size, bits, seed=k)
    y = mlx.quantized_matmul(x, wq, s, b, group_size=group_size, bits=bits)
    _check(y, x, wq, s, b, group_size, bits, True, family)
    assert torch.equal(y, defined[f"affine_{family}_gs{group_size}_b{bits}"](x, wq, s, b))   # the one it picked


NOT_TRANSPOSED = [
    (torch.float32, 4, 64, 33, 64, 77),     # K not a multiple of the 32-wide K tile
    (torch.float16, 8, 32, 7, 32, 3),
    (torch.bfloat16, 4, 128, 5, 128, 50),
]


@pytest.mark.parametrize("dtype, bits, group_size, m, n, k", NOT_TRANSPOSED,
                         ids=[f"{DTYPE_NAMES[c[0]]}-b{c[1]}-gs{c[2]}-{c[3]}x{c[4]}x{c[5]}" for c in NOT_TRANSPOSED])
def test_quantized_matmul_not_transposed(defined, dtype, bits, group_size, m, n, k):
    x = _data((m, k), dtype, seed=m + n + k)
    wq, s, b = _quantized((k, n), dtype, group_size, bits, seed=n)
    y = mlx.quantized_matmul(x, wq, s, b, transpose=False, group_size=group_size, bits=bits)
    _check(y, x, wq, s, b, group_size, bits, False, "qmm_n")


@pytest.mark.parametrize("shape", [(2, 3, 128), (1, 2, 128), (128,)], ids=["qmm_t", "qmv", "vector"])
def test_leading_dimensions_of_x_are_rows(defined, shape):
    x = _data(shape, seed=11)
    wq, s, b = _quantized((40, 128), torch.float32, 64, 4, seed=12)
    y = mlx.quantized_matmul(x, wq, s, b)
    assert y.shape == (*shape[:-1], 40)
    _check(y.reshape(-1, 40), x.reshape(-1, 128), wq, s, b, 64, 4, True, str(shape))


def test_no_rows_give_an_empty_result(defined):
    wq, s, b = _quantized((40, 128), torch.float32, 64, 4, seed=13)
    assert mlx.quantized_matmul(torch.zeros(0, 128), wq, s, b).shape == (0, 40)


# --- preconditions --------------------------------------------------------------------------

@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_preconditions_refuse_what_the_kernels_would_read_past(defined, device):
    def on(*tensors):
        return [t.to(device) for t in tensors]

    x = torch.zeros(3, 128, device=device)
    wq, s, b = on(*_quantized((13, 128), torch.float32, 64, 4, seed=14))
    cases = [
        (lambda: defined["affine_qmv_fast_gs64_b4"](x, wq, s, b), "size(w, 0) % 8 == 0"),
        (lambda: defined["affine_qmm_t_aligned_gs64_b4"](x, wq, s, b), "size(w, 0) % 32 == 0"),
        (lambda: defined["affine_qmv_gs32_b4"](x, wq, s, b), "size(scales, 1) * 32 == size(x, 1)"),
        (lambda: defined["affine_qmv_gs64_b8"](x, wq, s, b), "size(w, 1) * 4 == size(x, 1)"),
        (lambda: defined["affine_qmm_t_gs64_b4"](x[:, :64], wq, s, b), "size(w, 1) * 8 == size(x, 1)"),
        (lambda: defined["affine_qmm_t_gs64_b4"](x, wq, s, b[:12]), "size(biases, 0) == size(w, 0)"),
        (lambda: defined["affine_qmv_gs64_b4"](x[None], wq, s, b), "dim(x) == 2"),
        (lambda: defined["affine_qmm_n_gs64_b4"](torch.zeros(3, 12, device=device), wq, s, b),
         "size(w, 0) == size(x, 1)"),
    ]
    for call, precondition in cases:
        with pytest.raises(tm.KernelArgumentError) as raised:
            call()
        assert f"expected {precondition}" in str(raised.value)


def test_dtypes_the_kernels_do_not_hold_are_refused(defined):
    x = _data((2, 128), seed=15)
    wq, s, b = _quantized((16, 128), torch.float32, 64, 4, seed=16)
    with pytest.raises(tm.KernelArgumentError, match=r"'scales'.*expected a tensor of torch.float32, got torch.float16"):
        mlx.quantized_matmul(x, wq, s.half(), b)
    with pytest.raises(tm.KernelArgumentError, match=r"'w'.*expected a tensor of torch.uint32 or torch.int32"):
        mlx.quantized_matmul(x, wq.to(torch.int64), s, b)
    with pytest.raises(ValueError, match="bits in"):
        mlx.quantized_matmul(x, wq, s, b, bits=3)


# --- torch.compile and opcheck --------------------------------------------------------------

@pytest.mark.usefixtures("fresh_dynamo")
def test_one_graph_through_qmv_and_qmm(defined):
    w1, w2 = _quantized((64, 128), torch.float32, 64, 4, seed=17), _quantized((64, 128), torch.float32, 32, 8, seed=18)

    def mlp(x):
        h = mlx.quantized_matmul(x, *w1, group_size=64, bits=4)
        return mlx.quantized_matmul(h, *w2, transpose=False, group_size=32, bits=8)

    for rows in (1, 40):                          # qmv_fast, then qmm_t_aligned; qmm_n after both
        x = _data((rows, 128), seed=19 + rows)
        compiled = torch.compile(mlp, fullgraph=True)
        assert torch.equal(compiled(x), mlp(x))
    explained = torch._dynamo.explain(mlp)(x)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


OPCHECK_TESTS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
# One operator of each kernel family: the six (group size, bits) operators of a family are
# defined by the same code, with the same schema and rules.
OPCHECKED = {"affine_qmv_fast_gs64_b4": (2, 16, 512, True), "affine_qmv_gs32_b8": (3, 13, 96, True),
             "affine_qmm_t_gs128_b4": (33, 45, 256, True), "affine_qmm_t_aligned_gs64_b8": (33, 64, 128, True),
             "affine_qmm_n_gs32_b4": (33, 64, 45, False)}


@pytest.mark.parametrize("name", OPCHECKED)
def test_opcheck(defined, name):
    m, n, k, transpose = OPCHECKED[name]
    group_size, bits = (int(part[2:] if part.startswith("gs") else part[1:]) for part in name.split("_")[-2:])
    wq, s, b = _quantized((n, k) if transpose else (k, n), torch.float32, group_size, bits, seed=20)
    result = torch.library.opcheck(defined[name].op, (_data((m, k), seed=21), wq, s, b), test_utils=OPCHECK_TESTS)
    assert result == {test: "SUCCESS" for test in OPCHECK_TESTS}

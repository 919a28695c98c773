"""Operators made by ``torch_metallib.ops.define`` (tests/_ops_examples.py) against torch
references: dtype dispatch, argument checks in eager and fake (meta) mode, a cooperative
kernel (MLX block_softmax), RMS norm with a backward kernel, the in-place and out= variants,
function constants taken from call arguments, torch.compile, and a precondition that keeps
MLX's attention kernel for head dimension 64 from other head dimensions.

Tolerances compare with a float64 reference and are derived per test from the precision
of the kernel's arithmetic; each is explained where it is defined."""

import json
import math
import os
import subprocess
import sys

import pytest
import torch

import torch_metallib as tm
import torch_metallib.ops._define as ops_define
from _ops_examples import EPS, FLOATS

E32 = torch.finfo(torch.float32).eps
DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
SUPPORTED = "torch.float32, torch.float16, torch.bfloat16"

dtypes = pytest.mark.parametrize("dtype", FLOATS, ids=DTYPE_NAMES.get)


# --- helpers ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def examples(mlx_ops):
    """torch.ops.tm_examples, once the session has defined it."""
    return torch.ops.tm_examples


def _data(shape, dtype=torch.float32, seed=0, scale=1.0) -> torch.Tensor:
    """Seeded normal data rounded to `dtype` (the reference then sees the same values)."""
    return (torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype)


def _subnormal_step(dtype) -> float:
    """The spacing of `dtype` values below its normal range."""
    info = torch.finfo(dtype)
    return info.smallest_normal * info.eps


def _ulp(reference: torch.Tensor, dtype) -> torch.Tensor:
    """The spacing of `dtype` values at |reference| (float64): 2**floor(log2|r|) * eps, and
    the subnormal spacing below the normal range."""
    magnitude = reference.abs().clamp_min(torch.finfo(dtype).smallest_normal)
    return torch.exp2(torch.floor(torch.log2(magnitude))) * torch.finfo(dtype).eps


def _assert_close(actual: torch.Tensor, reference: torch.Tensor, bound, what: str):
    """|actual - reference| <= bound elementwise (reference and bound in float64); the
    message names the worst element relative to its bound."""
    assert actual.shape == reference.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(reference.shape)}"
    bound = torch.as_tensor(bound, dtype=torch.float64).expand_as(reference)
    error = (actual.double() - reference).abs()
    if actual.numel() == 0:
        return
    ratio = error / bound
    worst = int(ratio.flatten().argmax())
    assert bool((error <= bound).all()), (
        f"{what}: element {worst} (flat) is {actual.flatten()[worst].item()!r}, reference "
        f"{reference.flatten()[worst].item()!r}: error {error.flatten()[worst].item():.3g} exceeds the bound "
        f"{bound.flatten()[worst].item():.3g} ({ratio.flatten()[worst].item():.2f}x)")


def _exception_chain(error: BaseException):
    seen = []
    while error is not None and error not in seen:
        seen.append(error)
        error = error.__cause__ or error.__context__
    return seen


def _sigmoid_bound(reference: torch.Tensor, dtype) -> torch.Tensor:
    # MLX's sigmoid is a few operations (exp, add, divide, a select), each rounded in the
    # kernel's arithmetic: a correctly rounded result would be within 0.5 ulp; measured
    # worst cases are ~2 ulps (float32, bfloat16). 4 ulps of the output dtype at the
    # reference value bounds that; a kernel of another dtype or a wrong formula is far off.
    return 4 * _ulp(reference, dtype)


# --- elementwise: sigmoid, dispatched by dtype ---------------------------------------------

@pytest.mark.parametrize("name", ["sigmoid", "sigmoid_", "sigmoid.out"])
def test_each_dtype_has_its_own_kernel(mlx_ops, name):
    op = mlx_ops[name]
    assert list(op.kernels) == FLOATS
    assert {dtype: kernel.name for dtype, kernel in op.kernels.items()} == {
        dtype: f"v_Sigmoid{DTYPE_NAMES[dtype]}{DTYPE_NAMES[dtype]}" for dtype in FLOATS}
    base, _, overload = name.partition(".")
    assert op.op is getattr(getattr(torch.ops.tm_examples, base), overload or "default")


@dtypes
def test_sigmoid_runs_the_kernel_of_the_input_dtype(mlx_ops, examples, dtype):
    """Bit for bit what the dtype's kernel writes when called directly."""
    x = _data((5, 77), dtype, seed=1, scale=4)
    direct = torch.full_like(x, float("nan"))
    mlx_ops["sigmoid"].kernels[dtype](x, direct, x.numel(), threads=x.numel())
    result = examples.sigmoid(x)
    assert result.dtype == dtype
    assert torch.equal(result, direct)


@dtypes
@pytest.mark.parametrize("shape", [(), (1,), (7,), (33, 65), (2, 3, 5, 7)], ids=str)
def test_sigmoid_matches_torch(examples, dtype, shape):
    x = _data(shape, dtype, seed=2, scale=4)  # up to |x| ~ 16: saturated and tiny outputs too
    before = x.clone()
    y = examples.sigmoid(x)
    assert (y.dtype, y.shape, y.device) == (dtype, x.shape, x.device) and y.is_contiguous()
    reference = torch.sigmoid(x.double())
    _assert_close(y, reference, _sigmoid_bound(reference, dtype), f"sigmoid {dtype} {shape}")
    assert torch.equal(x, before)  # the functional op leaves its input alone


@dtypes
@pytest.mark.parametrize("shape", [(0,), (0, 3), (4, 0, 2)], ids=str)
def test_sigmoid_of_an_empty_tensor_is_empty(examples, dtype, shape):
    x = torch.empty(shape, dtype=dtype)
    y = examples.sigmoid(x)
    assert (y.dtype, y.shape) == (dtype, x.shape)
    assert examples.sigmoid_(x) is None
    out = torch.empty(shape, dtype=dtype)
    assert examples.sigmoid.out(x, out=out) is None


@dtypes
@pytest.mark.parametrize("view", ["transposed", "strided"])
def test_sigmoid_of_a_non_contiguous_view(examples, dtype, view):
    base = _data((24, 18), dtype, seed=3, scale=4)
    original = base.clone()
    x = base.t() if view == "transposed" else base[1::2, ::3]
    assert not x.is_contiguous()
    y = examples.sigmoid(x)
    assert y.shape == x.shape and y.is_contiguous()
    assert torch.equal(y, examples.sigmoid(x.contiguous()))  # same kernel, same values
    reference = torch.sigmoid(x.double())
    _assert_close(y, reference, _sigmoid_bound(reference, dtype), f"sigmoid of a {view} view")
    assert torch.equal(base, original)


# --- argument checks: dtype and device, eager and fake -------------------------------------

@pytest.mark.parametrize("dtype", [torch.float64, torch.int32], ids=str)
def test_unsupported_dtype_names_the_argument_and_the_kernels(examples, dtype):
    x = torch.arange(6).to(dtype)
    calls = {
        "sigmoid": lambda t: examples.sigmoid(t),
        "sigmoid_": lambda t: examples.sigmoid_(t),
        "sigmoid.out": lambda t: examples.sigmoid.out(t, out=torch.empty_like(t)),
    }
    for name, call in calls.items():
        expected = (f"tm_examples::{name}: argument 'x' has dtype {dtype}; this operator has kernels for "
                    f"{SUPPORTED}. Convert it with .to(...)")
        with pytest.raises(tm.KernelArgumentError) as eager:
            call(x)
        assert str(eager.value) == expected
        # The fake kernel (meta tensors, as torch.compile traces) says the same.
        with pytest.raises(tm.KernelArgumentError) as fake:
            call(x.to("meta"))
        assert str(fake.value) == expected
    assert torch.equal(x, torch.arange(6).to(dtype))  # sigmoid_ did not write


def test_unsupported_dtype_under_torch_compile(examples, fresh_dynamo):
    compiled = torch.compile(lambda t: examples.sigmoid(t), fullgraph=True)
    with pytest.raises(Exception) as raised:
        compiled(torch.randn(4, dtype=torch.float64))
    chain = _exception_chain(raised.value)
    text = "argument 'x' has dtype torch.float64; this operator has kernels for " + SUPPORTED
    assert any(text in str(error) for error in chain), [str(error)[:300] for error in chain]
    assert any(isinstance(error, tm.KernelArgumentError) for error in chain), [type(e) for e in chain]


@pytest.mark.parametrize("x_device, out_device", [("cpu", "meta"), ("meta", "cpu")])
def test_tensors_on_two_devices_are_refused(examples, x_device, out_device):
    x = torch.randn(5, device=x_device)
    out = torch.full((5,), 7.0, device=out_device)
    with pytest.raises(tm.KernelArgumentError) as error:
        examples.sigmoid.out(x, out=out)
    assert str(error.value) == (f"tm_examples::sigmoid.out: tensors on different devices (x: {x_device}, "
                                f"out: {out_device}); move them to one device")
    if out_device == "cpu":
        assert torch.equal(out, torch.full((5,), 7.0))


def test_rms_norm_with_its_weight_on_another_device_is_refused(examples):
    with pytest.raises(tm.KernelArgumentError, match=r"different devices \(x: cpu, w: meta\)"):
        examples.rms_norm(torch.randn(3, 8), torch.randn(8, device="meta"), EPS)


@dtypes
def test_meta_inputs_give_meta_outputs(examples, dtype):
    x, w = torch.empty(2, 3, 40, dtype=dtype, device="meta"), torch.empty(40, dtype=dtype, device="meta")
    for result in (examples.sigmoid(x), examples.softmax(x), examples.rms_norm(x, w, EPS)):
        assert (result.device.type, result.dtype, result.shape) == ("meta", dtype, x.shape)
    gx, gw_rows = examples.rms_norm_backward(x, w, x, EPS)
    assert (gx.device.type, gx.dtype, gx.shape) == ("meta", dtype, x.shape)
    assert (gw_rows.device.type, gw_rows.dtype, gw_rows.shape) == ("meta", dtype, (6, 40))  # one row per x row
    out = torch.empty_like(x)
    assert examples.sigmoid.out(x, out=out) is None and examples.sigmoid_(x) is None


# --- softmax: a cooperative kernel (barriers, SIMD-group reductions) ------------------------

def _softmax_bound(x: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    # block_softmax_<T> works in T (no float accumulation for half types). exp's argument
    # t = x - max is rounded (relative eps/2 of |t|), which moves exp(t) by |t|*eps/2
    # relatively, and exp itself (a scaled exp2) adds as much again: |t|*eps. The row sum
    # is a tree (per thread, then simd_sum, then across SIMD-groups) of depth ~log2(n):
    # log2(n)*eps. Division, output rounding and exp's own error: 4*eps. All relative to
    # the output; below the normal range, 2 subnormal steps (float16 outputs reach it).
    eps = torch.finfo(x.dtype).eps
    xd = x.double()
    t = (xd - xd.amax(-1, keepdim=True)).abs()
    return (t + math.log2(x.shape[-1]) + 4) * eps * reference + 2 * _subnormal_step(x.dtype)


@dtypes
@pytest.mark.parametrize("n", [1, 7, 31, 32, 100, 1000, 4096])
def test_softmax_matches_torch(examples, dtype, n):
    for rows in (1, 3, 17):
        x = _data((rows, n), dtype, seed=n * 31 + rows, scale=3)  # logits of std 3
        y = examples.softmax(x)
        assert (y.dtype, y.shape) == (dtype, x.shape)
        reference = torch.softmax(x.double(), -1)
        _assert_close(y, reference, _softmax_bound(x, reference), f"softmax {dtype} rows={rows} n={n}")


@dtypes
def test_softmax_over_the_last_dim_of_3d_and_non_contiguous_input(examples, dtype):
    x = _data((4, 5, 200), dtype, seed=4, scale=3)
    y = examples.softmax(x)
    reference = torch.softmax(x.double(), -1)
    _assert_close(y, reference, _softmax_bound(x, reference), "softmax 3-D")
    view = _data((300, 6), dtype, seed=5, scale=3).t()  # rows of 300, strided
    y = examples.softmax(view)
    reference = torch.softmax(view.double(), -1)
    assert y.is_contiguous()
    _assert_close(y, reference, _softmax_bound(view, reference), "softmax of a transposed view")


def test_softmax_of_no_rows_is_empty(examples):
    y = examples.softmax(torch.empty(0, 50))
    assert y.shape == (0, 50) and y.dtype == torch.float32


# --- RMS norm: forward, backward kernel, autograd ------------------------------------------

def _rms_reference(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


def _float_part(n: int) -> float:
    # The rms kernels accumulate in float32 whatever T is: sums of n terms in a tree of
    # depth ~log2(n) (per thread, simd_sum, across SIMD-groups), then a division, +eps,
    # rsqrt and the final products: (4 + log2 n) float32 eps, relative to the terms' size.
    return (4 + math.log2(n)) * E32


def _rms_gradient_scales(x, w, g):
    """float64 magnitudes the gradient errors scale with. gx = r*w*g - x*r^3*mean(g*w*x)
    cancels, and the row sum mean(g*w*x) has rounding errors relative to mean|g*w*x|: so
    gx's error is relative to |r*w*g| + |x|*r^3*mean|g*w*x|, not to |gx|. gw's row
    partials g*x*r do not cancel."""
    r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)
    gx_scale = (r * w * g).abs() + x.abs() * r.pow(3) * (g * w * x).abs().mean(-1, keepdim=True)
    return r, gx_scale, (g * x * r).abs()


@dtypes
@pytest.mark.parametrize("n", [1, 7, 32, 100, 1000, 4096])
def test_rms_norm_forward(examples, dtype, n):
    for rows in (1, 5):
        x, w = _data((rows, n), dtype, seed=n + rows), _data((n,), dtype, seed=n + 100)
        y = examples.rms_norm(x, w, EPS)
        assert (y.dtype, y.shape) == (dtype, x.shape)
        reference = _rms_reference(x.double(), w.double())
        # out = w * T(x * r): two roundings into T (eps/2 each, relative) plus the float32
        # part; outputs below T's normal range get 2 subnormal steps.
        bound = (torch.finfo(dtype).eps + _float_part(n)) * reference.abs() + 2 * _subnormal_step(dtype)
        _assert_close(y, reference, bound, f"rms_norm {dtype} rows={rows} n={n}")


@dtypes
@pytest.mark.parametrize("n", [1, 7, 100, 4096])
def test_rms_norm_backward_op_matches_the_formula(examples, dtype, n):
    rows = 5
    x, w, g = _data((rows, n), dtype, seed=n), _data((n,), dtype, seed=n + 1), _data((rows, n), dtype, seed=n + 2)
    gx, gw_rows = examples.rms_norm_backward(x, w, g, EPS)
    assert (gx.dtype, gx.shape, gw_rows.dtype, gw_rows.shape) == (dtype, x.shape, dtype, (rows, n))
    xd, wd, gd = x.double(), w.double(), g.double()
    r, gx_scale, gw_scale = _rms_gradient_scales(xd, wd, gd)
    # Computed in float32 from T inputs, rounded once into T: eps/2 of T, plus the float32
    # part, relative to the scales above (rounded up to eps of T for margin).
    relative = torch.finfo(dtype).eps + _float_part(n)
    floor = 2 * _subnormal_step(dtype)
    gx_reference = r * wd * gd - xd * r.pow(3) * (gd * wd * xd).mean(-1, keepdim=True)
    _assert_close(gx, gx_reference, relative * gx_scale + floor, f"rms_norm_backward gx {dtype} n={n}")
    _assert_close(gw_rows, gd * xd * r, relative * gw_scale + floor, f"rms_norm_backward gw rows {dtype} n={n}")


@dtypes
@pytest.mark.parametrize("n", [7, 100, 1000])
def test_rms_norm_gradients_match_float64_autograd(examples, dtype, n):
    """Metal has no float64 kernels, so torch.autograd.gradcheck (meaningful only in
    float64) cannot run: the kernel's gradients are compared with float64 autograd
    through the formula, on the same (rounded) inputs."""
    x = _data((2, 3, n), dtype, seed=n + 7).requires_grad_()
    w = _data((n,), dtype, seed=n + 8).requires_grad_()
    v = _data((2, 3, n), dtype, seed=n + 9)  # the upstream gradient, exact in T
    gx, gw = torch.autograd.grad(examples.rms_norm(x, w, EPS), (x, w), v)
    assert (gx.dtype, gx.shape, gw.dtype, gw.shape) == (dtype, x.shape, dtype, w.shape)
    xd, wd = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    rgx, rgw = torch.autograd.grad(_rms_reference(xd, wd), (xd, wd), v.double())
    _, gx_scale, gw_scale = _rms_gradient_scales(xd.detach(), wd.detach(), v.double())
    eps, floor = torch.finfo(dtype).eps, 2 * _subnormal_step(dtype)
    # gx as in the backward-op test. gw sums the 6 rows' partials (each rounded into T)
    # with torch's sum, rounded into T once more: 2*eps of T plus float32 summation of
    # the rows, relative to the sum of the partials' magnitudes.
    _assert_close(gx, rgx, (eps + _float_part(n)) * gx_scale + floor, f"x.grad {dtype} n={n}")
    gw_bound = (2 * eps + _float_part(n) + 6 * E32) * gw_scale.sum((0, 1)) + floor
    _assert_close(gw, rgw, gw_bound, f"w.grad {dtype} n={n}")


def test_rms_norm_gradient_agrees_with_finite_differences_of_the_forward_kernel(examples):
    """float32 spot check that the backward kernel differentiates the forward kernel:
    central differences of the kernel's loss against autograd. No tolerance is guessed:
    |fd - grad| <= |fd - fd64| (the forward kernel's error at x+h and x-h, divided by the
    step) + |fd64 - grad64| (the truncation error of the difference, measured in float64)
    + |grad64 - grad| (the gradient bound of the tests above)."""
    rows, n, h = 3, 64, 2.0 ** -6
    x, w, v = _data((rows, n), seed=11), _data((n,), seed=12), _data((rows, n), seed=13)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    gx, gw = torch.autograd.grad(examples.rms_norm(xr, wr, EPS), (xr, wr), v)
    xd, wd = x.double().requires_grad_(), w.double().requires_grad_()
    gx64, gw64 = torch.autograd.grad(_rms_reference(xd, wd), (xd, wd), v.double())
    _, gx_scale, gw_scale = _rms_gradient_scales(x.double(), w.double(), v.double())
    forward_relative = E32 + _float_part(n)  # the forward bound of test_rms_norm_forward

    def loss(xs, ws):
        """(kernel loss, float64 loss, bound on their difference), summed in float64."""
        y = examples.rms_norm(xs, ws, EPS).double()
        reference = _rms_reference(xs.double(), ws.double())
        vd = v.double()
        bound = (forward_relative * (reference * vd).abs()).sum().item()
        return (y * vd).sum().item(), (reference * vd).sum().item(), bound

    def check(what, plus, minus, step, grad, grad64, grad_bound):
        (lp, lp64, bp), (lm, lm64, bm) = plus, minus
        fd, fd64 = (lp - lm) / step, (lp64 - lm64) / step
        tolerance = (bp + bm) / step + abs(fd64 - grad64) + grad_bound
        assert abs(fd - grad) <= tolerance, f"{what}: finite difference {fd}, gradient {grad}, tolerance {tolerance}"

    for i, j in [(0, 0), (1, 17), (2, 63), (0, 31)]:
        xp, xm = x.clone(), x.clone()
        xp[i, j] += h
        xm[i, j] -= h
        step = (xp[i, j].double() - xm[i, j].double()).item()
        check(f"x[{i}, {j}]", loss(xp, w), loss(xm, w), step, gx[i, j].item(), gx64[i, j].item(),
              (E32 + _float_part(n)) * gx_scale[i, j].item())
        wp, wm = w.clone(), w.clone()
        wp[j] += h
        wm[j] -= h
        step = (wp[j].double() - wm[j].double()).item()
        check(f"w[{j}]", loss(x, wp), loss(x, wm), step, gw[j].item(), gw64[j].item(),
              (2 * E32 + _float_part(n) + rows * E32) * gw_scale[:, j].sum().item())


# --- sigmoid backward (Python, registered with the op) -------------------------------------

@dtypes
def test_sigmoid_backward_matches_torch(examples, dtype):
    x = _data((40, 50), dtype, seed=6, scale=4).requires_grad_()
    g = _data((40, 50), dtype, seed=7)
    (gx,) = torch.autograd.grad(examples.sigmoid(x), x, g)
    assert (gx.dtype, gx.shape) == (dtype, x.shape)
    xd = x.detach().double().requires_grad_()
    (reference,) = torch.autograd.grad(torch.sigmoid(xd), xd, g.double())
    s = torch.sigmoid(xd.detach())
    # backward = g * y * (1 - y) on the kernel's y, whose error is within 4 ulps of s
    # (<= 4*eps*s); y(1-y) moves by at most that (|1 - 2y| <= 1). torch then rounds
    # 1 - y, g*y and the product in T: 3 * eps/2 of |g|*s(1-s), bounded by 2*eps.
    eps = torch.finfo(dtype).eps
    bound = g.double().abs() * eps * (4 * s + 2 * s * (1 - s)) + 2 * _subnormal_step(dtype)
    _assert_close(gx, reference, bound, f"sigmoid backward {dtype}")


# --- in-place: sigmoid_ ---------------------------------------------------------------------

@dtypes
def test_sigmoid_inplace_writes_its_argument(examples, dtype):
    x = _data((9, 13), dtype, seed=8, scale=4)
    expected = examples.sigmoid(x)
    assert examples.sigmoid_(x) is None
    assert torch.equal(x, expected)


VIEWS = {
    "transposed": lambda base: base.t(),
    "every third": lambda base: base.view(-1)[::3],
    "block": lambda base: base[1:4, 2::2],
}


@dtypes
@pytest.mark.parametrize("view", VIEWS)
def test_sigmoid_inplace_on_a_view_updates_only_the_viewed_elements(examples, dtype, view):
    base = _data((6, 10), dtype, seed=9, scale=4)
    original = base.clone()
    target = VIEWS[view](base)
    assert not target.is_contiguous()
    assert examples.sigmoid_(target) is None
    expected = original.clone()
    VIEWS[view](expected).copy_(examples.sigmoid(VIEWS[view](original)))
    assert torch.equal(base, expected)  # the view's elements updated, all others untouched
    reference = torch.sigmoid(VIEWS[view](original).double())
    _assert_close(VIEWS[view](base), reference, _sigmoid_bound(reference, dtype), f"sigmoid_ on {view} view")


# --- out=: sigmoid.out ----------------------------------------------------------------------

@dtypes
def test_sigmoid_out_writes_into_out(examples, dtype):
    x = _data((7, 11), dtype, seed=10, scale=4)
    out = torch.full_like(x, 7.0)
    assert examples.sigmoid.out(x, out=out) is None
    assert torch.equal(out, examples.sigmoid(x))
    strided = torch.full((11, 7), 7.0, dtype=dtype).t()  # a non-contiguous out
    assert examples.sigmoid.out(x, out=strided) is None
    assert torch.equal(strided, out)


@pytest.mark.parametrize("shape, dtype", [((4, 6), torch.float32), ((24,), torch.float32), ((6, 4), torch.float32),
                                          ((4, 5), torch.float16)], ids=["4x6", "24", "6x4", "float16"])
@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_sigmoid_out_of_the_wrong_shape_or_dtype_is_refused(examples, shape, dtype, device):
    x = torch.randn(4, 5, device=device)  # float32: out must be float32 of shape [4, 5]
    out = torch.full(shape, 7.0, dtype=dtype, device=device)
    with pytest.raises(tm.DispatchError) as error:
        examples.sigmoid.out(x, out=out)
    assert str(error.value) == (f"tm_examples::sigmoid.out: argument 'out' is {dtype} of shape {list(shape)}; the "
                                f"kernel writes torch.float32 of shape [4, 5]. Pass a tensor of that shape and dtype")
    if device == "cpu":
        assert torch.equal(out, torch.full(shape, 7.0, dtype=dtype))  # nothing written


# --- function constants from arguments: tm_fixtures::scale -------------------------------

ALPHAS = [1.0, -2.5, 0.1, 3.0, 0.0, 1e-3, 1.0]  # 1.0 again: its specialization is reused


@pytest.fixture(scope="module")
def scale(fixture_ops):
    return torch.ops.tm_fixtures.scale


def test_scale_follows_alpha_and_bias(scale):
    """out = alpha * x + (bias or 0), alpha (a float constant) rounded to float32. The
    kernel computes llvm.fmuladd, which may be fused or not: without bias both are
    round(alpha * x), bit for bit torch's float32 product; with bias each element is the
    fused or the unfused result exactly."""
    x, bias = _data((1000,), seed=14), _data((1000,), seed=15)
    for alpha in ALPHAS:
        a = torch.tensor(alpha, dtype=torch.float32)
        assert torch.equal(scale(x, None, alpha), x * a), alpha
        out = scale(x, bias, alpha)
        unfused = x * a + bias
        # fused: the product of two float32 values is exact in float64; the sum's float64
        # rounding could, once in ~2**29 elements, double-round differently (fixed data here).
        fused = (a.double() * x.double() + bias.double()).float()
        assert bool(((out == fused) | (out == unfused)).all()), alpha
    scale_2d = _data((4, 5), seed=16).t()
    assert torch.equal(scale(scale_2d, None, 2.0), scale_2d * 2.0)


def test_scale_compiles_one_specialization_per_constant_value(scale, monkeypatch):
    compiled = []
    original = ops_define.compile_kernel

    def counting(function, constants, *args, **kwargs):
        compiled.append(constants)
        return original(function, constants, *args, **kwargs)

    monkeypatch.setattr(ops_define, "compile_kernel", counting)
    x = _data((64,), seed=17)
    # Values no other test uses, so this process compiles them here first (the operator
    # and its specializations live for the whole session).
    alphas = [0.7109375, -3.140625]
    for alpha in alphas + alphas:  # the second round reuses both specializations
        assert torch.equal(scale(x, None, alpha), x * torch.tensor(alpha)), alpha
    # constant 0 is use_bias (no bias: 0), constant 1 is alpha
    assert [dict(c) for c in compiled] == [{0: 0, 1: alpha} for alpha in alphas]
    scale(x, x, alphas[0])  # with a bias: a new specialization (use_bias = 1)
    assert len(compiled) == 3 and dict(compiled[2]) == {0: 1, 1: alphas[0]}


# --- torch.compile -------------------------------------------------------------------------

@pytest.mark.usefixtures("fresh_dynamo")
def test_compiled_softmax_equals_eager(examples):
    def softmax(t):
        return examples.softmax(t)

    compiled = torch.compile(softmax, fullgraph=True)
    for shape, dtype in [((5, 100), torch.float32), ((3, 7, 31), torch.float32), ((4, 4096), torch.bfloat16)]:
        x = _data(shape, dtype, seed=18, scale=3)
        assert torch.equal(compiled(x), softmax(x)), (shape, dtype)  # the same kernel runs
    explained = torch._dynamo.explain(softmax)(_data((5, 100), seed=19))
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


@pytest.mark.usefixtures("fresh_dynamo")
def test_compiled_rms_norm_equals_eager_with_gradients(examples):
    def rms_norm(t, w):
        return examples.rms_norm(t, w, EPS)

    compiled = torch.compile(rms_norm, fullgraph=True)
    x, w, v = _data((4, 64), seed=20), _data((64,), seed=21), _data((4, 64), seed=22)
    assert torch.equal(compiled(x, w), rms_norm(x, w))
    xe, we = x.clone().requires_grad_(), w.clone().requires_grad_()
    xc, wc = x.clone().requires_grad_(), w.clone().requires_grad_()
    eager = torch.autograd.grad(rms_norm(xe, we), (xe, we), v)
    traced = torch.autograd.grad(compiled(xc, wc), (xc, wc), v)
    assert all(torch.equal(a, b) for a, b in zip(eager, traced))
    explained = torch._dynamo.explain(rms_norm)(x, w)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


# --- preconditions -----------------------------------------------------------------------

_SDPA_CHILD = """
import json, sys, torch, torch_metallib as tm
from _ops_examples import define_sdpa_vector
sdpa = define_sdpa_vector(tm.load(sys.argv[1]), "tm_sdpa::sdpa")
g = torch.Generator().manual_seed(0)
result = {}
for d in (64, 32):
    q, k, v = torch.randn(2, 4, 1, d, generator=g), torch.randn(2, 2, 77, d, generator=g), torch.randn(2, 2, 77, d, generator=g)
    for device in ("meta", "cpu"):
        try:
            out = sdpa(q.to(device), k.to(device), v.to(device), d ** -0.5)
        except tm.KernelArgumentError as error:
            result[f"{device} {d}"] = "KernelArgumentError: " + str(error)
            continue
        if device == "cpu":
            kv = [t.double().repeat_interleave(2, 1) for t in (k, v)]
            reference = torch.nn.functional.scaled_dot_product_attention(q.double(), *kv, scale=d ** -0.5)
            result[f"{device} {d}"] = [list(out.shape), (out.double() - reference).abs().max().item()]
        else:
            result[f"{device} {d}"] = [list(out.shape)]
print(json.dumps(result))
"""


def test_sdpa_with_the_wrong_head_dimension_is_refused_by_its_precondition(mlx_path):
    """sdpa_vector_float_64_64 reads and writes 64 elements per head: called with head
    dimension 32 it would read past q, k and v and write past its output (the heap is
    corrupted: glibc aborts). The operator's require=[size(q, -1) == 64, ...] refuses the
    call before the kernel runs, eager and on meta tensors; head dimension 64 runs and
    matches float64 attention. In a child process, so that a missing check cannot take the
    test session down."""
    child = subprocess.run([sys.executable, "-c", _SDPA_CHILD, mlx_path], capture_output=True, text=True,
                           cwd=os.path.dirname(__file__), timeout=300)
    assert child.returncode == 0, f"the child exited with {child.returncode}: {child.stderr[-3000:]}"
    result = json.loads(child.stdout.strip().splitlines()[-1])
    refusal = ("KernelArgumentError: tm_sdpa::sdpa: a precondition does not hold; expected size(q, -1) == 64, "
               "got 32. Pass arguments that meet it: the operator's kernels are built for those "
               "(define(..., require=[...]))")
    assert result["meta 32"] == refusal and result["cpu 32"] == refusal
    assert result["meta 64"] == [[2, 4, 1, 64]]
    shape, error = result["cpu 64"]
    assert shape == [2, 4, 1, 64] and error < 1e-5  # float32 arithmetic over 77 keys; measured 2.1e-7

"""Apple-built MLX scans (scan.h: contiguous_scan / strided_scan) and the softmax / layer-norm /
rms-norm kernels that test_cpu_cooperative.py leaves out, run on the CPU against torch.

Host conventions follow mlx/backend/metal/scan.cpp, softmax.cpp and normalization.cpp:

* contig_scan_*: buffers (in, out, axis_size: ulong); grid (group, lines_y, lines_z) with group
  (group, 1, 1); line = gid.y + gsize.y * gid.z.  N_READS is 4 for types of up to 4 bytes, else 2.
  Any multiple of 32 up to 1024 works as the group; a small one makes each line take several
  passes, so the prefix carried from pass to pass is exercised.
* strided_scan_*: (in, out, axis_size, stride, stride_blocks: ulong), stride_blocks =
  ceil(stride / 32); the group is exactly (32 / N_READS) SIMD-groups; threadgroup g scans the
  32 columns g % stride_blocks of matrix g / stride_blocks, g = gid.y + gsize.y * gid.z.
* Exclusive scans start with the operation's identity (0, 1, Limits<T>::min for max,
  Limits<T>::max for min: -inf / +inf for floats, the type's extremes for integers).

Every output buffer is allocated with a tail of sentinel bytes (and prefilled with them, so an
element the kernel forgot to write cannot match the reference); the tail must stay untouched.
"""

import pytest
import torch

from _mlx_scans import (ALL_VARIANTS, CONTIG_SHAPE, FULL_CASES, OTHER_CASES, SCAN_TYPES, SENTINEL, SOME_VARIANTS,
                        STRIDED_SHAPE, _assert_equal, _assert_tail, _case_id, _generator, _n_reads, _output, _run_scan,
                        _scan_data, _scan_name, _scan_reference, _seed, check_scan_exact)

# Unit roundoff u (half the spacing of floats at 1) of each float type the kernels store in.
UNIT_ROUNDOFF = {torch.float32: 2.0 ** -24, torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}


# --- scans -----------------------------------------------------------------------------------

COMPLEX_CASES = [(op, "complex64", *v) for op in ("sum", "prod") for v in SOME_VARIANTS]


@pytest.mark.parametrize("case", FULL_CASES + OTHER_CASES + COMPLEX_CASES, ids=_case_id)
def test_scan_exact(mlx_lib, case):
    check_scan_exact(mlx_lib, case)


@pytest.mark.parametrize("type_name", ["float32", "int32", "int64"])
def test_contig_scan_with_mlx_host_grid(mlx_lib, type_name):
    """A long axis with the threadgroup size scan.cpp picks: for N_READS * 1024 < size <=
    N_READS * 2048 it is ceil(size / 2 / (N_READS * 32)) * 32 threads."""
    n_reads = _n_reads(type_name)
    size = n_reads * 1024 + 905
    elements_per_simd = n_reads * 32
    group = min(1024, (size // 2 + elements_per_simd - 1) // elements_per_simd * 32)
    x = _scan_data("sum", type_name, (1, 2, size), _generator(5))
    expected = _scan_reference(x, "sum", type_name, True, False, 2)
    out, raw = _output(x.shape, x.dtype)
    mlx_lib[_scan_name("contig", True, False, "sum", type_name)](
        x, out, size, threads=(group, 2, 1), group_size=(group, 1, 1))
    _assert_tail(raw)
    _assert_equal(out, expected, "cumsum")


@pytest.mark.parametrize("layout,inclusive,reverse", ALL_VARIANTS)
def test_scan_sum_float32_rounding(mlx_lib, layout, inclusive, reverse):
    """float32 cumsum of random data. Summing k terms along any binary tree (the scan is
    one) is within gamma_(k-1) * sum(|x_i|) of the exact sum, gamma_m = m u / (1 - m u),
    u = 2**-24; k * u * sum(|x_i|) is above that for these k. The sums of |x_i| and the term
    counts are torch cumsums in the scan's direction."""
    shape = CONTIG_SHAPE if layout == "contig" else STRIDED_SHAPE
    dim = 2 if layout == "contig" else 1
    x = torch.randn(shape, generator=_generator(11))
    expected = _scan_reference(x, "sum", "float32", inclusive, reverse, dim).double()
    magnitude = _scan_reference(x.abs(), "sum", "float32", inclusive, reverse, dim).double()
    terms = _scan_reference(torch.ones_like(x), "sum", "float32", inclusive, reverse, dim).double()
    name = _scan_name(layout, inclusive, reverse, "sum", "float32")
    out = _run_scan(mlx_lib, name, x, torch.float32, layout, 4)
    bound = terms.clamp(min=1) * UNIT_ROUNDOFF[torch.float32] * magnitude
    assert bool(((out.double() - expected).abs() <= bound).all())


# logaddexp scans (float types only) combine in the storage type, each combine rounding its
# result once (u of the type, relative to the running value). The scan is a tree: each
# output sits at the end of a short chain of combines (N_READS in-thread steps, 5 SIMD shuffle
# steps, 5 across SIMD-groups, one per pass for the carried prefix) and an error carries
# forward with weight <= 1 (d logaddexp(a, b) / da < 1). Observed <= 3.2u * max(|result|, 1)
# for all three types over 300-long lines; 8u is the bound, far below the effect of a lost or
# doubled element for float32.
LOGADDEXP_SHAPES = {"contig": (2, 3, 300), "strided": (2, 300, 37)}
LOGADDEXP_GROUP = 32  # -> 3 passes per contiguous line


@pytest.mark.parametrize("type_name", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("layout,inclusive,reverse", ALL_VARIANTS)
def test_scan_logaddexp(mlx_lib, type_name, layout, inclusive, reverse):
    dtype = SCAN_TYPES[type_name][0]
    shape = LOGADDEXP_SHAPES[layout]
    dim = 2 if layout == "contig" else 1
    x = (torch.randn(shape, generator=_generator(_seed("lae", type_name, layout))) * 2).to(dtype)
    expected = _scan_reference(x, "logaddexp", type_name, inclusive, reverse, dim).double()
    name = _scan_name(layout, inclusive, reverse, "logaddexp", type_name)
    out, raw = _output(shape, dtype)
    if layout == "contig":
        mlx_lib[name](x, out, shape[2], threads=(LOGADDEXP_GROUP, shape[1], shape[0]),
                      group_size=(LOGADDEXP_GROUP, 1, 1))
    else:
        blocks = (shape[2] + 31) // 32
        mlx_lib[name](x, out, shape[1], shape[2], blocks, threads=(256, blocks, shape[0]), group_size=(256, 1, 1))
    _assert_tail(raw)
    got = out.double()
    finite = torch.isfinite(expected)
    assert int((~finite).sum()) == (0 if inclusive else x.numel() // shape[dim])
    assert torch.equal(got[~finite], expected[~finite])  # exclusive scans start at -inf
    bound = 8 * UNIT_ROUNDOFF[dtype] * expected[finite].abs().clamp(min=1)
    assert bool(((got[finite] - expected[finite]).abs() <= bound).all())


# --- softmax (precise), layer norm, rms norm ---------------------------------------------------
#
# These kernels read T, compute in float32 and round each output to T once. Elementwise bound:
#   |out - ref| <= 2 * u_T * |ref| + 16 * u_32 * (row scale) + floor_T
# 2 u_T covers the final rounding (u_T: 2**-11 half, 2**-8 bfloat16, 2**-24 float32); the
# float32 statistics (sums of 10**3 terms through a SIMD tree, a few roundings on each path)
# are good to a few u_32 of the row's largest |ref| (observed <= 2.9 u_32), hence 16 u_32;
# floor_T is half the spacing of half's subnormals (2**-25), where relative bounds stop working.
# The reference is torch in float64 on the very same T inputs.
FLOAT_TYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
EPS = 1e-5


def _assert_close(out, expected, row_scale, what):
    dtype = out.dtype
    floor = 2.0 ** -25 if dtype == torch.float16 else 0.0
    bound = 2 * UNIT_ROUNDOFF[dtype] * expected.abs() + 16 * UNIT_ROUNDOFF[torch.float32] * row_scale + floor
    error = (out.double() - expected).abs()
    excess = error - bound
    assert bool((excess <= 0).all()), (
        f"{what}: {int((excess > 0).sum())} elements out of bound; worst error {error.max().item():.3g}")


def _row_scale(t):
    return t.abs().amax(-1, keepdim=True)


def _ceil_div(a, b):
    return -(-a // b)


def _norm_group(axis, n_reads):
    """normalization.cpp / softmax.cpp for the single-row kernels: whole SIMD-groups covering
    ceil(axis / n_reads) threads."""
    return 32 * _ceil_div(_ceil_div(axis, n_reads), 32)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("variant", ["block", "looped"])
def test_softmax_precise(mlx_lib, variant, dtype):
    """softmax(precise=True) for half types: float32 exp / sum, one rounding to T."""
    rows, axis = (4, 1000) if variant == "block" else (3, 5000)
    group = _norm_group(axis, 4) if variant == "block" else 128
    x = (torch.randn(rows, axis, generator=_generator(21)) * 3).to(FLOAT_TYPES[dtype])
    out, raw = _output(x.shape, x.dtype)
    mlx_lib[f"{variant}_softmax_precise_{dtype}"](x, out, axis, threads=rows * group, group_size=group)
    _assert_tail(raw)
    expected = torch.softmax(x.double(), -1)
    _assert_close(out, expected, _row_scale(expected), f"{variant}_softmax_precise_{dtype}")


def _layer_norm_reference(x, w, b):
    xd = x.double()
    xhat = (xd - xd.mean(-1, keepdim=True)) / torch.sqrt(xd.var(-1, unbiased=False, keepdim=True) + EPS)
    expected = torch.nn.functional.layer_norm(xd, (x.shape[-1],), w.double(), b.double(), EPS)
    return expected, xhat


# layer_norm{T} and vjp_layer_norm{T} (single row, 8 elements a thread): axis 1020 with the
# host's 128 threads, so the last thread has a short tail (4 of its 8) and no thread is idle.
# With idle threads (lid * 8 > axis_size, which MLX's grid gives for most sizes) both kernels
# store thread_x[i] for i from axis_size - lid * 8 < 0 up to 7, outside their private array;
# see test_layer_norm_with_idle_threads.
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("looped", [False, True])
def test_layer_norm_half_types(mlx_lib, looped, dtype):
    """out = fma(w, T(xhat), b) in T: at most three roundings to T (xhat, product, sum), so
    |out - ref| <= 3 u_T (|w xhat| + |b|) plus the float32 error of xhat (16 u_32 |w xhat|)
    and half's subnormal floor. w_stride 1 / b_stride 0 (a broadcast bias) for the looped run."""
    rows, axis = (5, 1020) if not looped else (4, 2501)
    group = _norm_group(axis, 8) if not looped else 128
    t = FLOAT_TYPES[dtype]
    g = _generator(31)
    x = (torch.randn(rows, axis, generator=g) * 0.1 + 0.5).to(t)  # var 0.01: eps matters to ~u_half
    w = torch.randn(axis, generator=g).to(t)
    b = torch.randn(axis, generator=g).to(t)
    b_stride = 1
    if looped:
        b, b_stride = b[:1].clone(), 0
    out, raw = _output(x.shape, t)
    name = ("layer_norm_looped" if looped else "layer_norm") + dtype
    mlx_lib[name](x, w, b, out, EPS, axis, 1, b_stride, threads=rows * group, group_size=group)
    _assert_tail(raw)
    expected, xhat = _layer_norm_reference(x, w, b.expand(axis))
    wx = (w.double() * xhat).abs()
    floor = 3 * 2.0 ** -25 if t == torch.float16 else 0.0
    bound = 3 * UNIT_ROUNDOFF[t] * (wx + b.double().abs()) + 16 * UNIT_ROUNDOFF[torch.float32] * wx + floor
    assert bool(((out.double() - expected).abs() <= bound).all())


_IDLE_THREADS_SCRIPT = """
import sys
import torch
import torch_metallib as tm
lib = tm.load(sys.argv[1])
dtype, u = {"float32": (torch.float32, 2.0 ** -24), "float16": (torch.float16, 2.0 ** -11),
            "bfloat16": (torch.bfloat16, 2.0 ** -8)}[sys.argv[2]]
for pair in sys.argv[3:]:  # axis:group, MLX's grid
    axis, group = map(int, pair.split(":"))
    x = torch.randn(3, axis, generator=torch.Generator().manual_seed(axis)).to(dtype)
    w, b = torch.ones(axis, dtype=dtype), torch.zeros(axis, dtype=dtype)
    out = torch.empty_like(x)
    lib["layer_norm" + sys.argv[2]](x, w, b, out, 1e-5, axis, 1, 1, threads=3 * group, group_size=group)
    expected = torch.nn.functional.layer_norm(x.double(), (axis,), eps=1e-5)
    error = (out.double() - expected).abs().max().item()
    assert bool(((out.double() - expected).abs() <= 4 * u * expected.abs() + 2.0 ** -23).all()), (axis, error)
print("ok")
"""


@pytest.mark.parametrize("dtype", FLOAT_TYPES)
def test_layer_norm_with_idle_threads(mlx_path, dtype):
    """MLX's own grid for axes 1000, 777 and 33 (2, 30 and 27 idle threads, which store up to
    239 elements below their private array; the CPU backend clamps such indices to a spare
    element). In a child process: the failure this guards against is a segmentation fault
    from a corrupted frame, which would take the whole test session down. Tolerance: the float32
    statistics and one rounding to T, 4 u_T relative, plus float32's absolute floor."""
    import subprocess
    import sys
    grids = [f"{axis}:{_norm_group(axis, 8)}" for axis in (1000, 777, 33)]
    result = subprocess.run([sys.executable, "-c", _IDLE_THREADS_SCRIPT, mlx_path, dtype, *grids],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip() == "ok", (
        f"exit status {result.returncode}: {result.stderr[-500:]}")


def _vjp_inputs(dtype, rows, axis, seed):
    t = FLOAT_TYPES[dtype]
    g = _generator(seed)
    x = (torch.randn(rows, axis, generator=g) * 2 + 0.5).to(t)
    w = torch.randn(axis, generator=g).to(t)
    cotangent = torch.randn(rows, axis, generator=g).to(t)
    return x, w, cotangent


@pytest.mark.parametrize("dtype", FLOAT_TYPES)
@pytest.mark.parametrize("looped, idle", [(False, False), (False, True), (True, False)])
@pytest.mark.parametrize("has_w", [True, False])
def test_vjp_layer_norm(mlx_lib, looped, idle, dtype, has_w):
    """vjp_layer_norm{_looped}{T} (x, w, g, gx, gw, eps, axis_size, w_stride), function constant
    has_w (20). gx is d(layer_norm(x) * w)/dx applied to g; gw holds one row per input row,
    g * xhat, which the host then sums over rows (and only when has_w; without w the kernel
    reads w[0] = 1 with w_stride 0 and must leave gw alone). Checked against torch autograd."""
    # 1020: no idle thread, as for layer_norm; 1000: two idle threads store below thread_x
    rows, axis = (5, 1000 if idle else 1020) if not looped else (3, 2501)
    group = _norm_group(axis, 8) if not looped else 128
    x, w, cotangent = _vjp_inputs(dtype, rows, axis, 41)
    w_stride = 1
    if not has_w:
        w, w_stride = torch.ones(1, dtype=x.dtype), 0
    gx, gx_raw = _output(x.shape, x.dtype)
    gw, gw_raw = _output(x.shape, x.dtype)
    name = ("vjp_layer_norm_looped" if looped else "vjp_layer_norm") + dtype
    mlx_lib[name](x, w, cotangent, gx, gw, EPS, axis, w_stride, threads=rows * group, group_size=group,
                  constants={"has_w": has_w})
    _assert_tail(gx_raw)
    _assert_tail(gw_raw)

    xd = x.double().requires_grad_()
    wd = w.double().expand(axis).clone().requires_grad_()
    torch.nn.functional.layer_norm(xd, (axis,), wd, None, EPS).backward(cotangent.double())
    _assert_close(gx, xd.grad, _row_scale(xd.grad), name + " gx")
    if has_w:
        _, xhat = _layer_norm_reference(x, w, w)
        per_row = cotangent.double() * xhat
        _assert_close(gw, per_row, _row_scale(per_row), name + " gw")
        assert torch.allclose(per_row.sum(0), wd.grad)  # the per-row terms are autograd's gw
    else:
        assert bool((gw_raw == SENTINEL).all()), "gw written without has_w"


def _rms_reference(x, w, cotangent):
    xd = x.double().requires_grad_()
    wd = w.double().expand(x.shape[-1]).clone().requires_grad_()
    inv = torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + EPS)
    (xd * inv * wd).backward(cotangent.double())
    per_row = cotangent.double() * x.double() * inv.detach()
    assert torch.allclose(per_row.sum(0), wd.grad)
    return xd.grad, per_row


@pytest.mark.parametrize("dtype", FLOAT_TYPES)
@pytest.mark.parametrize("has_w", [True, False])
def test_vjp_rms(mlx_lib, dtype, has_w):
    """vjp_rms{T} in this corpus takes two more arguments than the stored MLX sources show:
    (x, w, g, gx, gw, eps, axis_size, w_stride, n_rows, rows_per_group). From its AIR:
    threadgroup k handles rows [k * rows_per_group, min((k + 1) * rows_per_group, n_rows)),
    writes gx for each and one float32-accumulated partial gw row, sum over its rows of
    g * x * rsqrt(mean(x**2) + eps), at gw + k * axis_size (only when has_w)."""
    rows, axis, rows_per_group = 7, 1000, 3  # 3 groups, the last one short
    groups = _ceil_div(rows, rows_per_group)
    group = _norm_group(axis, 4)
    x, w, cotangent = _vjp_inputs(dtype, rows, axis, 51)
    w_stride = 1
    if not has_w:
        w, w_stride = torch.ones(1, dtype=x.dtype), 0
    gx, gx_raw = _output(x.shape, x.dtype)
    gw, gw_raw = _output((groups, axis), x.dtype)
    mlx_lib[f"vjp_rms{dtype}"](x, w, cotangent, gx, gw, EPS, axis, w_stride, rows, rows_per_group,
                               threads=groups * group, group_size=group, constants={"has_w": has_w})
    _assert_tail(gx_raw)
    _assert_tail(gw_raw)
    expected_gx, per_row = _rms_reference(x, w, cotangent)
    _assert_close(gx, expected_gx, _row_scale(expected_gx), f"vjp_rms{dtype} gx")
    if has_w:
        partial = torch.stack([per_row[k * rows_per_group:(k + 1) * rows_per_group].sum(0) for k in range(groups)])
        _assert_close(gw, partial, _row_scale(partial), f"vjp_rms{dtype} gw")
    else:
        assert bool((gw_raw == SENTINEL).all()), "gw written without has_w"


@pytest.mark.parametrize("dtype", FLOAT_TYPES)
def test_vjp_rms_looped(mlx_lib, dtype):
    """vjp_rms_looped{T} keeps the older convention: (x, w, g, gx, gw, eps, axis_size,
    w_stride), one threadgroup per row, gw one row per input row (g * x * rsqrt(...))."""
    rows, axis, group = 3, 2501, 128
    x, w, cotangent = _vjp_inputs(dtype, rows, axis, 61)
    gx, gx_raw = _output(x.shape, x.dtype)
    gw, gw_raw = _output(x.shape, x.dtype)
    mlx_lib[f"vjp_rms_looped{dtype}"](x, w, cotangent, gx, gw, EPS, axis, 1, threads=rows * group,
                                      group_size=group, constants={"has_w": True})
    _assert_tail(gx_raw)
    _assert_tail(gw_raw)
    expected_gx, per_row = _rms_reference(x, w, cotangent)
    _assert_close(gx, expected_gx, _row_scale(expected_gx), f"vjp_rms_looped{dtype} gx")
    _assert_close(gw, per_row, _row_scale(per_row), f"vjp_rms_looped{dtype} gw")

"""Every variant of AIR's per-lane and SIMD-group intrinsics, exact: small kernels
written on the fly (tests/_air_modules.py) call one intrinsic per thread; results are
compared with float64 references rounded to the result type, on dense samples plus the
edges (±0, denormals, ±inf, NaN, domain edges, large arguments, integer extremes).

The defects this pins: tanh/sqrt/rsqrt/asin/acos on half2 gave NaN for finite inputs and
sqrt on float2 was wrong (vector forms now apply the scalar definition per lane, so they
are bit-identical to it), and intrinsics that were missing (fract, sinpi/cospi/tanpi,
nextafter, fmin3/fmax3/fmedian3, popcount/clz/ctz, all/any on vectors, cmpxchg.weak,
64-bit atomics min/max, simd_vote on 64-bit ballots, 64-bit SIMD-group reductions).
"""

import math

import numpy as np
import pytest
import torch

import _air_modules as air

DTYPES = {"f32": (torch.float32, "float"), "f16": (torch.float16, "half"), "bf16": (torch.bfloat16, "bfloat")}
TINY = {"f32": 1e-40, "f16": 3e-7, "bf16": 1e-40}  # a denormal of each type


def _edges(code: str):
    return [0.0, -0.0, TINY[code], -TINY[code], 1.0, -1.0, 0.5, -0.5, 2.0, math.inf, -math.inf, math.nan,
            1e4, -1e4, 3.0, 0.1, 65504.0 if code == "f16" else 3e38]


def _sample(code: str, low: float, high: float, count: int = 2000):
    dtype = DTYPES[code][0]
    g = torch.Generator().manual_seed(hash((code, low, high)) % 2**31)
    dense = torch.rand(count, generator=g, dtype=torch.float64) * (high - low) + low
    return torch.cat([dense, torch.tensor(_edges(code), dtype=torch.float64)]).to(dtype)


def _ulps(got: torch.Tensor, want: torch.Tensor) -> float:
    """Largest difference in units of the last place of the result type, NaN and infinity
    required to match exactly."""
    got64, want64 = got.double(), want.double()
    assert torch.equal(torch.isnan(got64), torch.isnan(want64)), (got64[torch.isnan(got64) != torch.isnan(want64)],
                                                                  want64[torch.isnan(got64) != torch.isnan(want64)])
    finite = torch.isfinite(want64)
    assert torch.equal(got64[~finite & ~torch.isnan(want64)], want64[~finite & ~torch.isnan(want64)])
    if not finite.any():
        return 0.0
    info = torch.finfo(got.dtype)
    spacing = torch.maximum(want64[finite].abs(), torch.tensor(info.tiny, dtype=torch.float64)) * info.eps
    return float(((got64[finite] - want64[finite]).abs() / spacing).max())


def _run(intrinsic: str, ret: str, params, inputs, out_dtype, lanes: int = 1):
    """One result per input element: `lanes` of them per thread."""
    kernel = air.lane_kernel(intrinsic, ret, params)
    out = torch.empty(inputs[0].numel(), dtype=out_dtype)
    kernel(*inputs, out, threads=out.numel() // lanes)
    return out


# name -> (float64 reference, input range, ulp bound for float)
UNARY = {
    "sqrt": (torch.sqrt, (0, 100), 0), "rsqrt": (torch.rsqrt, (0, 100), 1), "tanh": (torch.tanh, (-10, 10), 1),
    "asin": (torch.asin, (-1, 1), 1), "acos": (torch.acos, (-1, 1), 1), "exp": (torch.exp, (-20, 20), 1),
    "log": (torch.log, (0, 100), 1), "sin": (torch.sin, (-10, 10), 1), "cos": (torch.cos, (-10, 10), 1),
    "atan": (torch.atan, (-10, 10), 1), "sinh": (torch.sinh, (-8, 8), 1), "cosh": (torch.cosh, (-8, 8), 1),
    "fabs": (torch.abs, (-10, 10), 0), "floor": (torch.floor, (-10, 10), 0), "ceil": (torch.ceil, (-10, 10), 0),
    "trunc": (torch.trunc, (-10, 10), 0), "rint": (torch.round, (-10, 10), 0),
    "log1p": (torch.log1p, (-0.9, 10), 1), "expm1": (torch.expm1, (-5, 5), 1), "exp2": (torch.exp2, (-20, 20), 1),
    "log2": (torch.log2, (0, 100), 1),
    "fract": (lambda x: torch.where(torch.isinf(x), torch.copysign(torch.zeros_like(x), x),
                                    torch.clamp(x - torch.floor(x), max=float.fromhex("0x1.fffffep-1"))), (-10, 10), 0),
    "sinpi": (lambda x: _sinpi(x), (-1e3, 1e3), 1),
    "cospi": (lambda x: _sinpi(0.5 - (x - 2 * torch.round(x / 2)).abs()), (-1e3, 1e3), 1),
}


def _sinpi(x: torch.Tensor) -> torch.Tensor:
    """sin(pi x) in float64 with the period taken off exactly first (x - 2 round(x/2) is
    exact for float inputs), using sin(pi r) = sin(pi (±1 - r)) to stay near zero, where
    sin is accurate in relative terms; ±0 at integers, NaN at ±inf."""
    r = x - 2 * torch.round(x / 2)
    r = torch.where(r.abs() > 0.5, torch.sign(r) - r, r)
    value = torch.sin(math.pi * r)
    return torch.where(r == 0, torch.copysign(torch.zeros_like(x), x), value)


@pytest.mark.parametrize("code", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("op", list(UNARY))
def test_unary_math_scalar_and_vector_forms(op, code):
    reference, (low, high), ulps = UNARY[op]
    dtype, element = DTYPES[code]
    x = _sample(code, low, high)
    x = x[: x.numel() // 12 * 12]  # whole vectors of 2, 3 and 4
    want = reference(x.double()).to(dtype)
    scalar = _run(f"air.{op}.{code}", element, [element], [x], dtype)
    # Half and bfloat are computed in float and rounded once: within one ulp of the type.
    assert _ulps(scalar, want) <= (ulps if code == "f32" else 1), op
    for lanes in (2, 3, 4):
        vector_type = f"<{lanes} x {element}>"
        vector = _run(f"air.{op}.v{lanes}{code}", vector_type, [vector_type], [x], dtype, lanes)
        # One definition: each lane of a vector form is the scalar form, bit for bit.
        assert torch.equal(vector.view(torch.int16 if code != "f32" else torch.int32),
                           scalar.view(torch.int16 if code != "f32" else torch.int32)), (op, lanes)


@pytest.mark.parametrize("code", ["f32", "f16"])
def test_nextafter_steps_one_representable_value(code):
    dtype, element = DTYPES[code]
    np_dtype = np.float32 if code == "f32" else np.float16
    base = _sample(code, -10, 10, 500)
    x = torch.cat([base, base, base])
    y = torch.cat([torch.full_like(base, math.inf), torch.full_like(base, -math.inf), base.flip(0)])
    out = _run(f"air.nextafter.{code}", element, [element, element], [x, y], dtype)
    want = torch.from_numpy(np.nextafter(x.numpy().astype(np_dtype), y.numpy().astype(np_dtype)))
    assert torch.equal(torch.isnan(out), torch.isnan(want))
    keep = ~torch.isnan(want)
    bits = torch.int32 if code == "f32" else torch.int16
    assert torch.equal(out[keep].view(bits), want[keep].view(bits))


@pytest.mark.parametrize("op", ["fmin3", "fmax3", "fmedian3"])
@pytest.mark.parametrize("code", ["f32", "f16"])
def test_three_way_min_max_median(op, code):
    dtype, element = DTYPES[code]
    g = torch.Generator().manual_seed(3)
    a, b, c = (torch.randn(300, generator=g).to(dtype) for _ in range(3))
    a[:10] = math.nan  # Metal's fmin/fmax: a NaN operand yields the other
    out = _run(f"air.{op}.{code}", element, [element] * 3, [a, b, c], dtype)
    stacked = torch.stack([a, b, c]).double()
    filled = {"fmin3": torch.where(stacked.isnan(), math.inf, stacked).min(0).values,
              "fmax3": torch.where(stacked.isnan(), -math.inf, stacked).max(0).values}
    if op == "fmedian3":
        filled[op] = stacked[:, 10:].median(0).values
        out, = (out[10:],)
    assert torch.equal(out.double(), filled[op].to(dtype).double())


@pytest.mark.parametrize("bits", [8, 16, 32, 64])
@pytest.mark.parametrize("op", ["popcount", "clz", "ctz"])
def test_bit_counts(op, bits):
    dtype = {8: torch.int8, 16: torch.int16, 32: torch.int32, 64: torch.int64}[bits]
    values = [0, 1, -1, 2, 3, 1 << (bits - 1), (1 << (bits - 1)) - 1, 12345 % (1 << (bits - 1)), -5]
    x = torch.tensor([v if v < (1 << (bits - 1)) else v - (1 << bits) for v in values] * 4, dtype=dtype)

    def expected(v):
        u = v & ((1 << bits) - 1)
        if op == "popcount":
            return bin(u).count("1")
        if op == "clz":
            return bits - u.bit_length()
        return bits if u == 0 else (u & -u).bit_length() - 1

    want = torch.tensor([expected(int(v)) for v in x], dtype=dtype)
    t = f"i{bits}"
    extra = [] if op == "popcount" else ["i1"]
    kernel = air.lane_kernel(f"air.{op}.{t}", t, [t] + extra, constants=["false"] if extra else [])
    out = torch.empty_like(x)
    kernel(x, out, threads=x.numel())
    assert torch.equal(out, want)
    vector = f"<4 x {t}>"
    kernel = air.lane_kernel(f"air.{op}.v4{t}", vector, [vector] + extra, constants=["false"] if extra else [])
    out4 = torch.empty_like(x)
    kernel(x, out4, threads=x.numel() // 4)
    assert torch.equal(out4, want)


@pytest.mark.parametrize("lanes", [2, 3, 4])
@pytest.mark.parametrize("op", ["all", "any"])
def test_all_any_on_bool_vectors(op, lanes):
    patterns = torch.tensor([[(i >> j) & 1 for j in range(lanes)] for i in range(1 << lanes)], dtype=torch.bool)
    kernel = air.lane_kernel(f"air.{op}.v{lanes}i1", "i1", [f"<{lanes} x i1>"])
    out = torch.empty(patterns.shape[0], dtype=torch.bool)
    kernel(patterns.reshape(-1), out, threads=patterns.shape[0])
    assert torch.equal(out, patterns.all(1) if op == "all" else patterns.any(1))


# --- 64-bit SIMD-group functions ---------------------------------------------------------

def _simd_groups(values: torch.Tensor):
    return values.view(-1, 32)


@pytest.mark.parametrize("sign", ["s", "u"])
@pytest.mark.parametrize("op", ["sum", "max", "min", "prefix_inclusive_sum", "prefix_exclusive_sum", "and", "xor"])
def test_simd_functions_on_64_bit_integers_are_exact(op, sign):
    g = torch.Generator().manual_seed(11)
    x = torch.randint(-2**62, 2**62, (128,), generator=g, dtype=torch.int64)
    x[:4] = torch.tensor([2**63 - 1, -2**63, -1, 0])
    kernel = air.simd_kernel(f"air.simd_{op}.{sign}.i64", "i64", ["i64"], unsigned=sign == "u")
    out = torch.empty_like(x)
    kernel(x, out, threads=128, group_size=64)
    groups = [[int(v) for v in row] for row in _simd_groups(x)]
    mask = (1 << 64) - 1

    def wrap(v):
        v &= mask
        return v - (1 << 64) if v >= 1 << 63 else v

    want = []
    for row in groups:
        key = (lambda v: v & mask) if sign == "u" else (lambda v: v)
        if op == "sum":
            want += [wrap(sum(row))] * 32
        elif op == "max":
            want += [max(row, key=key)] * 32
        elif op == "min":
            want += [min(row, key=key)] * 32
        elif op == "and":
            acc = -1
            for v in row:
                acc &= v
            want += [wrap(acc)] * 32
        elif op == "xor":
            acc = 0
            for v in row:
                acc ^= v
            want += [wrap(acc)] * 32
        else:
            inclusive = op == "prefix_inclusive_sum"
            want += [wrap(sum(row[:i + inclusive])) for i in range(32)]
    assert out.tolist() == want


def test_simd_shuffle_down_moves_64_bit_values_whole():
    x = torch.tensor([(i << 40) | (0xFFFFFFFF - i) for i in range(64)], dtype=torch.int64)
    kernel = air.simd_kernel("air.simd_shuffle_down.u.i64", "i64", ["i64", "i16"], constants=["3"],
                             unsigned=True)
    out = torch.empty_like(x)
    kernel(x, out, threads=64, group_size=64)
    rows = _simd_groups(x)
    want = torch.cat([torch.cat([row[3:], row[29:]]) for row in rows])  # no wrap: the top lanes keep theirs
    assert torch.equal(out, want)


@pytest.mark.parametrize("vote", ["all", "any"])
def test_simd_vote_on_64_bit_ballots(vote):
    # The ballot's bits of the lanes active here decide; bits above them do not.
    ballots = torch.tensor([0xFFFFFFFF, 0xFFFFFFFF | (1 << 40), 0xFFFFFFFE, 0, 1 << 40, 1 << 5] * 16,
                           dtype=torch.int64)[:64]
    kernel = air.simd_kernel(f"air.simd_vote_{vote}.i64", "i1", ["i64"])
    out = torch.empty(64, dtype=torch.bool)
    kernel(ballots, out, threads=64, group_size=64)
    low = ballots & 0xFFFFFFFF
    want = low == 0xFFFFFFFF if vote == "all" else low != 0
    assert torch.equal(out, want)


def test_float_to_bfloat_rounds_like_torch_on_every_host():
    """Round to nearest even with subnormals kept (LLVM's AVX512-BF16 lowering flushed them)."""
    g = torch.Generator().manual_seed(5)
    x = torch.cat([torch.randn(1000, generator=g) * 1e-39, torch.randn(1000, generator=g) * 100,
                   torch.tensor([math.nan, math.inf, -math.inf, 0.0, -0.0, 3.4e38, -1e-45])])
    kernel = air.lane_kernel("air.convert.f.bf16.f.f32", "bfloat", ["float"])
    out = torch.empty(x.numel(), dtype=torch.bfloat16)
    kernel(x, out, threads=x.numel())
    want = x.to(torch.bfloat16)
    assert torch.equal(out.view(torch.int16)[~want.isnan()], want.view(torch.int16)[~want.isnan()])
    assert torch.equal(out.isnan(), want.isnan())


# --- atomics ---------------------------------------------------------------------------

def _atomic_kernel(element: str, min_max_returns: str = "i64"):
    """Each thread adds 1 to counter[0] with a compare-exchange loop, records the value it
    replaced, and folds its 64-bit value into slots[0] (max) and slots[1] (min), unsigned.
    `min_max_returns`: "i64" (the old value) or "void", as Metal's 64-bit atomic_min/max
    (PyTorch's scatter_amin/amax into long) declare them."""
    fetched = {"i64": ("%mx = ", "%mn = "), "void": ("", "")}[min_max_returns]
    one = "1.0" if element == "float" else "1"
    add = "fadd" if element == "float" else "add"
    body = [
        "%expected = alloca " + element + ", align 4", "br label %loop", "loop:",
        f"%old = load volatile {element}, ptr addrspace(1) %counter, align 4",
        f"%new = {add} {element} %old, {one}", f"store {element} %old, ptr %expected",
        f"%found = call {element} @air.atomic.global.cmpxchg.weak.{'f32' if element == 'float' else 'i32'}("
        f"ptr addrspace(1) %counter, ptr %expected, {element} %new, i32 0, i32 0, i32 2, i1 true) #2",
        f"%back = load {element}, ptr %expected",
        f"%same = {'fcmp oeq' if element == 'float' else 'icmp eq'} {element} %found, %old",
        "br i1 %same, label %done, label %loop", "done:",
        f"%slot = getelementptr {element}, ptr addrspace(1) %seen, i64 %gid64",
        f"store {element} %back, ptr addrspace(1) %slot",
        "%vp = getelementptr i64, ptr addrspace(1) %values, i64 %gid64", "%v = load i64, ptr addrspace(1) %vp",
        f"{fetched[0]}call {min_max_returns} @air.atomic.global.max.u.i64(ptr addrspace(1) %slots, i64 %v, "
        "i32 0, i32 2, i1 true) #2",
        "%minp = getelementptr i64, ptr addrspace(1) %slots, i64 1",
        f"{fetched[1]}call {min_max_returns} @air.atomic.global.min.u.i64(ptr addrspace(1) %minp, i64 %v, "
        "i32 0, i32 2, i1 true) #2"]
    code = "f32" if element == "float" else "i32"
    declarations = [
        f"declare {element} @air.atomic.global.cmpxchg.weak.{code}(ptr addrspace(1), ptr, {element}, i32, i32, i32, i1) #1",
        f"declare {min_max_returns} @air.atomic.global.max.u.i64(ptr addrspace(1), i64, i32, i32, i1) #1",
        f"declare {min_max_returns} @air.atomic.global.min.u.i64(ptr addrspace(1), i64, i32, i32, i1) #1"]
    memory = "float" if element == "float" else "i32"
    arguments = [("counter", memory, "air.read_write"), ("seen", memory, "air.read_write"),
                 ("values", "i64", "air.read"), ("slots", "i64", "air.read_write")]
    name = f"cas_{code}_{min_max_returns}"
    return air.library(name, air.module_text(name, body, arguments, declarations, False, unsigned=True))[name]


@pytest.mark.parametrize("element,min_max_returns", [("i32", "i64"), ("float", "i64"), ("i32", "void")])
def test_compare_exchange_loop_and_64_bit_unsigned_min_max_are_atomic(element, min_max_returns):
    dtype = torch.float32 if element == "float" else torch.int32
    kernel = _atomic_kernel(element, min_max_returns)
    threads = 2000
    counter, seen = torch.zeros(1, dtype=dtype), torch.full((threads,), -1, dtype=dtype)
    g = torch.Generator().manual_seed(9)
    values = torch.randint(-2**63, 2**63 - 1, (threads,), generator=g, dtype=torch.int64)
    values[0] = -1  # the largest unsigned value
    slots = torch.tensor([0, -1], dtype=torch.int64)  # max from 0, min from the largest
    kernel(counter, seen, values, slots, threads=threads, group_size=50)
    assert counter.item() == threads
    # Each exchange that succeeded replaced a distinct count: 0 .. threads-1, once each.
    assert sorted(seen.to(torch.int64).tolist()) == list(range(threads))
    unsigned = [v & (2**64 - 1) for v in values.tolist()]
    as_signed = lambda u: u - 2**64 if u >= 2**63 else u  # noqa: E731
    assert slots.tolist() == [as_signed(max(unsigned)), as_signed(min(unsigned))]


@pytest.mark.parametrize("width", ["i16", "i32"])
@pytest.mark.parametrize("op", ["get_thread_index_in_simdgroup", "get_simdgroup_index_in_threadgroup"])
def test_lane_and_simdgroup_index_functions(op, width):
    """The builtins' function forms (metaljax's and kiwi-array's MLX builds call
    get_thread_index_in_simdgroup.i16): the position within a group of 96 threads."""
    kernel = air.simd_kernel(f"air.{op}.{width}", width, [])
    dtype = torch.int16 if width == "i16" else torch.int32
    out = torch.full((192,), -1, dtype=dtype)
    kernel(out, threads=192, group_size=96)
    local = torch.arange(192) % 96
    want = local % 32 if op == "get_thread_index_in_simdgroup" else local // 32
    assert torch.equal(out, want.to(dtype))

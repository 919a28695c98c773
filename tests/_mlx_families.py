"""MLX kernel families for the CPU conformance tests (test_cpu_conformance.py).

What is here, all from MLX's Metal sources (mlx/backend/metal/kernels/{unary,binary,copy}.h,
unary_ops.h, binary_ops.h, arange.h, fp8.h, mlx-metal 0.32.4):

* which ops MLX instantiates for which dtypes, so the test parametrization is a static
  list of kernel names (checked against mlx.metallib by a test);
* per op, inputs inside its valid domain (deterministic: a torch.Generator per kernel);
* per op, the reference result computed with torch following MLX's definition of the op
  (C semantics for integers: wrap-around, truncating division; MLX's own FloorDivide,
  Remainder, Sign, Sigmoid, ... formulas);
* the work per thread of the ``*n_`` / ``*2_`` variants and the launch shapes.

Integer references are computed in int64 from int64 inputs and then wrapped to the
kernel's dtype with ``.to(dtype)`` (torch's int64 -> narrower casts wrap, like C). uint64
covers its whole range (values >= 2**63 catch signed/unsigned mix-ups: umax vs smax, udiv
vs sdiv, uitofp vs sitofp), so its references are computed with Python integers.
"""

import math
import zlib
from typing import Dict, List, Optional, Tuple

import torch

# MLX type tag -> torch dtype. complex64 is left out (see test_cpu_conformance.py).
DTYPES: Dict[str, torch.dtype] = {
    "bool_": torch.bool,
    "uint8": torch.uint8, "uint16": torch.uint16, "uint32": torch.uint32, "uint64": torch.uint64,
    "int8": torch.int8, "int16": torch.int16, "int32": torch.int32, "int64": torch.int64,
    "float16": torch.float16, "float32": torch.float32, "bfloat16": torch.bfloat16,
}
ALL_TYPES = tuple(DTYPES)
FLOAT_TYPES = ("float16", "float32", "bfloat16")
INT_TYPES = ("uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64")
UNSIGNED = ("uint8", "uint16", "uint32", "uint64")
SIGNED = ("int8", "int16", "int32", "int64")
# The dtypes every family runs over; families whose 64-bit or 8-bit instantiations take
# another code path (one element per thread, no bounds check) add int64 / uint8 / int16.
MAIN_TYPES = ("float32", "float16", "bfloat16", "int32", "bool_")

BITS = {"bool_": 8, "uint8": 8, "int8": 8, "uint16": 16, "int16": 16, "uint32": 32, "int32": 32,
        "uint64": 64, "int64": 64, "float16": 16, "bfloat16": 16, "float32": 32}
ITEMSIZE = {tag: BITS[tag] // 8 for tag in DTYPES}

# --- which ops MLX instantiates (unary.metal / binary.metal / binary_two.metal) --------------

UNARY_FLOAT_OPS = (
    "ArcCos", "ArcCosh", "ArcSin", "ArcSinh", "ArcTan", "ArcTanh", "Cos", "Cosh", "Exp", "Expm1",
    "Log", "Log2", "Log10", "Log1p", "Sigmoid", "Erf", "ErfInv", "Sin", "Sinh", "Sqrt", "Rsqrt",
    "Tan", "Tanh", "Round",
)
UNARY_ALL_OPS = ("Abs", "Ceil", "Floor", "Negative", "Sign", "Square")


def unary_ops(tag: str) -> List[str]:
    """The unary ops MLX instantiates for `tag` (input == output type)."""
    ops = list(UNARY_ALL_OPS)
    if tag in FLOAT_TYPES:
        ops += UNARY_FLOAT_OPS
    if tag in INT_TYPES:
        ops.append("BitwiseInvert")
    if tag == "bool_":
        ops.append("LogicalNot")
    return ops


BINARY_ALL_OPS = (
    "Add", "Divide", "FloorDivide", "Remainder", "Equal", "Greater", "GreaterEqual", "Less",
    "LessEqual", "NotEqual", "Maximum", "Minimum", "Multiply", "Subtract", "Power", "DivMod",
)
COMPARISONS = ("Equal", "Greater", "GreaterEqual", "Less", "LessEqual", "NotEqual", "NaNEqual")
DIVISIONS = ("Divide", "FloorDivide", "Remainder", "DivMod")


def binary_ops(tag: str) -> List[str]:
    """The binary ops MLX instantiates for `tag`."""
    ops = list(BINARY_ALL_OPS)
    if tag in FLOAT_TYPES:
        ops += ["LogAddExp", "ArcTan2", "NaNEqual"]
    if tag == "bool_":
        ops += ["LogicalOr", "LogicalAnd"]
    if tag in INT_TYPES or tag == "bool_":
        ops += ["BitwiseAnd", "BitwiseOr", "BitwiseXor"]
    if tag in INT_TYPES:
        ops += ["LeftShift", "RightShift"]
    return ops


def binary_out_tag(op: str, tag: str) -> str:
    return "bool_" if op in COMPARISONS else tag


def work_per_thread(tag: str) -> int:
    """MLX's WorkPerThread<T>::n: elements per thread of the n/2 variants (8 bytes / sizeof(T)).
    Unary and binary kernels use the input type, copies the output type."""
    return max(1, 8 // ITEMSIZE[tag])


# --- deterministic inputs -------------------------------------------------------------------

def generator(name: str, salt: int = 0) -> torch.Generator:
    """A generator seeded from the kernel name: inputs do not depend on test order."""
    return torch.Generator().manual_seed(zlib.crc32(name.encode()) * 7 + salt)


MASK64 = (1 << 64) - 1


def int_range(tag: str) -> Tuple[int, int]:
    """The values of integer type `tag` (bool: 0 and 1)."""
    if tag == "bool_":
        return 0, 1
    bits = BITS[tag]
    if tag in UNSIGNED:
        return 0, (1 << bits) - 1
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1


def bit_patterns(values) -> torch.Tensor:
    """Python integers in [-2**63, 2**64) as an int64 tensor of their low 64 bits (values
    >= 2**63 look negative; ``.to(torch.uint64)`` gives them back)."""
    return torch.tensor([v - (1 << 64) if v >= (1 << 63) else v for v in values], dtype=torch.int64)


def randint(lo: int, hi: int, n: int, gen: torch.Generator) -> torch.Tensor:
    """Uniform integers in [lo, hi] (both inclusive), as int64 bit patterns (see
    bit_patterns): spans beyond 2**62 (int64, uint64) go through Python integers."""
    span = hi - lo + 1
    if span <= (1 << 62) and hi < (1 << 63):
        return torch.randint(0, span, (n,), generator=gen, dtype=torch.int64) + lo
    high = torch.randint(0, 1 << 32, (n,), generator=gen, dtype=torch.int64).tolist()
    low = torch.randint(0, 1 << 32, (n,), generator=gen, dtype=torch.int64).tolist()
    return bit_patterns([lo + ((h << 32) | l) % span for h, l in zip(high, low)])


def as_unsigned(t: torch.Tensor) -> List[int]:
    """The values of a uint64 (or int64 bit-pattern) tensor as Python integers."""
    return [v & MASK64 for v in t.reshape(-1).to(torch.int64).tolist()]


def uniform(lo: float, hi: float, n: int, gen: torch.Generator) -> torch.Tensor:
    return torch.rand(n, generator=gen, dtype=torch.float64) * (hi - lo) + lo


def random_bools(n: int, gen: torch.Generator, p: float = 0.5) -> torch.Tensor:
    return torch.rand(n, generator=gen) < p


# Float input domains (before rounding to the kernel's dtype); every value stays inside the
# op's domain after rounding to float16/bfloat16 as well.
UNARY_FLOAT_DOMAIN = {
    "ArcCos": (-0.95, 0.95), "ArcSin": (-0.95, 0.95), "ArcTanh": (-0.95, 0.95),
    "ErfInv": (-0.9, 0.9), "ArcCosh": (1.0, 40.0), "Log": (0.05, 50.0), "Log2": (0.05, 50.0),
    "Log10": (0.05, 50.0), "Sqrt": (0.0, 50.0), "Rsqrt": (0.05, 50.0), "Log1p": (-0.9, 50.0),
    "Exp": (-8.0, 8.0), "Expm1": (-8.0, 8.0), "Sinh": (-8.0, 8.0), "Cosh": (-8.0, 8.0),
    "Tan": (-1.4, 1.4), "Sigmoid": (-12.0, 12.0), "Square": (-100.0, 100.0),
    "Round": (-20.0, 20.0), "Floor": (-20.0, 20.0), "Ceil": (-20.0, 20.0),
}


def unary_input(op: str, tag: str, n: int, gen: torch.Generator) -> torch.Tensor:
    """Input of dtype `tag` inside the domain of `op`."""
    dtype = DTYPES[tag]
    if tag == "bool_":
        return random_bools(n, gen)
    if tag in FLOAT_TYPES:
        lo, hi = UNARY_FLOAT_DOMAIN.get(op, (-4.0, 4.0))
        x = uniform(lo, hi, n, gen)
        if op in ("Round", "Floor", "Ceil", "Sign", "Abs", "Negative"):
            # exact halves and integers (ties of Round go to even), signed zeros
            halves = torch.randint(-40, 41, (n,), generator=gen).double() / 2
            x = torch.where(random_bools(n, gen, 0.4), halves, x)
            x[:4] = torch.tensor([0.0, -0.0, 0.5, -2.5])
        return x.to(dtype)
    lo, hi = int_range(tag)
    if op in ("Abs", "Negative") and tag in SIGNED:
        lo += 1  # -INT_MIN overflows
    if op == "Square" and tag in SIGNED:
        hi = math.isqrt(hi)
        lo = -hi
    return randint(lo, hi, n, gen).to(dtype)


def _nonzero_divisor(tag: str, n: int, gen: torch.Generator) -> torch.Tensor:
    lo, hi = int_range(tag)
    small = randint(1, min(hi, 100), n, gen)
    large = randint(1, hi, n, gen)
    b = torch.where(random_bools(n, gen, 0.7), small, large)
    if tag in SIGNED:
        b = torch.where(random_bools(n, gen), b, -b)
    return b


def binary_inputs(op: str, tag: str, n: int, gen: torch.Generator) -> Tuple[torch.Tensor, torch.Tensor]:
    """(a, b) of dtype `tag` inside the domain of `op`."""
    dtype = DTYPES[tag]
    if tag == "bool_":
        a, b = random_bools(n, gen), random_bools(n, gen)
        if op in DIVISIONS:
            b = torch.ones(n, dtype=torch.bool)  # x / false divides by zero
        return a, b
    if tag in FLOAT_TYPES:
        if op in DIVISIONS:
            a = uniform(-20.0, 20.0, n, gen)
            b = uniform(0.25, 4.0, n, gen) * torch.where(random_bools(n, gen), 1.0, -1.0)
            # exact multiples: FloorDivide/Remainder at their discontinuities
            b = torch.where(random_bools(n, gen, 0.2), torch.full((n,), 0.5, dtype=torch.float64), b)
            a = torch.where(random_bools(n, gen, 0.2), torch.randint(-20, 21, (n,), generator=gen).double(), a)
        elif op == "Power":
            a, b = uniform(0.1, 4.0, n, gen), uniform(-3.0, 3.0, n, gen)
        elif op == "LogAddExp":
            a, b = uniform(-12.0, 12.0, n, gen), uniform(-12.0, 12.0, n, gen)
        elif op in COMPARISONS or op in ("Maximum", "Minimum"):
            a = torch.randint(-16, 17, (n,), generator=gen).double() / 4  # many ties, +-0
            b = torch.randint(-16, 17, (n,), generator=gen).double() / 4
            a[torch.arange(n) % 4 == 1] *= -1.0  # -0.0 where 0
            # NaN on either side, and on both (index % 35 == 0)
            a[torch.arange(n) % 7 == 0] = math.nan
            b[torch.arange(n) % 5 == 0] = math.nan
        else:
            a, b = uniform(-8.0, 8.0, n, gen), uniform(-8.0, 8.0, n, gen)
        return a.to(dtype), b.to(dtype)
    lo, hi = int_range(tag)
    bits = BITS[tag]
    if op in ("Add", "Subtract") and tag in SIGNED:
        a, b = randint(lo // 2, hi // 2, n, gen), randint(lo // 2, hi // 2, n, gen)
    elif op == "Multiply" and tag in SIGNED:
        r = math.isqrt(hi)
        a, b = randint(-r, r, n, gen), randint(-r, r, n, gen)
    elif op in DIVISIONS:
        a = randint(lo + 1 if tag in SIGNED else lo, hi, n, gen)  # INT_MIN / -1 overflows
        b = _nonzero_divisor(tag, n, gen)
    elif op == "Power":
        a = randint(-3 if tag in SIGNED else 0, 3, n, gen)
        b = randint(0, 7, n, gen)  # MLX's integer power is undefined for exp < 0
    elif op == "LeftShift":
        if tag in SIGNED:  # no signed overflow
            a, b = randint(0, (1 << (bits // 2)) - 1, n, gen), randint(0, bits // 2 - 1, n, gen)
        else:  # unsigned: bits shifted out are dropped
            a, b = randint(lo, hi, n, gen), randint(0, bits - 1, n, gen)
    elif op == "RightShift":
        a, b = randint(lo, hi, n, gen), randint(0, bits - 1, n, gen)
    else:
        a, b = randint(lo, hi, n, gen), randint(lo, hi, n, gen)
        if op in COMPARISONS or op in ("Maximum", "Minimum"):
            b = torch.where(random_bools(n, gen, 0.3), a, b)  # ties
    return a.to(dtype), b.to(dtype)


# --- references -----------------------------------------------------------------------------

def _wrap(value: torch.Tensor, tag: str) -> torch.Tensor:
    """An int64 (or bool) result converted to `tag` as C does (wrap-around, != 0 for bool)."""
    if tag == "bool_":
        return value != 0
    return value.to(DTYPES[tag])


def _f32(value: float) -> torch.Tensor:
    """A float literal as the float32 constant the Metal compiler made of it."""
    return torch.tensor(value, dtype=torch.float32)


def _fma(a, b, c) -> torch.Tensor:
    """float32 fma: a * b is exact in float64; the sum is rounded to float64 then float32
    (a rare double rounding, well inside the tolerance)."""
    as64 = [v.double() if isinstance(v, torch.Tensor) else _f32(v).double() for v in (a, b, c)]
    return (as64[0] * as64[1] + as64[2]).float()


def mlx_expm1f(a: torch.Tensor) -> torch.Tensor:
    """MLX's expm1f (expm1f.h) replayed in float32 for |a - 1| <= 88. It reduces the argument
    with the high part of ln 2 only (Juffa's original also subtracts the low part,
    1.42860677e-6 * j), so it is off the true expm1 by up to |a| / ln 2 * 1.4e-6 relative: a
    property of MLX's kernel (the GPU computes the same), which the float32 tests replay."""
    j = _fma(1.442695, a, 12582912.0) - 12582912.0
    i = j.to(torch.int32)
    f = _fma(j, -6.93145752e-1, a)
    s = torch.where(a == 0, a, f * f)
    r = _fma(_f32(1.97350979e-4).expand_as(a), f, 1.39309070e-3)
    for coefficient in (8.33343994e-3, 4.16668020e-2, 1.66666716e-1, 4.99999970e-1):
        r = _fma(r, f, coefficient)
    u = torch.where(j == 1, f + 0.5, f)
    v = _fma(r, s, u)
    half = torch.full_like(a, 0.5)
    t = torch.ldexp(half, i)
    y = t - half
    x = (t - y) - half
    r = _fma(v, t, x) + y
    r = r + r
    r = torch.where(j == 0, v, r)
    return torch.where(j == 1, v + v, r)


def mlx_erff(a: torch.Tensor) -> torch.Tensor:
    """MLX's erf (erf.h, as compiled into mlx-metal 0.32.4: 1 - exp(r) is -expm1f(r)) in
    float32; it inherits mlx_expm1f's argument-reduction error for |a| > 0.927734375."""
    t, s = a.abs(), a * a
    r = _fma(-1.72853470e-5, t, 3.83197126e-4)
    u = _fma(-3.88396438e-3, t, 2.42546219e-2)
    r = _fma(r, s, u)
    for coefficient in (-1.06777877e-1, -6.34846687e-1, -1.28717512e-1):
        r = _fma(r, t, coefficient)
    r = _fma(r, t, -t)
    large = torch.copysign(-mlx_expm1f(r), a)
    q = _fma(-5.96761703e-4, s, 4.99119423e-3)
    for coefficient in (-2.67681349e-2, 1.12819925e-1, -3.76125336e-1, 1.28379166e-1):
        q = _fma(q, s, coefficient)
    small = _fma(q, a, a)
    return torch.where(t > 0.927734375, large, small)


def _uint64_unary(op: str, x: torch.Tensor) -> torch.Tensor:
    f = {"Abs": lambda v: v, "Ceil": lambda v: v, "Floor": lambda v: v, "Negative": lambda v: -v,
         "Sign": lambda v: int(v != 0), "Square": lambda v: v * v, "BitwiseInvert": lambda v: ~v}[op]
    return bit_patterns([f(v) & MASK64 for v in as_unsigned(x)]).to(torch.uint64).reshape(x.shape)


def _uint64_binary(op: str, a: torch.Tensor, b: torch.Tensor):
    xs, ys = as_unsigned(a), as_unsigned(b)
    compare = {"Equal": lambda x, y: x == y, "NotEqual": lambda x, y: x != y, "Greater": lambda x, y: x > y,
               "GreaterEqual": lambda x, y: x >= y, "Less": lambda x, y: x < y, "LessEqual": lambda x, y: x <= y}
    if op in compare:
        return torch.tensor([compare[op](x, y) for x, y in zip(xs, ys)], dtype=torch.bool).reshape(a.shape)
    if op == "DivMod":
        return _uint64_binary("FloorDivide", a, b), _uint64_binary("Remainder", a, b)
    f = {"Add": lambda x, y: x + y, "Subtract": lambda x, y: x - y, "Multiply": lambda x, y: x * y,
         "Divide": lambda x, y: x // y, "FloorDivide": lambda x, y: x // y, "Remainder": lambda x, y: x % y,
         "Maximum": max, "Minimum": min, "Power": lambda x, y: pow(x, y, 1 << 64),
         "BitwiseAnd": lambda x, y: x & y, "BitwiseOr": lambda x, y: x | y, "BitwiseXor": lambda x, y: x ^ y,
         "LeftShift": lambda x, y: x << y, "RightShift": lambda x, y: x >> y}[op]
    return bit_patterns([f(x, y) & MASK64 for x, y in zip(xs, ys)]).to(torch.uint64).reshape(a.shape)


def unary_reference(op: str, x: torch.Tensor, tag: str) -> torch.Tensor:
    """MLX's unary `op` on `x` (dtype `tag`), computed with torch."""
    if tag == "uint64":
        return _uint64_unary(op, x)
    if tag == "bool_":
        if op == "LogicalNot":
            return ~x
        return x.clone()  # Abs, Ceil, Floor, Negative (-1 != 0), Sign, Square of a bool
    if tag in INT_TYPES:
        v = x.to(torch.int64)
        result = {
            "Abs": lambda: v.abs(), "Ceil": lambda: v, "Floor": lambda: v, "Negative": lambda: -v,
            "Sign": lambda: v.sign(), "Square": lambda: v * v, "BitwiseInvert": lambda: ~v,
        }[op]()
        return _wrap(result, tag)
    if op == "Expm1" and tag == "float32":
        return mlx_expm1f(x)
    if op == "Erf" and tag == "float32":
        return mlx_erff(x)
    if op not in EXACT_IN_TYPE:
        # the correctly rounded result: torch in float64, rounded once to the kernel's type
        # (torch's own float32/float16 versions are not always: its vectorized float32 sqrt
        # and its float16 erf are off by an ulp or two on some inputs)
        return _UNARY_FUNCTIONS[op](x.double()).to(x.dtype)
    return _UNARY_FUNCTIONS[op](x)


# Float ops computed in the kernel's own type: exact (one IEEE rounding, or none).
EXACT_IN_TYPE = ("Abs", "Ceil", "Floor", "Negative", "Sign", "Square", "Round")

_UNARY_FUNCTIONS = {
    "Abs": torch.abs, "ArcCos": torch.acos, "ArcCosh": torch.acosh, "ArcSin": torch.asin,
    "ArcSinh": torch.asinh, "ArcTan": torch.atan, "ArcTanh": torch.atanh, "Ceil": torch.ceil,
    "Cos": torch.cos, "Cosh": torch.cosh, "Exp": torch.exp, "Expm1": torch.expm1,
    "Floor": torch.floor, "Log": torch.log, "Log2": torch.log2, "Log10": torch.log10,
    "Log1p": torch.log1p, "Negative": torch.neg, "Sigmoid": torch.sigmoid, "Erf": torch.erf,
    "ErfInv": torch.erfinv, "Sign": torch.sign, "Sin": torch.sin, "Sinh": torch.sinh,
    "Square": torch.square, "Sqrt": torch.sqrt, "Rsqrt": torch.rsqrt, "Tan": torch.tan,
    "Tanh": torch.tanh, "Round": torch.round,  # torch.round: ties to even, like metal::rint
}


def _float_binary(op: str, a: torch.Tensor, b: torch.Tensor):
    if op == "Add":
        return a + b
    if op == "Subtract":
        return a - b
    if op == "Multiply":
        return a * b
    if op == "Divide":
        return a / b
    if op == "FloorDivide":  # MLX: floor(x / y) in the kernel's type
        return torch.floor(a / b)
    if op == "Remainder":  # MLX: r = fmod(x, y); if (r != 0 && (r < 0) != (y < 0)) r += y
        r = torch.fmod(a, b)
        return torch.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)
    if op == "DivMod":
        return _float_binary("FloorDivide", a, b), _float_binary("Remainder", a, b)
    if op == "Maximum":  # MLX: isnan(x) ? x : (x > y ? x : y)
        return torch.where(torch.isnan(a) | (a > b), a, b)
    if op == "Minimum":
        return torch.where(torch.isnan(a) | (a < b), a, b)
    if op == "Power":
        return torch.pow(a, b)
    if op == "LogAddExp":
        return torch.logaddexp(a, b)
    if op == "ArcTan2":
        return torch.atan2(a, b)
    if op == "NaNEqual":
        return (a == b) | (torch.isnan(a) & torch.isnan(b))
    return _comparison(op, a, b)


def _comparison(op: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return {"Equal": torch.eq, "NotEqual": torch.ne, "Greater": torch.gt, "GreaterEqual": torch.ge,
            "Less": torch.lt, "LessEqual": torch.le}[op](a, b)


def _int_binary(op: str, a: torch.Tensor, b: torch.Tensor, signed: bool):
    if op == "Add":
        return a + b
    if op == "Subtract":
        return a - b
    if op == "Multiply":
        return a * b
    if op == "Divide":
        return torch.div(a, b, rounding_mode="trunc")  # C division
    if op == "FloorDivide":  # unsigned: x / y; signed: rounded toward -inf
        return torch.div(a, b, rounding_mode="floor" if signed else "trunc")
    if op == "Remainder":  # unsigned: x % y; signed: the sign of the divisor (Python's %)
        return torch.remainder(a, b) if signed else torch.fmod(a, b)
    if op == "DivMod":
        return _int_binary("FloorDivide", a, b, signed), _int_binary("Remainder", a, b, signed)
    if op == "Maximum":
        return torch.maximum(a, b)
    if op == "Minimum":
        return torch.minimum(a, b)
    if op == "Power":  # square-and-multiply; exponents are >= 0 here
        result = torch.ones_like(a)
        base, exp = a.clone(), b.clone()
        while bool((exp != 0).any()):
            result = torch.where((exp & 1) == 1, result * base, result)
            exp = exp >> 1
            base = base * base
        return result
    if op in ("BitwiseAnd", "LogicalAnd"):
        return a & b
    if op in ("BitwiseOr", "LogicalOr"):
        return a | b
    if op == "BitwiseXor":
        return a ^ b
    if op == "LeftShift":
        return a << b
    if op == "RightShift":
        return a >> b  # arithmetic for signed values; uint values are >= 0 in int64
    return _comparison(op, a, b)


def binary_reference(op: str, a: torch.Tensor, b: torch.Tensor, tag: str):
    """MLX's binary `op` on `a`, `b` (dtype `tag`, broadcastable): one tensor, or two for
    DivMod, in the kernel's output dtypes."""
    out_tag = binary_out_tag(op, tag)
    if tag == "uint64":
        return _uint64_binary(op, a.expand(torch.broadcast_shapes(a.shape, b.shape)),
                              b.expand(torch.broadcast_shapes(a.shape, b.shape)))
    if tag in FLOAT_TYPES:
        if op in ("Power", "LogAddExp", "ArcTan2"):  # correctly rounded, as for unary ops
            return _float_binary(op, a.double(), b.double()).to(a.dtype)
        return _float_binary(op, a, b)
    signed = tag in SIGNED
    result = _int_binary(op, a.to(torch.int64), b.to(torch.int64), signed)
    if isinstance(result, tuple):
        return tuple(_wrap(r, out_tag) for r in result)
    if result.dtype == torch.bool:
        return result
    return _wrap(result, out_tag)


# --- casts (copy kernels) -------------------------------------------------------------------

# Integer range converted to each float type: float16 holds up to 65504; int -> bfloat16
# above 2**24 would round twice (through float), which is not what a single conversion
# does. float32 takes every integer (one rounding, uitofp/sitofp).
FLOAT_INT_LIMIT = {"float16": 60000, "bfloat16": 1 << 24, "float32": 1 << 64}


def cast_input(src: str, dst: str, n: int, gen: torch.Generator) -> torch.Tensor:
    """Values of dtype `src` that convert to `dst` without overflow (casts to integers stay
    in range; float -> unsigned is non-negative), with fractions, zeros and both signs."""
    dtype = DTYPES[src]
    if src == "bool_":
        return random_bools(n, gen)
    if src in INT_TYPES:
        lo, hi = int_range(src)
        if dst in INT_TYPES:
            dlo, dhi = int_range(dst)
            lo, hi = max(lo, dlo), min(hi, dhi)
        elif dst in FLOAT_TYPES:
            lo, hi = max(lo, -FLOAT_INT_LIMIT[dst]), min(hi, FLOAT_INT_LIMIT[dst])
        x = randint(lo, hi, n, gen)
        small = randint(max(lo, -3), min(hi, 3), n, gen)
        return torch.where(random_bools(n, gen, 0.25), small, x).to(dtype)
    # float source: to integers over (most of) their range, float16 to its own
    limit = 60000.0 if "float16" in (src, dst) else 1e30
    if dst in INT_TYPES:
        dlo, dhi = int_range(dst)
        lo, hi = max(dlo * 0.99, -limit), min(dhi * 0.99, limit)
    else:
        lo, hi = -limit, limit
    if dst in UNSIGNED:
        lo = 0.0
    wide = uniform(lo, hi, n, gen)
    small = uniform(max(lo, -130.0), min(hi, 130.0), n, gen)  # fractions: truncation toward 0
    tiny = uniform(-1.0, 1.0, n, gen) * torch.pow(10.0, uniform(-9.0, 0.0, n, gen))
    if dst in UNSIGNED:
        tiny = tiny.abs()
    pick = torch.rand(n, generator=gen)
    x = torch.where(pick < 0.4, wide, torch.where(pick < 0.8, small, tiny))
    x[:3] = torch.tensor([0.0, -0.0 if dst not in UNSIGNED else 0.0, 1.0])
    return x.to(dtype)


def cast_reference(x: torch.Tensor, dst: str) -> torch.Tensor:
    """static_cast<dst>(x): torch's conversion (round to nearest even between floats,
    truncation toward zero from float to int, != 0 to bool)."""
    if DTYPES[dst] == torch.bool:
        return x != 0
    return x.to(DTYPES[dst])


# --- comparing ------------------------------------------------------------------------------

def as_int64(t: torch.Tensor) -> torch.Tensor:
    """Bit-exact integer view of an integer/bool tensor for comparisons (uint64 wraps)."""
    if t.dtype == torch.bool:
        return t.view(torch.uint8).to(torch.int64)
    return t.to(torch.int64)


def eps(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps


def mismatch_report(got: torch.Tensor, want: torch.Tensor, bad: torch.Tensor, limit: int = 5) -> str:
    index = bad.nonzero().flatten()[:limit].tolist()
    pairs = ", ".join(f"[{i}] got {got[i].item()!r} want {want[i].item()!r}" for i in index)
    return f"{int(bad.sum())} of {bad.numel()} elements differ, e.g. {pairs}"


def compare(got: torch.Tensor, want: torch.Tensor, ulps: float = 0.0, floor: float = 0.0) -> Optional[str]:
    """None if `got` matches `want`, else a description of the mismatch.

    Integers and bools: exactly (bools also byte-exactly 0 or 1). Floats: NaN where `want`
    is NaN, else |got - want| <= ulps * eps(dtype) * max(|want|, floor, smallest normal);
    ulps == 0 means exactly equal, with the same sign of zero."""
    got, want = got.flatten(), want.flatten()
    if got.dtype != want.dtype:
        return f"dtype {got.dtype} != expected {want.dtype}"
    if got.shape != want.shape:
        return f"shape {tuple(got.shape)} != expected {tuple(want.shape)}"
    if not got.dtype.is_floating_point:
        bad = as_int64(got) != as_int64(want)
        return None if not bad.any() else mismatch_report(as_int64(got), as_int64(want), bad)
    g, w = got.double(), want.double()
    nan_w, nan_g = torch.isnan(w), torch.isnan(g)
    bad = nan_w != nan_g
    finite = ~nan_w & ~nan_g
    if ulps == 0:  # exact, down to the sign of zero
        bad |= finite & ((g != w) | (torch.signbit(g) != torch.signbit(w)))
    else:
        # below the smallest normal number the spacing is constant: an absolute budget there
        floor = max(floor, torch.finfo(got.dtype).tiny)
        allowed = ulps * eps(got.dtype) * torch.maximum(w.abs(), torch.tensor(floor, dtype=torch.float64))
        same_inf = torch.isinf(w) & (g == w)
        bad |= finite & ~same_inf & ((g - w).abs() > allowed)
    return None if not bad.any() else mismatch_report(g, w, bad)


def max_error_ulps(got: torch.Tensor, want: torch.Tensor, floor: float = 0.0) -> float:
    """The largest |got - want| / (eps * max(|want|, floor)) over finite elements (for
    tuning the tolerance table)."""
    g, w = got.double().flatten(), want.double().flatten()
    finite = torch.isfinite(g) & torch.isfinite(w)
    if not finite.any():
        return 0.0
    scale = eps(got.dtype) * torch.maximum(w.abs(), torch.tensor(max(floor, 1e-300), dtype=torch.float64))
    return float(((g - w).abs() / scale)[finite].max())


# --- launch shapes --------------------------------------------------------------------------

SIZE_1D = 4099          # 4 * 1024 + 3: the last threadgroup is cut short; not a multiple of 32
SIZE_2D_EXACT = 61 * 67  # 2-D variants without a bounds check (one element per thread)
GROUP_2D = (32, 4)      # 61 = 32 + 29, 67 = 16 * 4 + 3: partial groups along both axes


def grid_2d(size: int, per_thread: int) -> Tuple[int, int]:
    """(x, y) threads covering `size` elements at `per_thread` each, x = 61."""
    items = -(-size // per_thread)
    return 61, -(-items // 61)


def sentinel_like(n: int, tag: str, extra: int = 1) -> torch.Tensor:
    """A tensor of n + extra elements whose bytes are all 0xA5: every element the kernel
    should write differs from it (bool bytes must become 0 or 1), and the extra elements
    must keep it. It starts one element into its storage (a storage offset, and a guard
    element before it: see element_before)."""
    base = torch.empty(n + extra + 1, dtype=DTYPES[tag])
    base.view(torch.uint8).fill_(0xA5)
    return base[1:]


def element_before(t: torch.Tensor) -> torch.Tensor:
    """The storage element just before `t`'s first one (a view)."""
    return t.as_strided((1,), (1,), t.storage_offset() - 1)


def untouched(t: torch.Tensor) -> bool:
    """Whether every byte of `t` (contiguous, or a view of bytes) is still 0xA5."""
    return bool((t.contiguous().view(torch.uint8) == 0xA5).all())

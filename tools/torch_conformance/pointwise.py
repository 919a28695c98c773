"""PyTorch's pointwise kernels outside the unary/binary templates: ternary clamp, the
unary-with-a-parameter templates whose parameter is a struct or a typed scalar, lerp with
a tensor weight, and cross.

* ``clamp_{dense,strided}[_cast]_<T>`` (c10/metal/indexing.h ternary templates; functor
  ``min(max(a, lo), hi)``, TensorCompare.metal): dense: out, input, other1, other2;
  dense_cast: the operands of any type, ``sizes`` (element sizes) and ``types``
  (c10::ScalarType codes) of the three, each converted to T; strided: ``void*`` operands,
  sizes and strides in bytes, innermost first, one thread per element; strided_cast adds
  ``types`` (uint4: the three operands' codes).
* ``<op>_{dense,strided}_<O>_<I>_<A>`` with a parameter ``alpha`` of type A: clamp_scalar
  (``ClampScalarParams``: min, max), clamp_min_scalar, clamp_max_scalar, pow_scalar,
  polygamma (alpha = n), round_decimals (alpha = decimals), elu (``ELUParams``: alpha,
  scale, input_scale). Dense: one thread per element; strided: a 2-D grid whose x is the
  innermost dimension, sizes and byte strides innermost first.
* ``lerp_tensor_<kind>_<T>`` (BinaryKernel.metal): ``fma(w, e - s, s)`` in T (bfloat in
  float; long and complex ``s + w * (e - s)``). dense; scalar_weight (a weight by value);
  strided_2d / strided_3d (a grid over the dimensions, innermost first, byte strides);
  strided (sizes, byte strides, ndim; one thread per element).
* ``cross_{dense,strided}_<T>`` (CrossKernel.metal): numel / 3 threads. Dense: contiguous,
  ``dim_stride`` = stride(dim); strided: the sizes of the other dimensions, strides in
  elements of all, ndim, dim.
"""

import math
import re
from typing import Optional, Tuple

import torch

from .buffers import bindable, exact, sentinel_view, untouched
from .compare import mismatch
from .dtypes import METAL_DTYPES, SCALAR_TYPE_CODES, is_complex, is_integral, wide
from .elementwise import _CAST_PARTNER, NoHarness
from .inputs import generator, values

_T = r"(float|half|bfloat|int|long|short|char|uchar|bool|float2|half2)"
_ALPHA_OPS = ("clamp_scalar", "clamp_min_scalar", "clamp_max_scalar", "pow_scalar", "polygamma",
              "round_decimals", "elu")
_PATTERNS = [
    ("clamp", re.compile(rf"^clamp_(dense|strided)(_cast)?_(?:{_T}_)?{_T}$")),
    ("alpha", re.compile(rf"^({'|'.join(_ALPHA_OPS)})_(dense|strided)_{_T}_{_T}_(?:(ClampScalarParams|ELUParams)_)?{_T}$")),
    ("lerp_tensor", re.compile(rf"^lerp_tensor_(dense|scalar_weight|strided_2d|strided_3d|strided)_{_T}$")),
    ("cross", re.compile(rf"^cross_(dense|strided)_{_T}$")),
]
SHAPE = (5, 7, 9)


def parse(name: str) -> Optional[Tuple]:
    for op, pattern in _PATTERNS:
        match = pattern.match(name)
        if match:
            if op == "alpha":
                return match.groups()
            return (op,) + match.groups()
    return None


def _as_bytes(values, t: torch.dtype) -> bytes:
    """`values` as an array of `t`, bytes exactly as the kernel reads them (a struct of Ts)."""
    return torch.tensor(values, dtype=torch.float64).to(t).view(torch.uint8).numpy().tobytes()


def _innermost_first(t: torch.Tensor):
    """(sizes, byte strides), innermost dimension first."""
    dims = list(reversed(range(t.dim())))
    return [t.shape[d] for d in dims], [t.stride(d) * t.element_size() for d in dims]


def _operand(t: torch.dtype, gen, layout: str, domain: str = "any", operand: int = 0) -> torch.Tensor:
    """SHAPE's values of `t` in `domain`, laid out contiguous or transposed."""
    x = values(math.prod(SHAPE), t, domain, gen, operand).reshape(SHAPE)
    return x.transpose(0, 2).contiguous().transpose(0, 2) if layout == "transposed" else x


def _compare(storage, out, expected, tolerance: str) -> Optional[str]:
    if not untouched(storage, out):
        return "wrote outside its output"
    if is_integral(out.dtype) or tolerance == "copy":
        return exact(out, expected)
    return mismatch(out.contiguous(), expected, tolerance)


# ------------------------------------------------------------------------------------- clamp

def check_clamp(function, variant: str, cast: bool, t: torch.dtype) -> Tuple[str, str]:
    gen = generator(function.name)
    partner = _CAST_PARTNER[t] if cast else t
    # Bounds of another type where the kernel converts them (a cast variant): the functor
    # clamps the converted values.
    a = _operand(t, gen, "contiguous")
    if t.is_floating_point:  # NaN propagates through max and min
        a.view(-1)[::17] = float("nan")
    if variant == "strided":
        a = a.transpose(0, 2).contiguous().transpose(0, 2)
    lo = _operand(partner, gen, "contiguous", operand=1)
    hi = _operand(t, gen, "contiguous", operand=1)
    if variant == "strided":
        storage, out = sentinel_view(SHAPE, t, order=(1, 2, 0), gap=2)
        sizes, out_strides = _innermost_first(out)
        kwargs = dict(sizes=sizes, output_strides=out_strides, input_strides=_innermost_first(a)[1],
                      other1_strides=_innermost_first(lo)[1], other2_strides=_innermost_first(hi)[1], ndim=3)
        if cast:
            kwargs["types"] = (SCALAR_TYPE_CODES[t], SCALAR_TYPE_CODES[partner], SCALAR_TYPE_CODES[t], 0)
    else:
        storage, out = sentinel_view(SHAPE, t)
        kwargs = {}
        if cast:
            kwargs = dict(sizes=(a.element_size(), lo.element_size(), hi.element_size()),
                          types=(SCALAR_TYPE_CODES[t], SCALAR_TYPE_CODES[partner], SCALAR_TYPE_CODES[t]))
    out_name = "out" if any(x.name == "out" for x in function.arguments) else "output"
    function(**{out_name: bindable(out)}, input=bindable(a), other1=bindable(lo), other2=bindable(hi), **kwargs,
             threads=math.prod(SHAPE), group_size=64)
    w = lambda x: x.to(t).to(wide(t)) if t != torch.bool else x.to(torch.int64)  # noqa: E731
    expected = torch.minimum(torch.maximum(w(a), w(lo)), w(hi))
    expected = expected != 0 if t == torch.bool else expected.to(t)
    problem = _compare(storage, out, expected, "copy")
    return ("wrong", problem) if problem else ("correct", "")


# ------------------------------------------------------------------------------ alpha kernels

def _alpha_case(op: str, ti: torch.dtype, ta: torch.dtype):
    """(input domain, alpha as bound, reference over wide input, tolerance)."""
    complex_alpha = is_complex(ta)
    if op == "clamp_scalar":
        lo, hi = (-1.5, 2.25) if ti.is_floating_point else (-3, 7) if ti != torch.uint8 else (3, 17)
        if ti == torch.bool:
            lo, hi = 0, 1
        return "any", _as_bytes([lo, hi], ti), lambda x: torch.clamp(x, lo, hi), "copy"
    if op in ("clamp_min_scalar", "clamp_max_scalar"):
        bound = 0.75 if ti.is_floating_point else 4 if ti != torch.bool else True
        fn = (lambda x: torch.clamp(x, min=bound)) if op == "clamp_min_scalar" else (lambda x: torch.clamp(x, max=bound))
        return "any", bound, fn, "copy"
    if op == "pow_scalar":
        if complex_alpha:
            return "positive", (1.5, 0.5), lambda x: torch.pow(x, complex(1.5, 0.5)), "special"
        if is_integral(ti):
            return "small", 3, lambda x: torch.pow(x, 3), "copy"
        return "positive", 2.5, lambda x: torch.pow(x, 2.5), "math"
    if op == "polygamma":
        return "positive", 2, lambda x: torch.polygamma(2, x.double()), "special"
    if op == "round_decimals":
        return "any", 2, lambda x: torch.round(x, decimals=2), "math"
    if op == "elu":
        return "any", _as_bytes([1.5, 1.25, 0.75], ti), lambda x: torch.ops.aten.elu(x, 1.5, 1.25, 0.75), "math"
    raise NoHarness(f"no reference for {op}")


def check_alpha(function, op: str, variant: str, to: torch.dtype, ti: torch.dtype, ta: torch.dtype) -> Tuple[str, str]:
    gen = generator(function.name)
    domain, alpha, reference, tolerance = _alpha_case(op, ti, ta)
    if domain == "small":  # integer powers that stay within the narrowest type
        x = torch.randint(0 if ti == torch.uint8 else -5, 6, SHAPE, generator=gen).to(ti)
    else:
        x = _operand(ti, gen, "contiguous", "positive" if domain == "positive" and not is_integral(ti) else domain)
        if domain == "positive" and is_integral(ti):
            x = x.abs() + 1 if ti != torch.bool else torch.ones(SHAPE, dtype=torch.bool)
    if variant == "strided":
        x = x.transpose(0, 2).contiguous().transpose(0, 2)
        storage, out = sentinel_view(SHAPE, to, order=(1, 2, 0), gap=2)
        sizes, out_strides = _innermost_first(out)
        function(output=bindable(out), input=bindable(x), sizes=sizes, input_strides=_innermost_first(x)[1],
                 output_strides=out_strides, ndim=3, alpha=alpha,
                 threads=(sizes[0], sizes[1] * sizes[2]), group_size=(8, 8))
    else:
        storage, out = sentinel_view(SHAPE, to)
        function(output=bindable(out), input=bindable(x), alpha=alpha, threads=math.prod(SHAPE), group_size=64)
    xw = x.to(torch.int64) if ti == torch.bool else x.to(wide(ti))
    expected = reference(xw)
    if to == torch.bool:
        expected = expected != 0
    problem = _compare(storage, out, expected, tolerance)
    return ("wrong", problem) if problem else ("correct", "")


# ------------------------------------------------------------------------------ lerp_tensor

def check_lerp(function, variant: str, t: torch.dtype) -> Tuple[str, str]:
    gen = generator(function.name)
    layout = "contiguous" if variant in ("dense", "scalar_weight") else "transposed"
    s = _operand(t, gen, layout, "unit")
    e = _operand(t, gen, "contiguous", "unit", 1)
    if is_integral(t):
        w = torch.randint(-2, 3, SHAPE, generator=gen).to(t)
    else:
        w = _operand(t, gen, layout, "unit", 1)
        if not is_complex(t):
            w = w.abs()
    if variant == "scalar_weight":
        w = w.flatten()[0].expand(SHAPE)
    storage, out = sentinel_view(SHAPE, t, order=(0, 1, 2) if layout == "contiguous" else (1, 2, 0),
                                 gap=1 if layout == "contiguous" else 2)
    if variant == "dense":
        function(bindable(out), bindable(s), bindable(e), bindable(w.contiguous()), threads=math.prod(SHAPE),
                 group_size=64)
    elif variant == "scalar_weight":
        weight = w.flatten()[0]
        function(bindable(out), bindable(s), bindable(e),
                 (weight.real.item(), weight.imag.item()) if is_complex(t) else weight.item(),
                 threads=math.prod(SHAPE), group_size=64)
    else:
        strides = [_innermost_first(x)[1] for x in (out, s, e, w)]
        sizes = _innermost_first(out)[0]
        if variant == "strided":
            function(bindable(out), bindable(s), bindable(e), bindable(w), sizes, *strides, 3,
                     threads=math.prod(SHAPE), group_size=64)
        elif variant == "strided_3d":
            function(bindable(out), bindable(s), bindable(e), bindable(w), *strides,
                     threads=tuple(sizes), group_size=(4, 4, 2))
        else:  # a 2-D grid: the first two dimensions of a 2-D slice (the last index fixed at 0)
            out2, s2, e2, w2 = (x[:, :, 0] for x in (out, s, e, w))
            strides = [_innermost_first(x)[1] for x in (out2, s2, e2, w2)]
            function(bindable(out), bindable(s2), bindable(e2), bindable(w2), *strides,
                     threads=tuple(_innermost_first(out2)[0]), group_size=(4, 4))
            # Only the slice is written: compare it, and the rest must keep the sentinel.
            expected = _lerp_reference(s2, e2, w2, t)
            if not untouched(storage, out2):
                return "wrong", "wrote outside its output"
            tolerance = "copy" if is_integral(t) else "math"
            problem = exact(out2, expected) if tolerance == "copy" else mismatch(out2.contiguous(), expected, tolerance)
            return ("wrong", problem) if problem else ("correct", "")
    expected = _lerp_reference(s, e, w, t)
    problem = _compare(storage, out, expected, "copy" if is_integral(t) else "math")
    return ("wrong", problem) if problem else ("correct", "")


def _lerp_reference(s, e, w, t):
    if is_integral(t):  # long: s + w * (e - s), no torch.lerp for integers
        s, e, w = (x.to(torch.int64) for x in (s, e, w))
        return s + w * (e - s)
    return torch.lerp(s.to(wide(t)), e.to(wide(t)), w.to(wide(t)))


# ------------------------------------------------------------------------------------ cross

def check_cross(function, variant: str, t: torch.dtype) -> Tuple[str, str]:
    gen = generator(function.name)
    for dim, shape in ((1, (5, 3, 7)), (2, (4, 6, 3)), (0, (3, 5, 4))):
        a = values(math.prod(shape), t, "unit", gen).reshape(shape)
        b = values(math.prod(shape), t, "unit", gen, 1).reshape(shape)
        threads = math.prod(shape) // 3
        if variant == "dense":
            storage, out = sentinel_view(shape, t)
            function(out=bindable(out), input=bindable(a), other=bindable(b), dim_stride=out.stride(dim),
                     threads=threads, group_size=16)
        else:
            a = a.transpose(0, 2).contiguous().transpose(0, 2)
            storage, out = sentinel_view(shape, t, order=(2, 0, 1), gap=2)
            others = [d for d in range(3) if d != dim]
            function(out=bindable(out), input=bindable(a), other=bindable(b),
                     squashed_sizes=[shape[d] for d in others], out_strides=out.stride(),
                     input_strides=a.stride(), other_strides=b.stride(), ndim=3, dim=dim,
                     threads=threads, group_size=16)
        aw, bw = (x.to(torch.int64) if is_integral(t) else x.to(wide(t)) for x in (a, b))
        expected = torch.linalg.cross(aw, bw, dim=dim)
        # Each component is a difference of two products rounded in T (``mul(x, y) -
        # mul(x, y)``, CrossKernel.metal), which cancels: errors of a few ulps of the
        # operands' scale, not of the result's.
        problem = _compare(storage, out, expected, "copy" if is_integral(t) else "math")
        if problem:
            return "wrong", f"along {dim}: {problem}"
    return "correct", ""


def check(function, device: str) -> Tuple[str, str]:
    parsed = parse(function.name)
    if parsed is None:
        raise NoHarness("not a pointwise kernel")
    if device != "cpu":
        raise NoHarness("the pointwise harness builds CPU tensors only")
    op, *rest = parsed
    if op == "clamp":
        variant, cast, _, t = rest
        return check_clamp(function, variant, bool(cast), METAL_DTYPES[t])
    if op in _ALPHA_OPS:
        variant, to, ti, _, ta = rest
        return check_alpha(function, op, variant, METAL_DTYPES[to], METAL_DTYPES[ti], METAL_DTYPES[ta])
    if op == "lerp_tensor":
        return check_lerp(function, rest[0], METAL_DTYPES[rest[1]])
    if op == "cross":
        return check_cross(function, rest[0], METAL_DTYPES[rest[1]])
    raise NoHarness(f"no harness for {op}")

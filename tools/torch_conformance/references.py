"""What each of PyTorch's elementwise Metal functors computes, as torch CPU ops.

An entry gives the reference (computed in float64, complex128 or int64 from the inputs'
exact values, then rounded to the output dtype), the inputs' domain and the tolerance
class. The functors are defined in PyTorch's ``aten/src/ATen/native/mps/kernels/*.metal``
and ``c10/metal/*.h``; the reference is the ATen op the host code dispatches to them.
"""

from dataclasses import dataclass
from typing import Callable, Optional

import torch

S = torch.special


@dataclass(frozen=True)
class Reference:
    fn: Callable            # wide tensors (and alpha) -> wide tensor
    arity: int              # tensor inputs
    tolerance: str = "exact"   # "exact": one rounding; "math": libm-grade; "special": series/recurrences
    domain: str = "any"     # "any", "positive", "unit" ([-1, 1]), "nonzero_rhs", "shift"
    alpha: Optional[float] = None   # the scalar the *_alpha and parameterized kernels take
    int_alpha: int = 2              # ... where the functor's type is an integer
    real_part_only: bool = False    # the kernel's imaginary part is not torch's (see its entry)
    params: Optional[Callable] = None   # (functor dtype, struct size) -> the struct ``alpha`` binds


def _elu_backward_params(dtype, size):
    """``ELUBackwardParams<T>``: alpha, scale, input_scale as T, then bool is_result."""
    raw = torch.tensor(_ELU_BACKWARD[:3], dtype=torch.float64).to(dtype).view(torch.uint8).numpy().tobytes()
    raw += bytes([int(_ELU_BACKWARD[3])])
    return raw + bytes(size - len(raw))


# alpha, scale, input_scale, is_result. is_result False: the functor's exp branch
# (``input_scale * alpha * scale * exp(self * input_scale)`` where self <= 0, ActivationKernel.metal).
_ELU_BACKWARD = (1.5, 1.25, 0.75, False)


def _gelu_tanh(x):
    return torch.nn.functional.gelu(x, approximate="tanh")


def _grad(fn):
    """d fn(x)/dx * grad, as the *_backward kernels compute (input = grad, other = self)."""
    def backward(grad, x):
        x = x.detach().to(torch.float64).requires_grad_(True)
        grad = grad.to(torch.float64)
        (g,) = torch.autograd.grad(fn(x), x, grad)
        return g
    return backward


def _logaddexp(a, b):
    """torch.logaddexp, except that PyTorch's Metal kernel for complex values returns
    b + log(2) wherever the real parts are equal (an Apple GPU runs the same AIR: for
    (-1.2344-1.0195j, -1.2344+0.6655j) it gives -0.5413+0.6655j, torch -0.9483-0.1770j)."""
    result = torch.logaddexp(a, b)
    if a.is_complex():
        result = torch.where(a.real == b.real, b + torch.log(torch.tensor(2.0, dtype=torch.float64)).to(b.dtype),
                             result)
    return result


def _xlog1py(a, b):
    return S.xlog1py(a, b)


UNARY = {
    # abs of a complex writes |z| (hypot) to both halves; torch's host keeps the real part.
    "abs": Reference(lambda x: torch.abs(x).to(x.dtype), 1, real_part_only=True), "neg": Reference(torch.neg, 1),
    "copy_identity": Reference(lambda x: x, 1), "copy_neg": Reference(torch.neg, 1),
    "copy_conj": Reference(torch.conj_physical, 1),
    "copy_conj_neg": Reference(lambda x: torch.neg(torch.conj_physical(x)), 1),
    "sqr": Reference(lambda x: x * x, 1), "relu": Reference(torch.relu, 1),
    "bitwise_not": Reference(torch.bitwise_not, 1),
    "round": Reference(torch.round, 1),
    "reciprocal": Reference(torch.reciprocal, 1, "math"),
    "sqrt": Reference(torch.sqrt, 1, "math"), "rsqrt": Reference(torch.rsqrt, 1, "math"),
    "exp": Reference(torch.exp, 1, "math"), "exp2": Reference(torch.exp2, 1, "math"),
    "expm1": Reference(torch.expm1, 1, "math"), "log": Reference(torch.log, 1, "math"),
    "log10": Reference(torch.log10, 1, "math"), "log1p": Reference(torch.log1p, 1, "math"),
    "log2": Reference(torch.log2, 1, "math"), "sin": Reference(torch.sin, 1, "math"),
    "cos": Reference(torch.cos, 1, "math"), "tan": Reference(torch.tan, 1, "math"),
    "asin": Reference(torch.asin, 1, "math", "unit"), "acos": Reference(torch.acos, 1, "math", "unit"),
    "atan": Reference(torch.atan, 1, "math"), "sinh": Reference(torch.sinh, 1, "math"),
    "cosh": Reference(torch.cosh, 1, "math"), "tanh": Reference(torch.tanh, 1, "math"),
    "sigmoid": Reference(torch.sigmoid, 1, "math"), "silu": Reference(torch.nn.functional.silu, 1, "math"),
    "sinc": Reference(torch.sinc, 1, "math"), "angle": Reference(torch.angle, 1, "math"),
    "gelu": Reference(torch.nn.functional.gelu, 1, "math"), "gelu_tanh": Reference(_gelu_tanh, 1, "math"),
    "hardsigmoid": Reference(torch.nn.functional.hardsigmoid, 1),
    "hardswish": Reference(torch.nn.functional.hardswish, 1),
    "erf": Reference(torch.erf, 1, "math"), "erfc": Reference(torch.erfc, 1, "math"),
    "erfinv": Reference(torch.erfinv, 1, "math", "unit"), "erfcx": Reference(S.erfcx, 1, "special"),
    "lgamma": Reference(torch.lgamma, 1, "special"), "digamma": Reference(torch.digamma, 1, "special"),
    "trigamma": Reference(lambda x: torch.polygamma(1, x), 1, "special"),
    "entr": Reference(S.entr, 1, "math"), "i0": Reference(torch.i0, 1, "special"),
    "i0e": Reference(S.i0e, 1, "special"), "i1": Reference(S.i1, 1, "special"),
    "i1e": Reference(S.i1e, 1, "special"),
    "bessel_j0_forward": Reference(S.bessel_j0, 1, "special"),
    "bessel_j1_forward": Reference(S.bessel_j1, 1, "special"),
    "bessel_y0_forward": Reference(S.bessel_y0, 1, "special"),
    "bessel_y1_forward": Reference(S.bessel_y1, 1, "special"),
    "modified_bessel_i0_forward": Reference(S.modified_bessel_i0, 1, "special"),
    "modified_bessel_i1_forward": Reference(S.modified_bessel_i1, 1, "special"),
    "modified_bessel_k0_forward": Reference(S.modified_bessel_k0, 1, "special"),
    "modified_bessel_k1_forward": Reference(S.modified_bessel_k1, 1, "special"),
    "scaled_modified_bessel_k0_forward": Reference(S.scaled_modified_bessel_k0, 1, "special"),
    "scaled_modified_bessel_k1_forward": Reference(S.scaled_modified_bessel_k1, 1, "special"),
    "spherical_bessel_j0": Reference(S.spherical_bessel_j0, 1, "special"),
    # Parameterized unary kernels: the scalar is the kernel's `alpha`.
    "hardshrink": Reference(lambda x, a: torch.nn.functional.hardshrink(x, a), 1, alpha=0.5),
    "softshrink": Reference(lambda x, a: torch.nn.functional.softshrink(x, a), 1, alpha=0.5),
    "leaky_relu": Reference(lambda x, a: torch.nn.functional.leaky_relu(x, a), 1, alpha=0.1),
}

BINARY = {
    "add": Reference(torch.add, 2), "sub": Reference(torch.sub, 2), "mul": Reference(torch.mul, 2),
    "div_true": Reference(torch.true_divide, 2, "exact", "nonzero_rhs"),
    # Floats: the quotient rounded to the type computed in, then floored or truncated.
    "div_floor": Reference(lambda a, b: torch.floor(a / b) if a.is_floating_point() else
                           torch.div(a, b, rounding_mode="floor"), 2, "exact", "nonzero_rhs"),
    "div_trunc": Reference(lambda a, b: torch.trunc(a / b) if a.is_floating_point() else
                           torch.div(a, b, rounding_mode="trunc"), 2, "exact", "nonzero_rhs"),
    "remainder": Reference(torch.remainder, 2, "exact", "nonzero_rhs"),
    "fmod": Reference(torch.fmod, 2, "exact", "nonzero_rhs"),
    "maximum": Reference(torch.maximum, 2), "minimum": Reference(torch.minimum, 2),
    "fmax": Reference(torch.fmax, 2), "fmin": Reference(torch.fmin, 2),
    "copysign": Reference(torch.copysign, 2), "nextafter": Reference(torch.nextafter, 2),
    "atan2": Reference(torch.atan2, 2, "math"), "hypot": Reference(torch.hypot, 2, "math"),
    "logaddexp": Reference(_logaddexp, 2, "math"), "logaddexp2": Reference(torch.logaddexp2, 2, "math"),
    "xlogy": Reference(torch.xlogy, 2, "math"), "xlog1py": Reference(_xlog1py, 2, "math"),
    "igamma": Reference(torch.igamma, 2, "special", "positive"),
    "igammac": Reference(torch.igammac, 2, "special", "positive"),
    "zeta": Reference(S.zeta, 2, "special", "positive"),
    "eq": Reference(torch.eq, 2), "ne": Reference(torch.ne, 2), "lt": Reference(torch.lt, 2),
    "le": Reference(torch.le, 2), "gt": Reference(torch.gt, 2), "ge": Reference(torch.ge, 2),
    "bitwise_and": Reference(torch.bitwise_and, 2), "bitwise_or": Reference(torch.bitwise_or, 2),
    "bitwise_xor": Reference(torch.bitwise_xor, 2),
    "bitwise_left_shift": Reference(torch.bitwise_left_shift, 2, "exact", "shift"),
    "bitwise_right_shift": Reference(torch.bitwise_right_shift, 2, "exact", "shift"),
    "gcd": Reference(torch.gcd, 2), "lcm": Reference(torch.lcm, 2),
    "chebyshev_polynomial_t": Reference(S.chebyshev_polynomial_t, 2, "special", "polynomial"),
    "chebyshev_polynomial_u": Reference(S.chebyshev_polynomial_u, 2, "special", "polynomial"),
    "chebyshev_polynomial_v": Reference(S.chebyshev_polynomial_v, 2, "special", "polynomial"),
    "chebyshev_polynomial_w": Reference(S.chebyshev_polynomial_w, 2, "special", "polynomial"),
    "shifted_chebyshev_polynomial_t": Reference(S.shifted_chebyshev_polynomial_t, 2, "special", "polynomial"),
    "shifted_chebyshev_polynomial_u": Reference(S.shifted_chebyshev_polynomial_u, 2, "special", "polynomial"),
    "shifted_chebyshev_polynomial_v": Reference(S.shifted_chebyshev_polynomial_v, 2, "special", "polynomial"),
    "shifted_chebyshev_polynomial_w": Reference(S.shifted_chebyshev_polynomial_w, 2, "special", "polynomial"),
    "hermite_polynomial_h": Reference(S.hermite_polynomial_h, 2, "special", "polynomial"),
    "hermite_polynomial_he": Reference(S.hermite_polynomial_he, 2, "special", "polynomial"),
    "make_complex": Reference(torch.complex, 2),
    "polar": Reference(torch.polar, 2, "math", "positive"),
    "elu_backward": Reference(lambda g, x: torch.ops.aten.elu_backward(g, *_ELU_BACKWARD, x), 2, "math",
                              params=_elu_backward_params),
    "gelu_backward": Reference(_grad(torch.nn.functional.gelu), 2, "math"),
    "gelu_tanh_backward": Reference(_grad(_gelu_tanh), 2, "math"),
    "silu_backward": Reference(_grad(torch.nn.functional.silu), 2, "math"),
    "hardsigmoid_backward": Reference(_grad(torch.nn.functional.hardsigmoid), 2),
    "hardswish_backward": Reference(_grad(torch.nn.functional.hardswish), 2, "math"),
    # Kernels with a scalar `alpha`.
    "add_alpha": Reference(lambda a, b, s: a + s * b, 2, alpha=2),
    "sub_alpha": Reference(lambda a, b, s: a - s * b, 2, alpha=2),
    "lerp_alpha": Reference(lambda a, b, s: torch.lerp(a, b, s), 2, "math", alpha=0.25),
    # The 2.13 kernel takes self first: out = input > 0 ? other : other * alpha (its AIR:
    # `fcmp ogt %input, 0; select ..., %other, %other * %alpha`).
    "leaky_relu_backward": Reference(
        lambda x, g, s: torch.where(x > 0, g, g * s), 2, alpha=0.1),
    "shrink_backward": Reference(
        lambda g, x, s: torch.where((x >= -s) & (x <= s), torch.zeros_like(g), g), 2, alpha=0.5),
}

"""Kernel output against the reference, with a tolerance per dtype and reference class."""

from typing import Optional

import torch

from .dtypes import is_complex, is_integral

# Multiples of the output dtype's epsilon: "exact" is one correct rounding each side,
# "math" Metal's precise-math bound (a few ULP), "special" series and recurrences,
# "accumulated" sums of up to 16 terms added in the output's own dtype by atomic adds, in
# an order the GPU chooses (each add rounds to half or bfloat: one half ulp of the running
# sum per term).
_ULPS = {"exact": 2, "math": 16, "special": 1024, "accumulated": 16}


def mismatch(actual: torch.Tensor, expected_wide: torch.Tensor, tolerance: str,
             half_complex: bool = False) -> Optional[str]:
    """None when `actual` matches the wide reference rounded to `actual`'s dtype; else why.

    `half_complex`: PyTorch's complex-half functors compute |z|^2 and other intermediates in
    half (``sqrt_dense_scalar_half2_half2``: ``fmul half``, ``llvm.fmuladd.f16``, then
    ``sqrt((|z| - x) / 2)`` unclamped), so a result torch computes as finite can be NaN on
    an Apple GPU: a non-finite result is accepted there, finite ones are compared within 64
    half ulps of the operands' scale, up to the sign of each part (branch cuts)."""
    dtype = actual.dtype
    expected = expected_wide.to(dtype)
    if is_integral(dtype):
        a, e = actual.to(torch.int64).flatten(), expected.to(torch.int64).flatten()
        bad = (a != e).nonzero().flatten()
        if len(bad) == 0:
            return None
        i = int(bad[0])
        return f"{len(bad)} of {a.numel()} differ; first at {i}: got {int(a[i])}, expected {int(e[i])}"
    if is_complex(dtype):
        actual = torch.view_as_real(actual.to(torch.complex64))
        expected = torch.view_as_real(expected.to(torch.complex64))
        dtype = torch.float16 if dtype == torch.complex32 else torch.float32
    a, e = actual.double().flatten(), expected.double().flatten()
    eps = torch.finfo(dtype).eps
    ulps = _ULPS[tolerance]
    # Half and bfloat results are computed in float and rounded once.
    if dtype in (torch.float16, torch.bfloat16) and tolerance != "accumulated":
        ulps = min(ulps, 2 if tolerance == "exact" else 4)
    if half_complex:
        ulps = 64  # half-precision intermediates: errors of many half ulps
    # Beyond one rounding, errors are relative to the operands' scale (about 1 here), not to
    # a result that cancellation made small: an absolute floor of the same number of ulps.
    close = (a - e).abs() <= ulps * eps * (e.abs() + (0 if tolerance == "exact" else 1))
    same = (a == e) | (a.isnan() & e.isnan()) | close
    if half_complex:
        # ... and a value on the other side of a branch cut (asin of -1.5811-0.0058j: the
        # kernel's half intermediates give +1.5635-1.0312j, torch -1.5661-1.0317j).
        same |= ~a.isfinite() | ((a.abs() - e.abs()).abs() <= ulps * eps * (e.abs() + 1))
    bad = (~same).nonzero().flatten()
    if len(bad) == 0:
        return None
    i = int(bad[0])
    worst = int(((a - e).abs() / (e.abs() + 1e-30)).nan_to_num(float("inf")).argmax())
    return (f"{len(bad)} of {a.numel()} differ beyond {ulps} ulp; first at {i}: got {a[i].item()!r}, "
            f"expected {e[i].item()!r}; worst at {worst}: got {a[worst].item()!r}, expected {e[worst].item()!r}")

"""PyTorch's layer norm kernels (LayerNorm.metal): ``layer_norm_{single_row,looped}_T``.

One threadgroup per row of ``axis_size`` elements, each thread reading 4 at a time;
``single_row`` covers the row in one pass (ceil(axis / 4) threads, at most 1,024), ``looped``
strides over it. The looped kernel's second reduction reads all 32 per-SIMD-group slots, so
the host launches it with 1,024 threads (fewer would read slots no SIMD-group wrote). Both
accumulate in float and write the mean and 1/sqrt(var + eps) per row, the variance clamped
to 0 below 1e-6.
"""

import re
from typing import Optional, Tuple

import torch

from .compare import mismatch
from .dtypes import METAL_DTYPES
from .inputs import generator, values

DEVICES = ("cpu", "cuda")  # its tensors are placed on the device checked

_NAME = re.compile(r"^layer_norm_(single_row|looped)_(float|half|bfloat)$")
_EPS = 1e-5


def parse(name: str) -> Optional[Tuple[str, torch.dtype]]:
    match = _NAME.match(name)
    return (match.group(1), METAL_DTYPES[match.group(2)]) if match else None


def check(function, device: str) -> Tuple[str, str]:
    scheme, dtype = parse(function.name)
    gen = generator(function.name)
    shapes = [(5, 64), (3, 1000), (2, 4093)] if scheme == "single_row" else [(4, 4096), (3, 10001), (2, 37)]
    for rows, axis in shapes:
        for affine in (False, True):
            x = values(rows * axis, dtype, "any", gen).reshape(rows, axis)
            weight, bias = values(axis, dtype, "any", gen), values(axis, dtype, "any", gen)
            out = torch.zeros(rows, axis, dtype=dtype, device=device)
            mean, rstd = torch.zeros(rows, dtype=dtype, device=device), torch.zeros(rows, dtype=dtype, device=device)
            group = min(1024, -(-(-(-axis // 4)) // 32) * 32) if scheme == "single_row" else 1024
            function(x.to(device), out, mean, rstd, axis, _EPS, int(affine), int(affine),
                     weight.to(device), bias.to(device), threads=rows * group, group_size=group)
            w = x.double()
            want_mean = w.mean(dim=1)
            var = (w * w).mean(dim=1) - want_mean * want_mean
            var = torch.where(var < 1e-6, torch.zeros_like(var), var)
            want_rstd = torch.rsqrt(var + _EPS)
            want = (w - want_mean[:, None]) * want_rstd[:, None]
            if affine:
                want = want * weight.double() + bias.double()
            for name, got, expected in (("output", out, want), ("mean", mean, want_mean), ("rstd", rstd, want_rstd)):
                problem = mismatch(got.cpu().flatten(), expected.flatten(), "special")
                if problem:
                    return "wrong", f"[{rows}, {axis}] affine={affine} {name}: {problem}"
    return "correct", ""

"""PyTorch's RMS norm (RMSNorm.metal), general p-norm (ReduceOps.metal ``norm_TI_TO``) and renorm
factor (RenormKernel.metal) kernels, as the host calls them.

* ``rms_norm_T`` / ``rms_norm_looped_T``: one threadgroup per row of ``axis_size`` contiguous
  elements (torch 2.13 reflects ``gid`` as ``threadgroup_position_in_grid``; the stored
  source's instantiation still says ``thread_position_in_grid``), 4 per thread;
  ``single_row`` with ceil(axis / 4) threads rounded up to 32 (at most 1,024), ``looped``
  with 1,024. ``out = w[w_stride * i] * T(x * rsqrt(mean(x^2) + eps))``: the normalised
  value rounded to T before the multiply by the weight (the reference does the same).
* ``norm_TI_TO`` (``NormParams``: p, reduction_size, ndim, input/output sizes and strides):
  one threadgroup per output element, reduced dimensions = those whose input and output sizes
  differ; p = 0 (count of non-zeros), 1, 2, inf, -inf and any other p (pow); complex
  (float2/half2) inputs by modulus. Reference ``torch.linalg.vector_norm`` in float64.
* ``renorm_T``: ``factor[i] = norm[i] > maxnorm ? T(maxnorm / (norm[i] + T(1e-7))) : 1``, one
  thread per element, against torch.renorm's factor in float64.
"""

import math
import re
from typing import Optional, Tuple

import torch

from .buffers import sentinel_view, untouched
from .compare import mismatch
from .dtypes import METAL_DTYPES, is_complex
from .inputs import generator, values
from .reductions import _norm_params

_RMS = re.compile(r"^rms_norm_(looped_)?(float|half|bfloat)$")
_NORM = re.compile(r"^norm_(float2|half2|float|half|bfloat)_(float|half|bfloat)$")
_RENORM = re.compile(r"^renorm_(float|half|bfloat)$")
_EPS = 1e-6
_GROUP = 256


def parse(name: str) -> Optional[Tuple]:
    match = _RMS.match(name)
    if match:
        return "rms_norm", "looped" if match.group(1) else "single_row", METAL_DTYPES[match.group(2)]
    match = _NORM.match(name)
    if match:
        return "norm", METAL_DTYPES[match.group(1)], METAL_DTYPES[match.group(2)]
    match = _RENORM.match(name)
    if match:
        return "renorm", METAL_DTYPES[match.group(1)]
    return None


def _rms(function, scheme, t, gen):
    shapes = [(5, 64), (3, 1000), (2, 4094)] if scheme == "single_row" else [(3, 4096), (2, 10001), (2, 37)]
    for rows, axis in shapes:
        for w_stride in (1, 2):
            x = values(rows * axis, t, "any", gen).reshape(rows, axis)
            w_storage = values(axis * w_stride, t, "any", gen)
            w = w_storage[::w_stride]
            storage, out = sentinel_view((rows, axis), t)
            group = min(1024, -(-(-(-axis // 4)) // 32) * 32) if scheme == "single_row" else 1024
            function(x, w_storage, out, _EPS, axis, w_stride, threads=rows * group, group_size=group)
            xd = x.double()
            inv = torch.rsqrt((xd * xd).mean(dim=1, keepdim=True) + _EPS)
            want = w.double() * (xd * inv).to(t).double()
            label = f"[{rows}, {axis}] w_stride={w_stride}"
            if not untouched(storage, out):
                return "wrong", f"{label}: wrote outside its output"
            problem = mismatch(out.flatten(), want.flatten(), "special")
            if problem:
                return "wrong", f"{label}: {problem}"
    return "correct", ""


def _norm(function, ti, to, gen):
    for sizes, dims in (((37, 300), (1,)), ((300, 45), (0,)), ((6, 7, 40), (0, 2))):
        for p in (2.0, 1.0, 0.0, math.inf, -math.inf, 3.0, 0.5):
            count = math.prod(sizes)
            x = values(count, ti, "any", gen).reshape(sizes)
            if not is_complex(ti):
                x.view(-1)[::5] = 0  # p = 0 counts non-zeros
            given = torch.view_as_real(x) if is_complex(ti) else x
            out_sizes = [1 if d in dims else s for d, s in enumerate(sizes)]
            out_count = math.prod(out_sizes)
            out_strides, step = [], 1
            for s in reversed(out_sizes):
                out_strides.insert(0, step)
                step *= s
            reduced = math.prod(sizes[d] for d in dims)
            params = _norm_params(p, reduced, sizes, list(x.stride()), out_sizes, out_strides)
            storage, out = sentinel_view((out_count,), to)
            function(given, out, params, threads=out_count * _GROUP, group_size=_GROUP)
            wide = x.to(torch.complex128) if is_complex(ti) else x.double()
            want = torch.linalg.vector_norm(wide, ord=p, dim=dims).flatten()
            label = f"{list(sizes)} over {list(dims)} p={p}"
            if not untouched(storage, out):
                return "wrong", f"{label}: wrote outside its output"
            problem = mismatch(out, want, "special")
            if problem:
                return "wrong", f"{label}: {problem}"
    return "correct", ""


def _renorm(function, t, gen):
    norm = (torch.rand(300, generator=gen, dtype=torch.float64) * 4).to(t)
    norm[:3] = torch.tensor([0.0, 1.5, 2.0])  # at and below maxnorm
    maxnorm = 1.5
    storage, factor = sentinel_view((300,), t)
    function(norm, factor, maxnorm, threads=300, group_size=64)
    nd = norm.double()
    eps = torch.tensor(1e-7, dtype=t).double()  # the kernel's T(1e-7)
    want = torch.where(nd > maxnorm, maxnorm / (nd + eps), torch.ones_like(nd))
    if not untouched(storage, factor):
        return "wrong", "wrote outside its output"
    problem = mismatch(factor, want, "special")
    return ("wrong", problem) if problem else ("correct", "")


def check(function, device: str) -> Tuple[str, str]:
    if device != "cpu":
        raise NotImplementedError("CPU tensors only")
    parsed = parse(function.name)
    gen = generator(function.name)
    if parsed[0] == "rms_norm":
        return _rms(function, parsed[1], parsed[2], gen)
    if parsed[0] == "norm":
        return _norm(function, parsed[1], parsed[2], gen)
    return _renorm(function, parsed[1], gen)

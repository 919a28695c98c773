"""PyTorch's group norm kernels (GroupNorm.metal), as GroupNorm.mm calls them.

* ``group_norm_<T>_<stat>_<gamma>_<beta>_<idx>``: one threadgroup per (batch, group)
  (``dispatchThreadgroups(N * G)``), each thread reading BLOCK_SIZE = 4 elements at a time:
  ``min(1024, 32 * ceil(ceil(elements_per_group / 4) / 32))`` threads. Writes Y, and the
  mean and ``precise::rsqrt(var + eps)`` per group, var = E[x^2] - mean^2 in float. A
  ``void`` gamma or beta is 1 or 0.
* ``group_norm_backward_x_<T>_<stat>_<gamma>_<idx>``: same grid; dX from dY, X and the
  given mean and rstd.
* ``group_norm_backward_affine_<T>_<stat>_<affine>_<idx>``: one threadgroup per channel,
  threads from N * HxW; dgamma = sum(dY (X - mean) rstd), dbeta = sum(dY).

``GroupNormParams<idx_T>``: HxW, num_groups, channels_per_group, elements_per_group, C,
N_times_HxW (idx_T each), eps (float). The references are torch's ``native_group_norm``
and ``native_group_norm_backward`` in float64, given the same (rounded) mean and rstd.
"""

import re
from typing import Optional, Tuple

import torch

from .buffers import sentinel_view, untouched
from .compare import mismatch
from .dtypes import METAL_DTYPES
from .inputs import generator, values
from .structs import argument, pack

_T = r"(float|half|bfloat|void)"
_NAME = re.compile(rf"^group_norm(?:_(backward_x|backward_affine))?_{_T}_{_T}_{_T}(?:_{_T})?_(uint32_t|uint64_t)$")
_EPS = 1e-5
_BLOCK = 4
# (N, C, HxW, groups): a partial first SIMD-group, several, and more than 1,024 threads' worth.
_CASES = [(2, 6, 5, 3), (3, 8, 70, 2), (1, 4, 1300, 1)]


def parse(name: str) -> Optional[Tuple]:
    match = _NAME.match(name)
    if not match:
        return None
    kind = match.group(1) or "forward"
    types = [None if t in ("void", None) else METAL_DTYPES[t] for t in match.groups()[1:5]]
    if (kind == "forward") != (match.group(5) is not None):
        return None
    return ("group_norm_" + kind if kind != "forward" else "group_norm", kind, *types)


def _threads(elements: int) -> int:
    blocks = -(-elements // _BLOCK)
    return min(1024, 32 * (-(-blocks // 32)))


def _wide(t):
    return None if t is None else t.double()


def check(function, device: str) -> Tuple[str, str]:
    if device != "cpu":
        raise NotImplementedError("CPU tensors only")
    _, kind, t, stat, a, b = parse(function.name)
    gen = generator(function.name)
    params_arg = argument(function, "params")
    for n, c, hw, g in _CASES:
        x = values(n * c * hw, t, "any", gen).reshape(n, c, hw)
        common = dict(HxW=hw, num_groups=g, channels_per_group=c // g, elements_per_group=c // g * hw,
                      C=c, N_times_HxW=n * hw, eps=_EPS)
        label = f"N={n} C={c} HxW={hw} G={g}"
        if kind == "forward":
            gamma = values(c, a, "any", gen) if a is not None else None
            beta = values(c, b, "any", gen) if b is not None else None
            ys, y = sentinel_view((n, c, hw), t)
            ms, mean = sentinel_view((n * g,), stat)
            rs, rstd = sentinel_view((n * g,), stat)
            group = _threads(c // g * hw)
            function(y, mean, rstd, x, gamma, beta, pack(params_arg, common),
                     threads=n * g * group, group_size=group)
            want_y, want_mean, want_rstd = torch.native_group_norm(
                x.double(), _wide(gamma), _wide(beta), n, c, hw, g, _EPS)
            checks = [("Y", ys, y, want_y), ("mean", ms, mean, want_mean.flatten()),
                      ("rstd", rs, rstd, want_rstd.flatten())]
        else:
            dy = values(n * c * hw, t, "any", gen).reshape(n, c, hw)
            _, m64, r64 = torch.native_group_norm(x.double(), None, None, n, c, hw, g, _EPS)
            mean, rstd = m64.flatten().to(stat), r64.flatten().to(stat)
            if kind == "backward_x":
                gamma = values(c, a, "any", gen) if a is not None else None
                xs, dx = sentinel_view((n, c, hw), t)
                group = _threads(c // g * hw)
                function(dx, dy, x, mean, rstd, gamma, pack(params_arg, common),
                         threads=n * g * group, group_size=group)
                want_dx, _, _ = torch.ops.aten.native_group_norm_backward(
                    dy.double(), x.double(), mean.double().reshape(n, g), rstd.double().reshape(n, g),
                    _wide(gamma), n, c, hw, g, [True, False, False])
                checks = [("dX", xs, dx, want_dx)]
            else:
                gs, dgamma = sentinel_view((c,), a)
                bs, dbeta = sentinel_view((c,), a)
                group = _threads(n * hw)
                function(dgamma, dbeta, dy, x, mean, rstd, pack(params_arg, common),
                         threads=c * group, group_size=group)
                _, want_dg, want_db = torch.ops.aten.native_group_norm_backward(
                    dy.double(), x.double(), mean.double().reshape(n, g), rstd.double().reshape(n, g),
                    torch.ones(c, dtype=torch.float64), n, c, hw, g, [False, True, True])
                checks = [("dgamma", gs, dgamma, want_dg), ("dbeta", bs, dbeta, want_db)]
        for name, storage, got, want in checks:
            if not untouched(storage, got):
                return "wrong", f"{label} {name}: wrote outside its output"
            # Y and dX: within 16 ulps of their scale (an eps 10x off in the reference is
            # caught). dgamma sums N * HxW products of size ~16 in float that cancel to ~3:
            # errors of tens of ulps of the result (backward_affine_float_float_float_uint64_t,
            # 1,300 terms: 3.455484 against 3.455512), so "special" there.
            problem = mismatch(got.flatten(), want.flatten(), "special" if name == "dgamma" else "math")
            if problem:
                return "wrong", f"{label} {name}: {problem}"
    return "correct", ""

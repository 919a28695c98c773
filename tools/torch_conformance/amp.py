"""PyTorch's mixed-precision helpers (Amp.metal): ``ampUpdateScale_T``,
``ampNonFiniteCheckAndUnscaleSingle_T`` and ``ampNonFiniteCheckAndUnscale_T``.

* UpdateScale (one thread): with ``foundInf`` set, ``scale *= backoff`` and the growth
  tracker restarts; else the tracker counts up and, at ``growthInterval``, ``scale *= growth``.
* NonFiniteCheckAndUnscale: every element becomes ``val * invScale`` (a float, in torch 2.13)
  unless ``invScale`` is 1, and ``foundInf`` becomes 1 if any element is not finite. The
  multi-tensor form takes an argument buffer of up to 32 data pointers and a
  ``MetadataArguments`` struct (numels, threadgroup -> tensor, threadgroup -> chunk of 65,536
  elements), one threadgroup per chunk.
Compared with torch's ``_amp_update_scale_`` and ``_amp_foreach_non_finite_check_and_unscale_``.
"""

import re
import struct
from typing import Optional, Tuple

import torch

from .compare import mismatch
from .dtypes import METAL_DTYPES
from .inputs import generator, values

_NAME = re.compile(r"^amp(UpdateScale|NonFiniteCheckAndUnscaleSingle|NonFiniteCheckAndUnscale)_(float|half|bfloat)$")
_CHUNK = 65536


def parse(name: str) -> Optional[Tuple[str, torch.dtype]]:
    match = _NAME.match(name)
    return (f"amp{match.group(1)}", METAL_DTYPES[match.group(2)]) if match else None


def _update_scale(function, dtype) -> Optional[str]:
    for found, tracker in ((0.0, 0), (0.0, 2), (1.0, 2)):
        scale, growth = torch.tensor([8.0], dtype=dtype), torch.tensor([tracker], dtype=torch.int32)
        found_inf = torch.tensor([found])
        function(scale, growth, found_inf, 2.0, 0.5, 3, threads=1)
        want_scale, want_growth = torch.tensor([8.0]), torch.tensor([tracker], dtype=torch.int32)
        torch._amp_update_scale_(want_scale, want_growth, found_inf, 2.0, 0.5, 3)
        if scale.item() != want_scale.item() or growth.item() != want_growth.item():
            return (f"found_inf {found}, tracker {tracker}: got scale {scale.item()}, tracker {growth.item()}; "
                    f"expected {want_scale.item()}, {want_growth.item()}")
    return None


def _unscale(function, dtype, single: bool, name: str) -> Optional[str]:
    gen = generator(name)
    sizes = (1003,) if single else (70001, 1003)
    for inv_scale, poison in ((0.25, False), (0.25, True), (1.0, True)):
        data = [values(n, dtype, "any", gen) for n in sizes]
        if poison:
            data[-1][17] = float("inf")
        want = [d.clone().float() for d in data]
        want_found = torch.zeros(1)
        torch._amp_foreach_non_finite_check_and_unscale_(want, want_found, torch.tensor([inv_scale]))
        found = torch.zeros(1)
        if single:
            function(data[0], found, inv_scale, threads=sizes[0])
        else:
            groups = [(t, c) for t, n in enumerate(sizes) for c in range(-(-n // _CHUNK))]
            numels = list(sizes) + [0] * (32 - len(sizes))
            to_tensor = [t for t, _ in groups] + [0] * (32 - len(groups))
            to_chunk = [c for _, c in groups] + [0] * (32 - len(groups))
            metadata = struct.pack("<96Q", *numels, *to_tensor, *to_chunk)
            function({"data": data}, metadata, found, inv_scale, threads=len(groups) * 256, group_size=256)
        if found.item() != want_found.item():
            return f"invScale {inv_scale}, non-finite {poison}: foundInf {found.item()}, expected {want_found.item()}"
        for got, expected in zip(data, want):
            problem = mismatch(got, expected.double(), "exact")
            if problem:
                return f"invScale {inv_scale}: {problem}"
    return None


def check(function, device: str) -> Tuple[str, str]:
    op, dtype = parse(function.name)
    if op == "ampUpdateScale":
        problem = _update_scale(function, dtype)
    else:
        problem = _unscale(function, dtype, op.endswith("Single"), function.name)
    return ("wrong", problem) if problem else ("correct", "")

"""PyTorch's grid sampler kernels (GridSampler.metal), as GridSampler.mm calls them.

* ``grid_sampler_2d_<interp>_<padding>_<i32|i64>_<T>``: one thread per output position
  (n, h, w), looping over channels; ``GridSamplerParams<4>``: sampler_dims, then the
  sizes and strides (in elements) of output, input and grid, and align_corners. ``i32``
  packs them as int, ``i64`` as long.
* ``grid_sampler_3d_<interp>_<padding>_<idx>_<T>``: one thread per output element
  (n, c, d, h, w), ``GridSamplerParams<5>``.

Coordinates reach beyond [-1, 1] so that every padding mode is exercised. The reference
is ``torch.grid_sampler`` in float64 on the same (rounded) input and grid.
"""

import math
import re
from typing import Optional, Tuple

import torch

from .buffers import sentinel_view, untouched
from .compare import mismatch
from .dtypes import METAL_DTYPES
from .inputs import generator, values
from .structs import argument, pack

_NAME = re.compile(r"^grid_sampler_(2d|3d)_(bilinear|nearest|bicubic)_(zeros|border|reflection)_(i32|i64)_(float|half|bfloat)$")
_INTERP = {"bilinear": 0, "nearest": 1, "bicubic": 2}
_PAD = {"zeros": 0, "border": 1, "reflection": 2}


def parse(name: str) -> Optional[Tuple]:
    match = _NAME.match(name)
    if not match:
        return None
    dims, interp, pad, idx, t = match.groups()
    return f"grid_sampler_{dims}", int(dims[0]), interp, pad, METAL_DTYPES[t]


def check(function, device: str) -> Tuple[str, str]:
    if device != "cpu":
        raise NotImplementedError("CPU tensors only")
    _, dims, interp, pad, t = parse(function.name)
    gen = generator(function.name)
    params_arg = argument(function, "params")
    cases = [((2, 3, 5, 7), (2, 4, 6)), ((1, 2, 9, 4), (1, 11, 3))] if dims == 2 else \
        [((2, 3, 4, 5, 6), (2, 3, 4, 5)), ((1, 2, 3, 7, 2), (1, 2, 5, 3))]
    for in_shape, grid_shape in cases:
        for align in (False, True):
            x = values(math.prod(in_shape), t, "any", gen).reshape(in_shape)
            grid = (torch.rand(*grid_shape, dims, generator=gen, dtype=torch.float64) * 2.6 - 1.3).to(t)
            out_shape = in_shape[:2] + grid_shape[1:]
            storage, out = sentinel_view(out_shape, t)
            params = pack(params_arg, dict(
                sampler_dims=dims, output_sizes=out.shape, output_strides=out.stride(),
                input_sizes=x.shape, input_strides=x.stride(), grid_sizes=grid.shape,
                grid_strides=grid.stride(), align_corners=align))
            threads = math.prod(grid_shape) if dims == 2 else math.prod(out_shape)
            function(out, x, grid, params, threads=threads, group_size=min(threads, 256))
            want = torch.grid_sampler(x.double(), grid.double(), _INTERP[interp], _PAD[pad], align)
            label = f"input {list(in_shape)} grid {list(grid_shape)} align_corners={align}"
            if not untouched(storage, out):
                return "wrong", f"{label}: wrote outside its output"
            # Source positions are computed in float ((coord + 1) * size - 1) / 2: an error of
            # an ulp of the position times the input's slope (up to 8 per pixel here), tens of
            # ulps of the result (grid_sampler_2d_bilinear_reflection_i32_float: 47 ulps).
            problem = mismatch(out.flatten(), want.flatten(), "special")
            if problem:
                return "wrong", f"{label}: {problem}"
    return "correct", ""

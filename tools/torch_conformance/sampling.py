"""PyTorch's grid sampler kernels (GridSampler.metal), as GridSampler.mm calls them.

* ``grid_sampler_2d_<interp>_<padding>_<i32|i64>_<T>``: one thread per output position
  (n, h, w), looping over channels; ``GridSamplerParams<4>``: sampler_dims, then the
  sizes and strides (in elements) of output, input and grid, and align_corners. ``i32``
  packs them as int, ``i64`` as long.
* ``grid_sampler_3d_<interp>_<padding>_<idx>_<T>``: one thread per output element
  (n, c, d, h, w), ``GridSamplerParams<5>``.

* ``grid_sampler_2d_backward_<bilinear|nearest>_<input|grid>_<idx>_<T>`` and
  ``grid_sampler_2d_backward_bicubic_<input|grid>_<padding>_<idx>_<T>``: one thread per
  output position (n, h, w). ``input`` kernels (grad_input, grad_output, grid, params)
  atomically add into grad_input (zeroed by the host; ``half``/``bfloat`` through a 32-bit
  compare-and-swap on the word holding the element); ``grid`` kernels (grad_grid,
  grad_output, input, grid, params) write grad_grid at ``tid * grad_grid_strides[2]``, so
  grad_grid is contiguous (N, H, W, 2).
* ``grid_sampler_3d_backward_<idx>_<T>``: grid (out_W, out_D * out_H, N); both gradients
  (``compute_grad_input``, ``compute_grad_grid``), interpolation bilinear or nearest at run
  time; grad_grid is indexed with the grid's last stride, so both are contiguous.
  ``GridSamplerBackwardParams<D>``: forward (``GridSamplerParams``), the strides of
  grad_output, grad_input and grad_grid, padding_mode, interpolation_mode, and the two
  flags; the interpolation and padding in the kernel's name, when there, win over them.

Coordinates reach beyond [-1, 1] so that every padding mode is exercised. The reference
is ``torch.grid_sampler`` in float64 on the same (rounded) input and grid, and for the
backward kernels its autograd gradients (input and grid) in float64 for the same
(rounded) grad_output.
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


_BACKWARD = re.compile(r"^grid_sampler_(?:2d_backward_(bilinear|nearest|bicubic)_(input|grid)(?:_(zeros|border|reflection))?"
                       r"|3d_backward)_(i32|i64)_(float|half|bfloat)$")


def parse(name: str) -> Optional[Tuple]:
    match = _NAME.match(name)
    if not match:
        back = _BACKWARD.match(name)
        if not back:
            return None
        interp, which, pad, idx, t = back.groups()
        if (interp == "bicubic") != (pad is not None):
            return None
        dims = 2 if interp else 3
        return f"grid_sampler_{dims}d_backward", dims, interp, which, pad, METAL_DTYPES[t]
    dims, interp, pad, idx, t = match.groups()
    return f"grid_sampler_{dims}", int(dims[0]), interp, pad, METAL_DTYPES[t]


def check(function, device: str) -> Tuple[str, str]:
    if device != "cpu":
        raise NotImplementedError("CPU tensors only")
    if "backward" in function.name:
        return _check_backward(function)
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


class _Nested:
    """A struct member packed as a struct of its own."""

    def __init__(self, field):
        self.type_size, self.struct_fields = field.size, field.fields


def _backward_params(function, forward, **rest) -> bytes:
    arg = argument(function, "params")
    out = bytearray(pack(arg, rest))
    field = next(f for f in arg.struct_fields if f.name == "forward")
    out[field.offset:field.offset + field.size] = pack(_Nested(field), forward)
    return bytes(out)


def _input_binding(storage: torch.Tensor, view: torch.Tensor) -> torch.Tensor:
    """grad_input as the kernel's atomic type: float binds as is; half and bfloat as the
    32-bit words that hold them (``metal::_atomic<uint>``), from the view's first element."""
    if view.dtype == torch.float32:
        return view
    assert view.storage_offset() % 2 == 0
    return storage[view.storage_offset():].view(torch.int32)


def _check_backward(function) -> Tuple[str, str]:
    _, dims, interp, which, pad_name, t = parse(function.name)
    gen = generator(function.name)
    cases = [((2, 3, 5, 7), (2, 4, 6)), ((1, 2, 9, 4), (1, 11, 3))] if dims == 2 else \
        [((2, 3, 4, 5, 6), (2, 3, 4, 5)), ((1, 2, 3, 7, 2), (1, 2, 5, 3))]
    # 3-D: one kernel for both interpolations and every padding, chosen in params.
    modes = [(interp, pad_name)] if interp == "bicubic" else \
        [(i, p) for i in ([interp] if interp else ["bilinear", "nearest"]) for p in _PAD]
    for interp_name, pad in modes:
        for in_shape, grid_shape in cases:
            for align in (False, True):
                x = values(math.prod(in_shape), t, "any", gen).reshape(in_shape)
                grid = (torch.rand(*grid_shape, dims, generator=gen, dtype=torch.float64) * 2.6 - 1.3).to(t)
                out_shape = in_shape[:2] + grid_shape[1:]
                gout = values(math.prod(out_shape), t, "any", gen).reshape(out_shape)
                # grad_input zeroed by the host; an even offset keeps half words aligned.
                in_storage, gin = sentinel_view(in_shape, t, initial=torch.zeros(in_shape, dtype=t))
                grid_storage, ggrid = sentinel_view(grid.shape, t,
                                                    initial=torch.zeros(grid.shape, dtype=t) if dims == 3 else None)
                forward = dict(sampler_dims=dims, output_sizes=gout.shape, output_strides=gout.stride(),
                               input_sizes=x.shape, input_strides=x.stride(), grid_sizes=grid.shape,
                               grid_strides=grid.stride(), align_corners=align)
                params = _backward_params(
                    function, forward, grad_output_strides=gout.stride(), grad_input_strides=gin.stride(),
                    grad_grid_strides=ggrid.stride(), padding_mode=_PAD[pad],
                    interpolation_mode=_INTERP[interp_name], compute_grad_input=True, compute_grad_grid=True)
                if dims == 3:
                    threads = (out_shape[4], out_shape[2] * out_shape[3], out_shape[0])
                    function(gout, x, grid, _input_binding(in_storage, gin), ggrid, params, threads=threads,
                             group_size=(min(threads[0], 8), min(threads[1], 8), 1))
                    outputs = [("grad_input", in_storage, gin), ("grad_grid", grid_storage, ggrid)]
                elif which == "input":
                    threads = math.prod(grid_shape)
                    function(_input_binding(in_storage, gin), gout, grid, params, threads=threads,
                             group_size=min(threads, 256))
                    outputs = [("grad_input", in_storage, gin)]
                else:
                    threads = math.prod(grid_shape)
                    function(ggrid, gout, x, grid, params, threads=threads, group_size=min(threads, 256))
                    outputs = [("grad_grid", grid_storage, ggrid)]
                xw = x.double().requires_grad_()
                gw = grid.double().requires_grad_()
                torch.grid_sampler(xw, gw, _INTERP[interp_name], _PAD[pad], align).backward(gout.double())
                want = {"grad_input": xw.grad, "grad_grid": gw.grad}
                label = (f"{interp_name} {pad} input {list(in_shape)} grid {list(grid_shape)} "
                         f"align_corners={align}")
                for what, storage, got in outputs:
                    if not untouched(storage, got):
                        return "wrong", f"{label}: {what} written outside its elements"
                    # grad_input: every contribution rounded to T by the kernel before its
                    # atomic add (``static_cast<T>(w * gOut)``); up to 16 contributions
                    # (bicubic) per element here, added in T (half, bfloat) in any order.
                    accumulated = what == "grad_input" and got.dtype in (torch.float16, torch.bfloat16)
                    problem = mismatch(got.flatten(), want[what].flatten(), "accumulated" if accumulated else "special")
                    if problem:
                        return "wrong", f"{label}: {what}: {problem}"
    return "correct", ""

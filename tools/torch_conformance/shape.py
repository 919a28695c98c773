"""PyTorch's shape kernels (Shape.metal), called as Shape.mm calls them.

* ``cat_<I>_<T_in>_<T_out>`` (I = int32_t or int64_t, the index type of the params'
  arrays): one dispatch per input of ``input.numel()`` threads (1-D, split into several
  dispatches beyond INT_MAX threads, each with ``input_element_offset`` = the elements
  before it). ``CatSharedParams``: ndim, cat_dim, then the output's strides and sizes in
  elements (16 of each); ``CatInputParams``: cat_dim_offset (the inputs' sizes along
  cat_dim before this one), input_element_offset, the input's strides and sizes.
  Thread ``tid`` decomposes ``tid + input_element_offset`` over the input's sizes,
  innermost last, and writes ``static_cast<T_out>(input[...])`` at the same index shifted
  by cat_dim_offset along cat_dim.
"""

import math
import re
import struct
from typing import Optional, Tuple

import torch

from .buffers import bindable, exact, sentinel_view, untouched
from .dtypes import METAL_DTYPES, is_complex
from .elementwise import NoHarness
from .inputs import generator

_CAT = re.compile(r"^cat_(int32_t|int64_t)_([a-z0-9]+)_([a-z0-9]+)$")
_UNSIGNED = (torch.uint8, torch.uint16, torch.uint32, torch.uint64)


def parse(name: str) -> Optional[Tuple[str, ...]]:
    match = _CAT.match(name)
    if match and match.group(2) in METAL_DTYPES and match.group(3) in METAL_DTYPES:
        return ("cat",) + match.groups()
    return None


def convertible_values(shape, source: torch.dtype, target: torch.dtype, gen) -> torch.Tensor:
    """Values of `source` whose conversion to `target` is defined the same way in C++ and
    in torch: small, and not negative where either type is unsigned (a negative float
    converted to an unsigned integer is undefined)."""
    count = math.prod(shape)
    if is_complex(source):
        parts = torch.rand(count, 2, generator=gen, dtype=torch.float64) * 8 - 4
        return torch.view_as_complex(parts).to(source).reshape(shape)
    if source == torch.bool:
        return (torch.rand(count, generator=gen) < 0.5).reshape(shape)
    low = 0 if source in _UNSIGNED or target in _UNSIGNED else -20
    x = torch.rand(count, generator=gen, dtype=torch.float64) * 40 + low
    if not source.is_floating_point:
        x = x.floor()
    return x.to(source).reshape(shape)


def _pack_cat(index: str, ndim: int, cat_dim: int, strides, sizes, offsets=None) -> bytes:
    fmt = "q" if index == "int64_t" else "i"
    pad = lambda xs: list(xs) + [0] * (16 - len(xs))  # noqa: E731
    if offsets is None:  # CatSharedParams
        return struct.pack(f"<ii16{fmt}16{fmt}", ndim, cat_dim, *pad(strides), *pad(sizes))
    return struct.pack(f"<{fmt}{fmt}16{fmt}16{fmt}", *offsets, *pad(strides), *pad(sizes))


def check_cat(function, index: str, tin: torch.dtype, tout: torch.dtype) -> Tuple[str, str]:
    gen = generator(function.name)
    # Inputs of 5 x {7, 9, 3} x 6 along dim 1 (and the like along 0 and 2): one contiguous,
    # one transposed, one with every other element; the output permuted, with gaps.
    for cat_dim in (1, 0, 2):
        parts = []
        for n, layout in ((7, "contiguous"), (9, "transposed"), (3, "gapped")):
            shape = [5, 11, 6]
            shape[cat_dim] = n
            x = convertible_values(shape, tin, tout, gen)
            if layout == "transposed":
                x = x.transpose(0, 2).contiguous().transpose(0, 2)
            elif layout == "gapped":
                wide = torch.empty(shape[:-1] + [shape[-1] * 2], dtype=tin)
                wide[..., ::2] = x
                x = wide[..., ::2]
            parts.append(x)
        out_shape = [5, 11, 6]
        out_shape[cat_dim] = 19
        storage, out = sentinel_view(out_shape, tout, order=(2, 0, 1), gap=2)
        shared = _pack_cat(index, 3, cat_dim, out.stride(), out.shape)
        offset = 0
        for i, x in enumerate(parts):
            # The second input in two dispatches, as the host splits inputs beyond INT_MAX.
            splits = [0, x.numel() // 3, x.numel()] if i == 1 else [0, x.numel()]
            for start, stop in zip(splits, splits[1:]):
                params = _pack_cat(index, 3, cat_dim, x.stride(), x.shape, (offset, start))
                function(bindable(x), bindable(out), shared, params, threads=stop - start, group_size=64)
            offset += x.shape[cat_dim]
        expected = torch.cat([p.to(tout) for p in parts], dim=cat_dim)
        if not untouched(storage, out):
            return "wrong", f"cat along {cat_dim}: wrote outside its output"
        problem = exact(out, expected)
        if problem:
            return "wrong", f"cat along {cat_dim}: {problem}"
    return "correct", ""


def check(function, device: str) -> Tuple[str, str]:
    parsed = parse(function.name)
    if parsed is None:
        raise NoHarness("not a shape kernel")
    if device != "cpu":
        raise NoHarness("the shape harness builds CPU tensors only")
    op, *rest = parsed
    if op == "cat":
        index, tin, tout = rest
        return check_cat(function, index, METAL_DTYPES[tin], METAL_DTYPES[tout])
    raise NoHarness(f"no harness for {op}")

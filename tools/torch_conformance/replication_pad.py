"""PyTorch's ``replication_pad1d_{forward,backward}_<T>`` kernels (ReplicationPad.metal), as Pad.mm calls them.

Contiguous (N, C, W) tensors; ``sizes_pad`` = int4 (input_W, output_W, padL, padR). Forward:
one thread per output element, grid (output_W, C, N) (``threads_per_grid.y`` is the plane
count). Backward: one thread per grad_input element, grid (input_W, C, N), each summing the
grad_output elements its input element was replicated into, in ``opmath_t<T>``.

References: ``torch.ops.aten.replication_pad1d`` and ``replication_pad1d_backward`` in
float64 / complex128 (int64 for integer forwards, compared exactly; the forward is a copy,
exact for every dtype); the backward's sums of a few terms within "math". Outputs lie in
sentinel storage, so a write past either end is caught.
"""

import re
from typing import Optional, Tuple

import torch

from .buffers import bindable, exact, sentinel_view, untouched
from .compare import mismatch
from .dtypes import METAL_DTYPES, wide
from .inputs import generator, values

_NAME = re.compile(r"^replication_pad1d_(forward|backward)_(float|half|bfloat|float2|half2|long|int|short|char|uchar|bool)$")
# (N, C, W, padL, padR): pads on both sides, one side only, and a width-1 input.
_CASES = [(2, 3, 7, 3, 2), (1, 4, 5, 0, 4), (2, 2, 1, 2, 3)]


def parse(name: str) -> Optional[Tuple]:
    match = _NAME.match(name)
    if not match:
        return None
    return ("replication_pad1d_" + match.group(1), match.group(1), METAL_DTYPES[match.group(2)])


def check(function, device: str) -> Tuple[str, str]:
    _, kind, t = parse(function.name)
    gen = generator(function.name)
    w = wide(t) if t != torch.bool else torch.int64
    for n, c, width, left, right in _CASES:
        out_w = width + left + right
        label = f"N={n} C={c} W={width} pad=({left}, {right})"
        sizes_pad = (width, out_w, left, right)
        if kind == "forward":
            x = values(n * c * width, t, "any", gen).reshape(n, c, width)
            storage, out = sentinel_view((n, c, out_w), t)
            function(bindable(x), bindable(out), sizes_pad, threads=(out_w, c, n), group_size=(min(out_w, 32), 1, 1))
            expected = torch.ops.aten.replication_pad1d(x.to(w), [left, right])
            problem = exact(out, expected)
        else:
            x = values(n * c * width, t, "any", gen).reshape(n, c, width)
            grad = values(n * c * out_w, t, "any", gen).reshape(n, c, out_w)
            storage, out = sentinel_view((n, c, width), t)
            function(bindable(grad), bindable(out), sizes_pad, threads=(width, c, n),
                     group_size=(min(width, 32), 1, 1))
            expected = torch.ops.aten.replication_pad1d_backward(grad.to(w), x.to(w), [left, right])
            problem = mismatch(out, expected, "math")
        if not untouched(storage, out):
            return "wrong", f"{label}: wrote outside its output"
        if problem:
            return "wrong", f"{label}: {problem}"
    return "correct", ""

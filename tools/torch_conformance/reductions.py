"""PyTorch's reductions (ReduceOps.metal): ``<op>_reduction[_inner|_outer|_strided]_TI_TO``.

* inner: input [M, N] -> output [M]; one SIMD-group per row, ``sizes`` = (M, N), any
  threadgroup size that is a multiple of 32.
* outer: input [M, N] -> output [N] (``output[col * out_stride]``); threadgroups of
  32 x 32 threads over columns, ``sizes`` = (M, N, out_stride).
* general (``NormParams``: p, reduction_size, ndim, then input and output sizes and
  strides in elements, 16 of each): one threadgroup per output element; the dimensions
  whose input and output sizes differ are reduced. ``p`` > 0 divides the result (mean).
* strided (pass 1 of a full reduction): threadgroup g reduces the elements g*E .. g*E+E-1
  of the input in logical order (E = reduction_size) into ``output[g]``.

``norm_l1_reduction_inner``/``norm_l2_reduction_inner`` (ReduceOps.metal's inner sum with
``LOAD_ABS``, and ``LOAD_SQUARE`` with ``FINAL_SQRT``): the vector 1- and 2-norms of each row,
against ``torch.linalg.vector_norm`` in float64.

Sums accumulate in ``opmath_t<TO>`` (float for half/bfloat; uint for count_nonzero); a
``divisor`` > 0 divides the sum before the cast to TO. any/all write uchar.
"""

import re
import struct
from typing import Optional, Tuple

import torch

from .buffers import bindable, untouched, zeroed_between_sentinels
from .compare import mismatch
from .dtypes import METAL_DTYPES, is_integral, wide
from .inputs import generator, values

DEVICES = ("cpu", "cuda")  # its tensors are placed on the device checked

_NAME = re.compile(r"^(sum|nansum|count_nonzero|max|min|any|all|argmax|argmin|norm_l1|norm_l2)_reduction"
                   r"(?:_(inner|outer|strided))?_([a-z0-9]+)_([a-z0-9]+)$")
_GROUP = 256


def parse(name: str) -> Optional[Tuple[str, str, torch.dtype, torch.dtype]]:
    match = _NAME.match(name)
    if not match or match.group(3) not in METAL_DTYPES or match.group(4) not in METAL_DTYPES:
        return None
    return match.group(1), match.group(2) or "general", METAL_DTYPES[match.group(3)], METAL_DTYPES[match.group(4)]


def _norm_params(p: float, reduction_size: int, in_sizes, in_strides, out_sizes, out_strides) -> bytes:
    pad = lambda xs: list(xs) + [0] * (16 - len(xs))  # noqa: E731
    return struct.pack("<fII16I16I16I16I", p, reduction_size, len(in_sizes), *pad(in_sizes),
                       *pad(in_strides), *pad(out_sizes), *pad(out_strides))


def _input(op: str, ti: torch.dtype, count: int, gen) -> torch.Tensor:
    if op in ("argmax", "argmin"):  # distinct values: ties would make the index ambiguous
        order = torch.randperm(count, generator=gen)
        return (order - count // 2).to(ti) if is_integral(ti) else ((order.double() - count / 2) / 64).to(ti)
    x = values(count, ti, "any", gen)
    if op == "nansum" and ti.is_floating_point:
        x[::7] = float("nan")
    if op in ("count_nonzero", "any", "all"):
        x[::3] = 0
    return x


def _reference(op: str, x: torch.Tensor, dims, to: torch.dtype) -> torch.Tensor:
    w = x.to(wide(x.dtype))
    if op == "nansum":
        w = torch.nan_to_num(w, nan=0.0)
    if op == "count_nonzero":
        return (w != 0).sum(dim=dims).to(torch.int64)
    if op in ("any", "all"):
        return getattr(torch, op)(w != 0, dim=dims[0]).to(torch.uint8) if len(dims) == 1 else \
            getattr(torch, op)((w != 0).flatten(), dim=0).to(torch.uint8)
    if op in ("max", "min"):
        return torch.amax(w, dim=dims) if op == "max" else torch.amin(w, dim=dims)
    if op in ("argmax", "argmin"):
        return getattr(torch, op)(w, dim=dims[0])
    if op in ("norm_l1", "norm_l2"):
        return torch.linalg.vector_norm(w, ord=int(op[-1]), dim=dims)
    if is_integral(to) and x.dtype.is_floating_point:
        w = w.to(torch.int64)
    return w.sum(dim=dims)


def check(function, device: str) -> Tuple[str, str]:
    op, shape, ti, to = parse(function.name)
    gen = generator(function.name)
    takes_divisor = any(a.name == "divisor" for a in function.arguments)
    cases = {"inner": [((37, 300), (1,)), ((5, 1000), (1,))],
             "outer": [((37, 300), (0,)), ((300, 45), (0,))],
             "general": [((37, 300), (1,)), ((300, 45), (0,)), ((6, 7, 40), (0, 2))],
             "strided": [((24, 50), (0, 1))]}[shape]
    if op in ("argmax", "argmin", "any", "all"):
        cases = [c for c in cases if len(c[1]) == 1] or cases
    for sizes, dims in cases:
        count = 1
        for s in sizes:
            count *= s
        x = _input(op, ti, count, gen).reshape(sizes)
        expected = _reference(op, x, dims, to)
        given = bindable(x.to(device))
        pad = 16
        if shape in ("inner", "outer"):
            m, n = sizes
            rows = m if shape == "inner" else n
            storage, out = zeroed_between_sentinels(rows, to, device, pad)
            extra = (0.0,) if takes_divisor else ()
            if shape == "inner":
                threads = -(-m // (_GROUP // 32)) * _GROUP
                function(given, bindable(out), (m, n), *extra, threads=threads, group_size=_GROUP)
            else:
                function(given, bindable(out), (m, n, 1), *extra,
                         threads=(-(-n // 32) * 32, 32), group_size=(32, 32))
        elif shape == "general":
            out_sizes = [1 if d in dims else s for d, s in enumerate(sizes)]
            out_count = 1
            for s in out_sizes:
                out_count *= s
            out_strides, step = [], 1
            for s in reversed(out_sizes):
                out_strides.insert(0, step)
                step *= s
            reduced = 1
            for d in dims:
                reduced *= sizes[d]
            params = _norm_params(0.0, reduced, sizes, list(x.stride()), out_sizes, out_strides)
            storage, out = zeroed_between_sentinels(out_count, to, device, pad)
            function(given, bindable(out), params, threads=out_count * _GROUP, group_size=_GROUP)
            expected = expected.flatten()
        else:  # strided pass 1 over a transposed view, in chunks of E
            chunk = 100
            view = x.t()
            groups = count // chunk
            params = _norm_params(0.0, chunk, list(view.shape), list(view.stride()), [1, 1], [0, 0])
            storage, out = zeroed_between_sentinels(groups, to, device, pad)
            function(given, bindable(out), params, threads=groups * _GROUP, group_size=_GROUP)
            expected = _reference(op, view.reshape(groups, chunk), (1,), to)
        if not untouched(storage.cpu(), out):
            return "wrong", f"{list(sizes)} over {list(dims)}: wrote outside its output"
        tolerance = "exact" if is_integral(to) or op in ("max", "min") else "special"
        problem = mismatch(out.cpu().flatten(), expected.flatten(), tolerance)
        if problem:
            return "wrong", f"{list(sizes)} over {list(dims)}: {problem}"
    return "correct", ""

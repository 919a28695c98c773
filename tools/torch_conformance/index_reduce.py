"""PyTorch's ``index_reduce`` kernels (Indexing.metal), as Indexing.mm's ``index_reduce_mps`` calls them.

* ``index_reduce_<amax|amin|mean|prod>_<T>_<int|long>``: self (atomic), index, source,
  ``IndexReduceParams`` (ndim, reduce_dim, self/source strides and sizes in elements, as
  ``uint[16]``, index_stride); ``source.numel()`` threads (``mtl_dispatch1DJob``). Thread
  ``tid`` decomposes over source's sizes with the last dimension fastest and reduces
  ``source[...]`` atomically into self at ``index[i * index_stride]`` along reduce_dim.
* The host fills self first (the op's identity at the indexed rows when
  ``include_self=False``) and, for mean, divides by the counts afterwards: the kernel's
  ``mean`` only adds. So the reference for ``mean`` is ``index_add`` and for the others
  ``torch.index_reduce(..., include_self=True)`` on the same initial self, in int64 or
  float64. Inputs are small integers (sums and products exact in any order: the atomic
  updates land in an order of their own) or, for amax/amin, arbitrary values; comparisons
  are exact. Self is a strided view with gaps, source laid out transposed, the index strided.
"""

import re
from typing import Optional, Tuple

import torch

from .buffers import exact, sentinel_view, untouched
from .dtypes import METAL_DTYPES, wide
from .structs import argument, pack

_NAME = re.compile(r"^index_reduce_(amax|amin|mean|prod)_(float|half|bfloat|int|short|char|uchar)_(int|long)$")
_INDEX = {"int": torch.int32, "long": torch.int64}


def parse(name: str) -> Optional[Tuple]:
    match = _NAME.match(name)
    if not match:
        return None
    return ("index_reduce_" + match.group(1), match.group(1), METAL_DTYPES[match.group(2)], _INDEX[match.group(3)])


def _values(shape, t, low, high, gen, real=False):
    if real and t.is_floating_point:
        return (torch.rand(shape, generator=gen, dtype=torch.float64) * 20 - 10).to(t)
    if t == torch.uint8:
        low = max(low, 0)
    return torch.randint(low, high, shape, generator=gen).to(t)


def check(function, device: str) -> Tuple[str, str]:
    _, op, t, it = parse(function.name)
    gen = torch.Generator().manual_seed(len(function.name) * 7919 + sum(map(ord, function.name)))
    params_arg = argument(function, "params")
    for dim in (1, 0, 2):
        shape = [4, 5, 6]
        n = 9  # more source rows than self rows: duplicates collide
        src_shape = list(shape)
        src_shape[dim] = n
        low, high = {"prod": (-2, 3), "mean": (-9, 10)}.get(op, (-50, 50))
        real = op in ("amax", "amin")
        initial = _values(shape, t, low, high, gen, real)
        src = _values(src_shape, t, low, high, gen, real)
        # prod: at most three factors of magnitude <= 2 per element (char holds them).
        index = torch.randint(0, shape[dim], (n,), generator=gen)
        storage, out = sentinel_view(shape, t, order=(2, 0, 1), gap=2, initial=initial)
        src_t = src.transpose(0, 2).contiguous().transpose(0, 2)
        base = torch.zeros(2 * n + 1, dtype=it)
        base[1::2] = index.to(it)
        idx = base[1::2]
        params = pack(params_arg, dict(ndim=3, reduce_dim=dim, self_strides=out.stride(), self_sizes=shape,
                                       source_strides=src_t.stride(), source_sizes=src_shape, index_stride=2))
        function(out, idx, src_t, params, threads=src.numel(), group_size=64)
        w = wide(t)
        if op == "mean":
            expected = initial.to(w).index_add(dim, index, src.to(w))
        else:
            expected = initial.to(w).index_reduce(dim, index, src.to(w), op, include_self=True)
        label = f"{op} along {dim}"
        if not untouched(storage, out):
            return "wrong", f"{label}: wrote outside its output"
        problem = exact(out, expected, zero_sign=op != "prod")  # buffers.ATOMIC_PRODUCT_ZEROS
        if problem:
            return "wrong", f"{label}: {problem}"
    return "correct", ""

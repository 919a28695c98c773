"""PyTorch's naive matrix products (LinearAlgebra.metal), as LinearAlgebra.mm's do_metal_mm,
do_metal_addmm, do_metal_bmm and the baddbmm/addbmm paths call them.

* ``matmul_<T>``, ``addmm_<T>``: out[M, N] = mat1[M, K] @ mat2[K, N] (addmm: alpha * that +
  beta * bias[M, N]). ``strides``: ``array<ulong2, 3|4>`` = (row, column) strides in
  elements of mat1, mat2, out (and bias); ``sizes`` = uint3 (M, K, N). 16x16 tiles read
  through threadgroup memory: ``dispatchThreadgroups(ceil(N/16), ceil(M/16))`` of 16x16
  threads (x = column), so the grid is whole tiles.
* ``naive_bmm_<T>``, ``naive_baddbmm_<T>``, ``naive_addbmm_<T>``: ``strides`` =
  ``array<ulong, 9|12>``: (column, row, batch) strides of batch1, batch2, out (and bias);
  ``sizes`` = uint4 (M, K, N, batch); tiles as above, batch in z. addbmm sums the batches
  into a 2-D out (its batch strides unused, passed as 0).
* ``alpha_beta``: ``array<opmath_t<T>, 2>`` (float for float/half/bfloat, float2 for
  complex, int for int/short/char/uchar, long for long).

Inputs are small integers (complex: small integer parts), so every product and sum is
exact in any dtype and accumulation order: the reference is torch's op in int64 /
float64 / complex128, compared exactly for integers and within one rounding ("exact")
for floating results. Operands are transposed or strided views; outputs are views with
gaps inside sentinel storage.
"""

import re
import struct
from typing import Optional, Tuple

import torch

from .buffers import bindable, exact, sentinel_view, untouched
from .compare import mismatch
from .dtypes import METAL_DTYPES, is_complex, is_integral, wide
from .structs import argument

_NAME = re.compile(r"^(matmul|addmm|naive_bmm|naive_baddbmm|naive_addbmm)_"
                   r"(float|half|bfloat|float2|half2|long|int|short|char|uchar)$")
_TILE = 16
_ALPHA, _BETA = 2, -1


def parse(name: str) -> Optional[Tuple]:
    match = _NAME.match(name)
    if not match:
        return None
    return (match.group(1), match.group(1), METAL_DTYPES[match.group(2)])


def _small(shape, t, gen, transposed=False):
    low = 0 if t == torch.uint8 else -3
    x = torch.randint(low, 4, shape, generator=gen)
    if is_complex(t):
        x = torch.complex(x.double(), torch.randint(-3, 4, shape, generator=gen).double())
    x = x.to(t)
    if transposed:  # same values, the last two dimensions swapped in memory
        x = x.transpose(-1, -2).contiguous().transpose(-1, -2)
    return x


def _strided(x):
    """`x`'s values as every other element of a larger storage."""
    base = torch.zeros(x.numel() * 2, dtype=x.dtype)
    view = base.as_strided(x.shape, [2 * s for s in x.contiguous().stride()], 0)
    view.copy_(x)
    return view


def _alpha_beta(function) -> bytes:
    field = argument(function, "alpha_beta").struct_fields[0]
    fmt = {"int": "ii", "long": "qq", "float": "ff", "float2": "ffff"}[field.type_name]
    values = (_ALPHA, _BETA) if len(fmt) == 2 else (_ALPHA, 0, _BETA, 0)
    return struct.pack("<" + fmt, *values)


def check(function, device: str) -> Tuple[str, str]:
    op, _, t = parse(function.name)
    gen = torch.Generator().manual_seed(sum(map(ord, function.name)) * 131 + len(function.name))
    w = wide(t)
    for m, k, n in ((5, 7, 3), (20, 37, 18)):
        label = f"M={m} K={k} N={n}"
        if op in ("matmul", "addmm"):
            a = _small((m, k), t, gen, transposed=True)
            b = _strided(_small((k, n), t, gen))
            storage, out = sentinel_view((m, n), t, order=(1, 0), gap=2)
            strides = [*a.stride(), *b.stride(), *out.stride()]
            args = [bindable(a), bindable(b), bindable(out)]
            expected = a.to(w) @ b.to(w)
            if op == "addmm":
                bias = _small((m, n), t, gen, transposed=True)
                strides += bias.stride()
                args += [bindable(bias), _alpha_beta(function)]
                expected = _ALPHA * expected + _BETA * bias.to(w)
            args += [struct.pack(f"<{len(strides)}Q", *strides), (m, k, n)]
            grid = (_TILE * -(-n // _TILE), _TILE * -(-m // _TILE))
            function(*args, threads=grid, group_size=(_TILE, _TILE))
        else:
            batch = 3
            a = _small((batch, m, k), t, gen, transposed=True)
            b = _strided(_small((batch, k, n), t, gen))
            out_shape = (m, n) if op == "naive_addbmm" else (batch, m, n)
            storage, out = sentinel_view(out_shape, t, order=(1, 0) if len(out_shape) == 2 else (0, 2, 1), gap=2)
            out_strides = [out.stride(1), out.stride(0), 0] if op == "naive_addbmm" else \
                [out.stride(2), out.stride(1), out.stride(0)]
            strides = [a.stride(2), a.stride(1), a.stride(0), b.stride(2), b.stride(1), b.stride(0), *out_strides]
            args = [bindable(a), bindable(b), bindable(out)]
            expected = a.to(w) @ b.to(w)
            if op == "naive_addbmm":
                expected = expected.sum(0)
            if op != "naive_bmm":
                bias = _small(out_shape, t, gen, transposed=True)
                bias_strides = [bias.stride(1), bias.stride(0), 0] if op == "naive_addbmm" else \
                    [bias.stride(2), bias.stride(1), bias.stride(0)]
                strides += bias_strides
                args += [bindable(bias), _alpha_beta(function)]
                expected = _ALPHA * expected + _BETA * bias.to(w)
            args += [struct.pack(f"<{len(strides)}Q", *strides), (m, k, n, batch)]
            grid = (_TILE * -(-n // _TILE), _TILE * -(-m // _TILE), batch if op != "naive_addbmm" else 1)
            function(*args, threads=grid, group_size=(_TILE, _TILE, 1))
        if not untouched(storage, out):
            return "wrong", f"{label}: wrote outside its output"
        problem = exact(out, expected) if is_integral(t) else mismatch(out, expected, "exact")
        if problem:
            return "wrong", f"{label}: {problem}"
    return "correct", ""

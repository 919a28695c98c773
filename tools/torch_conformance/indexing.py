"""PyTorch's indexing kernels (Indexing.metal, Scatter.metal), called as Indexing.mm and
Scatter.mm call them. Strides and sizes are in elements; ``pos_from_thread_index``
(c10/metal/indexing.h) takes dimension 0 as the fastest-varying one.

* ``index_copy_{dense,strided}_<T>_<int|long>_<32|64>``: result, source, index. Dense
  (all contiguous): dim_size, inner = result.stride(dim), indices_numel; a 3-D grid
  (inner, indices_numel, outer) in groups the host sizes from the pipeline's limit; no
  negative indices. Strided: dim_size, result/source strides along dim, the sizes and
  result/source strides of the other dimensions, their count, slice_numel, index.stride(0);
  indices_numel * slice_numel threads; a negative index counts from the end.
* ``gather_{dense,strided}_<T>_<IT>``, ``scatter_<set|add|prod|amin|amax>_{dense,strided}_<T>_<IT>``,
  ``scatter_set_<T>_<IT>`` (strided), ``scatter_set_dense_value_<T>_<IT>``: index.numel()
  threads from ``tid_offset`` (the host splits beyond UINT_MAX). Dense: contiguous output,
  index (and src), index shaped like the output outside dim; inner_size = the product of
  the output's sizes after dim. Strided: index sizes, output/src(input)/index strides,
  ``ndim_dim`` = (ndim, dim, 0), the output's (input's) size along dim. An index out of
  range is reported in ``error_buf`` (``c10::metal::ErrorMessages``) and skipped. Signed
  long amin/amax need the output's sign bits flipped before and after
  (``scatter_signbit_xor_long``), as the host does.
* ``index_fill_{dense,strided}_<T>``: one thread per (index, slice element); a negative
  index counts from the end. The mask path: ``index_fill_zero_mask``,
  ``index_fill_set_mask``, then ``index_fill_{dense,strided}_from_mask_<T>``.
* ``masked_fill_scalar_{dense,broadcast,strided}_<N>bit``: one thread per element of self;
  broadcast repeats the mask every mask_numel elements.
"""

import math
import re
from typing import Optional, Tuple

import torch

from .buffers import bindable, exact, sentinel_view, untouched
from .compare import mismatch
from .dtypes import METAL_DTYPES, is_complex, wide
from .elementwise import NoHarness
from .inputs import generator
from .shape import convertible_values

_T = r"(float|half|bfloat|int|long|short|char|uchar|bool|float2|half2)"
_PATTERNS = [
    ("index_copy", re.compile(rf"^index_copy_(dense|strided)_{_T}_(int|long)_(32|64)$")),
    ("gather", re.compile(rf"^gather_(dense|strided)_{_T}_(int|long)$")),
    ("scatter", re.compile(rf"^scatter_(set|add|prod|amin|amax)_(dense|strided|dense_value)_{_T}_(int|long)$")),
    ("scatter", re.compile(rf"^scatter_(set)_(){_T}_(int|long)$")),
    ("scatter_signbit_xor", re.compile(r"^scatter_signbit_xor_(long)$")),
    ("index_fill", re.compile(rf"^index_fill_(dense|strided)_{_T}$")),
    ("index_fill_from_mask", re.compile(rf"^index_fill_(dense|strided)_from_mask_{_T}$")),
    ("index_fill_mask", re.compile(r"^index_fill_(zero|set)_mask$")),
    ("masked_fill", re.compile(r"^masked_fill_scalar_(dense|broadcast|strided)_(8|16|32|64)bit$")),
]
_BITS = {8: torch.int8, 16: torch.int16, 32: torch.int32, 64: torch.int64}
_INDEX = {"int": torch.int32, "long": torch.int64}


def parse(name: str) -> Optional[Tuple]:
    for op, pattern in _PATTERNS:
        match = pattern.match(name)
        if match:
            groups = match.groups()
            if op == "scatter":  # scatter_add, scatter_amax, ...: a family each
                return (f"scatter_{groups[0]}",) + groups
            return (op,) + groups
    return None


def error_buffer(function) -> Optional[torch.Tensor]:
    """A zeroed ``c10::metal::ErrorMessages`` of the kernel's reflected size, or None."""
    arg = next((a for a in function.arguments if a.type_name == "c10::metal::ErrorMessages"), None)
    return None if arg is None else torch.zeros(arg.type_size, dtype=torch.uint8)


def _error_name(function) -> str:
    return next(a.name for a in function.arguments if a.type_name == "c10::metal::ErrorMessages")


def _verdict(storage, out, expected, what: str, errors=None, tolerance=None, zero_sign: bool = True) -> Optional[str]:
    """Why the call was wrong, or None (`zero_sign`: exact's)."""
    if not untouched(storage, out):
        return f"{what}: wrote outside its output"
    if errors is not None and bool(errors.any()):
        message = bytes(errors[4 + 256:4 + 506].tolist()).split(b"\0")[0]
        return f"{what}: reported an error for valid indices ({message!r})"
    problem = exact(out, expected, zero_sign) if tolerance is None else mismatch(out.contiguous(), expected, tolerance)
    return f"{what}: {problem}" if problem else None


def _strided_index(values: torch.Tensor) -> torch.Tensor:
    """`values` as every other element of a larger tensor: a non-unit stride."""
    base = torch.zeros(values.numel() * 2 + 1, dtype=values.dtype)
    base[1::2] = values.flatten()
    return base[1::2].view(values.shape) if values.dim() == 1 else \
        base[1::2].as_strided(values.shape, [s * 2 for s in values.contiguous().stride()], 1)


def _transposed(x: torch.Tensor) -> torch.Tensor:
    """`x`'s values in a storage laid out with the first and last dimensions swapped."""
    return x.transpose(0, -1).contiguous().transpose(0, -1)


# ---------------------------------------------------------------------------------- index_copy

def check_index_copy(function, variant: str, t: torch.dtype, it: torch.dtype) -> Tuple[str, str]:
    gen = generator(function.name)
    for dim in (1, 0, 2):
        shape = [5, 8, 6]
        dim_size = shape[dim]
        n = 4
        src_shape = list(shape)
        src_shape[dim] = n
        self_values = convertible_values(shape, t, t, gen)
        src = convertible_values(src_shape, t, t, gen)
        index = torch.randperm(dim_size, generator=gen)[:n]  # no duplicates: one write each
        if variant == "dense":
            storage, out = sentinel_view(shape, t, initial=self_values)
            idx = index.to(it)
            inner = out.stride(dim)
            outer = math.prod(shape[:dim])
            # The host's groups: x up to the limit, then y, then z (64 here: partial in z).
            limit = 64
            gx = min(inner, limit)
            gy = min(n, max(1, limit // gx))
            gz = min(outer, max(1, limit // (gx * gy)))
            function(output=bindable(out), source=bindable(src), indices=idx, dim_size=dim_size,
                     inner=inner, indices_numel=n, threads=(inner, n, outer), group_size=(gx, gy, gz))
        else:
            storage, out = sentinel_view(shape, t, order=(2, 0, 1), gap=2, initial=self_values)
            src = _transposed(src)
            signed = torch.where(torch.arange(n) % 2 == 1, index - dim_size, index)  # negatives count from the end
            idx = _strided_index(signed.to(it))
            others = [d for d in range(3) if d != dim]
            slice_numel = math.prod(shape) // dim_size
            function(output=bindable(out), source=bindable(src), indices=idx, dim_size=dim_size,
                     dim_out_stride=out.stride(dim), dim_source_stride=src.stride(dim),
                     slice_sizes=[shape[d] for d in others], slice_out_strides=[out.stride(d) for d in others],
                     slice_source_strides=[src.stride(d) for d in others], slice_ndim=2,
                     slice_numel=slice_numel, indices_stride=idx.stride(0),
                     threads=n * slice_numel, group_size=64)
        expected = self_values.index_copy(dim, index, src)
        problem = _verdict(storage, out, expected, f"index_copy along {dim}")
        if problem:
            return "wrong", problem
    return "correct", ""


# ------------------------------------------------------------------------------------- gather

def check_gather(function, variant: str, t: torch.dtype, it: torch.dtype) -> Tuple[str, str]:
    gen = generator(function.name)
    errors = error_buffer(function)
    for dim in (1, 0, 2):
        in_shape = [5, 8, 6]
        if variant == "dense":  # the index (= output) shaped like the input outside dim
            index_shape = list(in_shape)
            index_shape[dim] = 11
        else:  # smaller than the input outside dim
            index_shape = [4, 7, 5]
            index_shape[dim] = 11
        x = convertible_values(in_shape, t, t, gen)
        index = torch.randint(0, in_shape[dim], index_shape, generator=gen)
        total = index.numel()
        if variant == "dense":
            storage, out = sentinel_view(index_shape, t)
            idx = index.to(it)
            inner = math.prod(index_shape[dim + 1:])
            # Two dispatches, the second from tid_offset, as the host chunks beyond UINT_MAX.
            for start, stop in ((0, total // 3), (total // 3, total)):
                function(output=bindable(out), input=bindable(x), index=idx, inner_size=inner,
                         output_dim_size=index_shape[dim], input_dim_size=in_shape[dim], tid_offset=start,
                         **{_error_name(function): errors}, threads=stop - start, group_size=64)
        else:
            storage, out = sentinel_view(index_shape, t, order=(2, 0, 1), gap=2)
            x = _transposed(x)
            idx = _strided_index(index.to(it))
            function(output=bindable(out), input=bindable(x), index=idx, sizes=index_shape,
                     output_strides=out.stride(), input_strides=x.stride(), index_strides=idx.stride(),
                     ndim_dim=(3, dim, 0), input_dim_size=in_shape[dim], tid_offset=0,
                     **{_error_name(function): errors}, threads=total, group_size=64)
        expected = _via_complex64(lambda a, i: torch.gather(a, dim, i), x, index)
        problem = _verdict(storage, out, expected, f"gather along {dim}", errors)
        if problem:
            return "wrong", problem
    return "correct", ""


# ------------------------------------------------------------------------------------ scatter

def _small_values(shape, t: torch.dtype, low: int, high: int, gen) -> torch.Tensor:
    """Integer values in [low, high) as `t`: sums and products of a few are exact in any
    order (atomic updates collide in an order of their own)."""
    count = math.prod(shape)
    if t == torch.bool:
        return (torch.rand(count, generator=gen) < 0.6).reshape(shape)
    if t in (torch.uint8,):
        low, high = max(low, 0), max(high, 2)
    x = torch.randint(low, high, (count,), generator=gen)
    if is_complex(t):
        y = torch.randint(low, high, (count,), generator=gen)
        return torch.complex(x.double(), y.double()).to(t).reshape(shape)
    return x.to(t).reshape(shape)


def _via_complex64(fn, *tensors):
    """`fn` over `tensors`, complex32 ones widened to complex64 (torch's CPU gather and
    scatter have no ComplexHalf kernels) and the result narrowed back: a copy either way."""
    half = any(t.dtype == torch.complex32 for t in tensors)
    result = fn(*[t.to(torch.complex64) if t.dtype == torch.complex32 else t for t in tensors])
    return result.to(torch.complex32) if half else result


def _scatter_reference(op: str, self_values, dim, index, src):
    if op == "set":
        return _via_complex64(lambda s, i, x: s.scatter(dim, i, x), self_values, index, src)
    t = self_values.dtype
    w = lambda v: v.to(wide(t)) if t != torch.bool else v.to(torch.int64)  # noqa: E731
    if op == "add":
        result = w(self_values).scatter_add(dim, index, w(src))
    else:
        result = w(self_values).scatter_reduce(dim, index, w(src), op, include_self=True)
    return result != 0 if t == torch.bool else result.to(t)


def check_scatter(function, op: str, variant: str, t: torch.dtype, it: torch.dtype) -> Tuple[str, str]:
    gen = generator(function.name)
    errors = error_buffer(function)
    library = function.library
    for dim in (1, 0, 2):
        shape = [5, 8, 6]
        n = 5
        dense = variant in ("dense", "dense_value")
        index_shape = list(shape) if dense else [4, 7, 5]
        index_shape[dim] = n
        if op == "set":
            # Distinct indices along dim in each slice: the result does not depend on
            # which of colliding writes lands last.
            order = torch.rand([s if d != dim else shape[dim] for d, s in enumerate(index_shape)],
                               generator=gen).argsort(dim=dim)
            index = order.narrow(dim, 0, n).contiguous()
            self_values = convertible_values(shape, t, t, gen)
            src = convertible_values(index_shape if dense else [6, 8, 7], t, t, gen)
        else:
            index = torch.randint(0, shape[dim], index_shape, generator=gen)
            low, high = (-2, 3) if op == "prod" else (-20, 21)
            self_values = _small_values(shape, t, low, high, gen)
            src = _small_values(index_shape if dense else [6, 8, 7], t, low, high, gen)
        if variant == "dense_value":
            value = src.flatten()[0]
            src = value.expand(index_shape)
        total = index.numel()
        common = {_error_name(function): errors}
        if dense:
            storage, out = sentinel_view(shape, t, initial=self_values)
            idx = index.to(it)
            first = {"value": (value.item() if not is_complex(t) else (value.real.item(), value.imag.item()))} \
                if variant == "dense_value" else {"src": bindable(src)}
            common.update(inner_size=math.prod(shape[dim + 1:]), index_dim_size=n, output_dim_size=shape[dim])
            launches = [(0, total // 3), (total // 3, total)]
        else:
            storage, out = sentinel_view(shape, t, order=(2, 0, 1), gap=2, initial=self_values)
            src = _transposed(src)
            idx = _strided_index(index.to(it))
            first = {"src": bindable(src)}
            common.update(index_sizes=index_shape, output_strides=out.stride(), src_strides=src.stride(),
                          index_strides=idx.stride(), ndim_dim=(3, dim, 0), dim_size=shape[dim])
            launches = [(0, total)]
        signbit = t == torch.int64 and op in ("amin", "amax")
        if signbit:
            _flip_sign_bits(library, storage)
        for start, stop in launches:
            function(output=bindable(out), index=idx, tid_offset=start, **first, **common,
                     threads=stop - start, group_size=64)
        if signbit:
            _flip_sign_bits(library, storage)
        expected = _scatter_reference(op, self_values, dim, index,
                                      src if not dense else src.reshape(index_shape))
        problem = _verdict(storage, out, expected, f"scatter_{op} along {dim}", errors,
                           zero_sign=op != "prod")  # buffers.ATOMIC_PRODUCT_ZEROS
        if problem:
            return "wrong", problem
    return "correct", ""


def _flip_sign_bits(library, storage: torch.Tensor) -> None:
    """``scatter_signbit_xor_long`` over all of `storage` (its own inverse), as the host
    brackets a signed long amin/amax; the sentinel margins come back unchanged."""
    library["scatter_signbit_xor_long"](data=storage, tid_offset=0, threads=storage.numel(), group_size=64)


def check_signbit_xor(function) -> Tuple[str, str]:
    gen = generator(function.name)
    x = torch.randint(-2 ** 62, 2 ** 62, (300,), generator=gen)
    storage, out = sentinel_view([300], torch.int64, initial=x)
    # Two dispatches: the second from tid_offset 100.
    function(data=out, tid_offset=0, threads=100, group_size=64)
    function(data=out, tid_offset=100, threads=200, group_size=64)
    expected = x ^ torch.tensor(-2 ** 63, dtype=torch.int64)
    problem = _verdict(storage, out, expected, "sign bits")
    return ("wrong", problem) if problem else ("correct", "")


# --------------------------------------------------------------------------------- index_fill

def _scalar(value: torch.Tensor):
    """A 0-d tensor's value as the kernel's constant: complex as (real, imaginary)."""
    if is_complex(value.dtype):
        return (value.real.item(), value.imag.item())
    return value.item()


def check_index_fill(function, variant: str, t: torch.dtype) -> Tuple[str, str]:
    gen = generator(function.name)
    for dim in (1, 0, 2):
        shape = [5, 8, 6]
        dim_size = shape[dim]
        self_values = convertible_values(shape, t, t, gen)
        fill = convertible_values([1], t, t, gen)[0]
        # Duplicates are fine (every write is the same value); negatives count from the end.
        index = torch.tensor([1, -1, 3, 1])
        slice_numel = math.prod(shape) // dim_size
        if variant == "dense":
            storage, out = sentinel_view(shape, t, initial=self_values)
            function(output=bindable(out), indices=index, fill_val=_scalar(fill), dim_size=dim_size,
                     dim_stride=out.stride(dim), slice_numel=slice_numel,
                     threads=index.numel() * slice_numel, group_size=64)
        else:
            storage, out = sentinel_view(shape, t, order=(2, 0, 1), gap=2, initial=self_values)
            idx = _strided_index(index)
            others = [d for d in range(3) if d != dim]
            function(output=bindable(out), indices=idx, fill_val=_scalar(fill), dim_size=dim_size,
                     dim_out_stride=out.stride(dim), slice_sizes=[shape[d] for d in others],
                     slice_out_strides=[out.stride(d) for d in others], slice_ndim=2,
                     slice_numel=slice_numel, indices_stride=idx.stride(0),
                     threads=index.numel() * slice_numel, group_size=64)
        expected = self_values.index_fill(dim, index % dim_size, fill)
        problem = _verdict(storage, out, expected, f"index_fill along {dim}")
        if problem:
            return "wrong", problem
    return "correct", ""


def check_index_fill_from_mask(function, variant: str, t: torch.dtype) -> Tuple[str, str]:
    gen = generator(function.name)
    for dim in (1, 0, 2):
        shape = [5, 8, 6]
        dim_size = shape[dim]
        self_values = convertible_values(shape, t, t, gen)
        fill = convertible_values([1], t, t, gen)[0]
        mask = torch.rand(dim_size, generator=gen) < 0.5
        if variant == "dense":
            storage, out = sentinel_view(shape, t, initial=self_values)
            inner = math.prod(shape[dim + 1:])
            outer = math.prod(shape[:dim])
            limit = 64
            gx = min(inner, limit)
            gy = min(dim_size, limit // gx)
            gz = min(outer, max(1, limit // (gx * gy)))
            function(output=bindable(out), mask=mask, fill_val=_scalar(fill), dim_size=dim_size,
                     inner_size=inner, threads=(inner, dim_size, outer), group_size=(gx, gy, gz))
        else:
            storage, out = sentinel_view(shape, t, order=(2, 0, 1), gap=2, initial=self_values)
            function(output=bindable(out), mask=mask, fill_val=_scalar(fill), sizes=shape,
                     out_strides=out.stride(), dim=dim, ndim=3, threads=math.prod(shape), group_size=64)
        expected = self_values.index_fill(dim, mask.nonzero().flatten(), fill)
        problem = _verdict(storage, out, expected, f"index_fill from a mask along {dim}")
        if problem:
            return "wrong", problem
    return "correct", ""


def check_index_fill_mask(function, which: str) -> Tuple[str, str]:
    dim_size = 37
    storage, mask = sentinel_view([dim_size], torch.bool, initial=torch.zeros(dim_size, dtype=torch.bool))
    if which == "zero":
        mask.view(torch.uint8).fill_(1)
        function(mask=mask, threads=dim_size, group_size=16)
        expected = torch.zeros(dim_size, dtype=torch.bool)
    else:
        index = torch.tensor([0, 5, -1, 5, 20, -37])
        idx = _strided_index(index)
        function(mask=mask, indices=idx, dim_size=dim_size, indices_stride=idx.stride(0),
                 threads=index.numel(), group_size=4)
        expected = torch.zeros(dim_size, dtype=torch.bool)
        expected[index % dim_size] = True
    problem = _verdict(storage, mask, expected, f"index_fill_{which}_mask")
    return ("wrong", problem) if problem else ("correct", "")


# -------------------------------------------------------------------------------- masked_fill

def check_masked_fill(function, variant: str, bits: int) -> Tuple[str, str]:
    gen = generator(function.name)
    t = _BITS[bits]
    shape = [7, 9, 13]
    self_values = convertible_values(shape, t, t, gen)
    fill = -7
    numel = math.prod(shape)
    if variant == "dense":
        mask = torch.rand(shape, generator=gen) < 0.5
        storage, out = sentinel_view(shape, t, initial=self_values)
        function(input=out, mask=mask, val=fill, threads=numel, group_size=64)
    elif variant == "broadcast":  # a mask over the trailing dimensions
        mask = torch.rand(shape[1:], generator=gen) < 0.5
        storage, out = sentinel_view(shape, t, initial=self_values)
        function(input=out, mask=mask, val=fill, mask_numel=mask.numel(), threads=numel, group_size=64)
    else:
        mask = _transposed(torch.rand(shape, generator=gen) < 0.5)
        storage, out = sentinel_view(shape, t, order=(2, 0, 1), gap=2, initial=self_values)
        # `ndim` is a `device uint&` in this kernel: bound as a one-element buffer.
        function(input=out, mask=mask, val=fill, sizes=shape, input_strides=out.stride(),
                 mask_strides=mask.stride(), ndim=torch.tensor([3], dtype=torch.int32),
                 threads=numel, group_size=64)
    expected = self_values.masked_fill(mask, fill)
    problem = _verdict(storage, out, expected, f"masked_fill {variant}")
    return ("wrong", problem) if problem else ("correct", "")


def check(function, device: str) -> Tuple[str, str]:
    parsed = parse(function.name)
    if parsed is None:
        raise NoHarness("not an indexing kernel")
    if device != "cpu":
        raise NoHarness("the indexing harness builds CPU tensors only")
    op, *rest = parsed
    if op == "index_copy":
        variant, t, it, _ = rest
        return check_index_copy(function, variant, METAL_DTYPES[t], _INDEX[it])
    if op == "gather":
        variant, t, it = rest
        return check_gather(function, variant, METAL_DTYPES[t], _INDEX[it])
    if op == "scatter_signbit_xor":
        return check_signbit_xor(function)
    if op.startswith("scatter_"):
        kind, variant, t, it = rest
        return check_scatter(function, kind, variant or "strided", METAL_DTYPES[t], _INDEX[it])
    if op == "index_fill":
        return check_index_fill(function, rest[0], METAL_DTYPES[rest[1]])
    if op == "index_fill_from_mask":
        return check_index_fill_from_mask(function, rest[0], METAL_DTYPES[rest[1]])
    if op == "index_fill_mask":
        return check_index_fill_mask(function, rest[0])
    if op == "masked_fill":
        return check_masked_fill(function, rest[0], int(rest[1]))
    raise NoHarness(f"no harness for {op}")

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
* ``fill_scalar_dense_<T>``: out, fill_val, numel; threads beyond numel write nothing.
  ``fill_scalar_strided_<T>``: a 2-D grid (x: the elements of dimensions 1.., dimension 1
  fastest; y: dimension 0), sizes, and strides in bytes: its AIR indexes the output with
  ``getelementptr i8`` (PyTorch's newer source, in elements, differs).
* ``eye_<T>``: a (cols, rows) grid writing ``output[y * stride0 + x * stride1]`` = (x == y);
  ``eye_diag_<T>``: ones at ``index * diag_stride`` of a zeroed output, min(rows, cols) threads.
* ``triu/tril[_inplace]_int_<T>`` (no source in the stored copy; read from the AIR): a 3-D
  grid (cols, rows, batch), ``k_ndim`` = (k, ndim), int strides and uint sizes in elements
  innermost first (columns, rows, then the batch dimensions from the last one: z is split
  over sizes[2..] only when ndim > 3). triu keeps ``x - y >= k`` and writes 0 elsewhere,
  tril keeps ``x - y <= k``; the in-place kernels write only the zeros.
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
_OTHERS = [
    ("fill_scalar", re.compile(r"^fill_scalar_(dense|strided)_([a-z0-9]+)$")),
    ("eye", re.compile(r"^eye_(diag_)?([a-z0-9]+)$")),
    ("triangle", re.compile(r"^(triu|tril)(_inplace)?_int_([a-z0-9]+)$")),
]
_UNSIGNED = (torch.uint8, torch.uint16, torch.uint32, torch.uint64)


def parse(name: str) -> Optional[Tuple[str, ...]]:
    match = _CAT.match(name)
    if match and match.group(2) in METAL_DTYPES and match.group(3) in METAL_DTYPES:
        return ("cat",) + match.groups()
    for op, pattern in _OTHERS:
        match = pattern.match(name)
        if match and match.groups()[-1] in METAL_DTYPES:
            return (match.group(1) if op == "triangle" else op,) + match.groups()
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


def _scalar(value: torch.Tensor):
    """A 0-d tensor's value as the kernel's constant: complex as (real, imaginary)."""
    if is_complex(value.dtype):
        return (value.real.item(), value.imag.item())
    return value.item()


def check_fill(function, variant: str, t: torch.dtype) -> Tuple[str, str]:
    gen = generator(function.name)
    fill = convertible_values([1], t, t, gen)[0]
    shape = [5, 7, 9]
    if variant == "dense":
        numel = math.prod(shape)
        storage, out = sentinel_view([numel], t)
        # A grid rounded up to whole groups: the threads past numel must write nothing.
        function(out=bindable(out), fill_val=_scalar(fill), numel=numel,
                 threads=-(-numel // 64) * 64, group_size=64)
    else:
        storage, out = sentinel_view(shape, t, order=(2, 0, 1), gap=2)
        strides = [s * out.element_size() for s in out.stride()]
        function(out=bindable(out), fill_val=_scalar(fill), sizes=shape, strides=strides, ndim=3,
                 threads=(shape[1] * shape[2], shape[0]), group_size=(16, 2))
    expected = fill.expand(out.shape)
    if not untouched(storage, out):
        return "wrong", "wrote outside its output"
    problem = exact(out, expected)
    return ("wrong", problem) if problem else ("correct", "")


def check_eye(function, diag: bool, t: torch.dtype) -> Tuple[str, str]:
    for rows, cols in ((7, 11), (12, 5)):
        if diag:
            storage, out = sentinel_view([rows, cols], t, order=(1, 0), gap=2, initial=torch.zeros(rows, cols, dtype=t))
            function(output=bindable(out), diag_stride=out.stride(0) + out.stride(1),
                     threads=min(rows, cols), group_size=4)
        else:
            storage, out = sentinel_view([rows, cols], t, order=(1, 0), gap=2)
            function(output=bindable(out), stride0=out.stride(0), stride1=out.stride(1),
                     threads=(cols, rows), group_size=(4, 4))
        expected = torch.eye(rows, cols, dtype=torch.complex64 if is_complex(t) else t).to(t)
        if not untouched(storage, out):
            return "wrong", f"{rows} x {cols}: wrote outside its output"
        problem = exact(out, expected)
        if problem:
            return "wrong", f"{rows} x {cols}: {problem}"
    return "correct", ""


def check_triangle(function, op: str, inplace: bool, t: torch.dtype) -> Tuple[str, str]:
    gen = generator(function.name)
    reference = torch.triu if op == "triu" else torch.tril
    for shape in ([7, 9], [3, 9, 7], [2, 3, 7, 9]):
        for k in (0, -2, 3):
            x = convertible_values(shape, t, t, gen)
            ndim = len(shape)
            # Innermost first: columns, rows, then the batch dimensions from the last one.
            dims = [ndim - 1, ndim - 2] + list(reversed(range(ndim - 2)))
            order = list(reversed(range(ndim)))  # the output stored transposed
            batch = math.prod(shape[:-2])
            grid = (shape[-1], shape[-2], batch)
            if inplace:
                storage, out = sentinel_view(shape, t, order=order, gap=2, initial=x)
                function(bindable(out), [out.stride(d) for d in dims], [shape[d] for d in dims], (k, ndim),
                         threads=grid, group_size=(4, 4, 2))
            else:
                storage, out = sentinel_view(shape, t, order=order, gap=2)
                inp = x.transpose(-1, -2).contiguous().transpose(-1, -2)
                function(bindable(out), bindable(inp), [out.stride(d) for d in dims],
                         [inp.stride(d) for d in dims], [shape[d] for d in dims], (k, ndim),
                         threads=grid, group_size=(4, 4, 2))
            expected = reference(x.to(torch.complex64) if t == torch.complex32 else x, k).to(t)
            if not untouched(storage, out):
                return "wrong", f"{shape}, k={k}: wrote outside its output"
            problem = exact(out, expected)
            if problem:
                return "wrong", f"{shape}, k={k}: {problem}"
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
    if op == "fill_scalar":
        return check_fill(function, rest[0], METAL_DTYPES[rest[1]])
    if op == "eye":
        return check_eye(function, bool(rest[0]), METAL_DTYPES[rest[1]])
    if op in ("triu", "tril"):
        return check_triangle(function, op, bool(rest[1]), METAL_DTYPES[rest[2]])
    raise NoHarness(f"no harness for {op}")

"""PyTorch's pooling kernels (Pooling.metal), called as Pooling.mm's 3-D pooling and unpooling paths call them.

* ``max_pool_<T>``: input, output, indices (int64), ``PoolingParams`` (dims = 4 or 5,
  pooling_dims = 3, input/output/indices sizes and strides in elements, kernel_size,
  stride, padding, dilation, return_indices); output.numel() threads
  (``mtl_dispatch1DJob``), one per output element, the last dimension fastest. The
  maximum is the first greatest element in (d, h, w) scan order (strict ``>``) and its
  index is flattened over the input's pooling dimensions. Reference:
  ``aten.max_pool3d_with_indices`` in float64 on distinct values (every integer dtype's
  values are exact there); values and indices compared exactly. ``bool``: values only
  distinct up to ties, torch and the kernel both keep the first maximum.
* ``avg_pool_<T>``: input, output, ``AvgPoolingParams``; pooling_dims = 3 (and 2, which
  the 2.13 AIR also handles: two ``fdiv``s behind a switch on pooling_dims), count_include_pad,
  divisor_override. The sum and the divisor are in ``opmath_t<T>``: integer types divide
  with ``sdiv`` (truncation toward zero, as CPU ``avg_pool2d`` on int64 does); ``bool``'s
  opmath is bool, so the sum saturates at true and the division is folded away (no
  ``div`` in ``avg_pool_bool``'s AIR): the result is whether any element of the window
  (padding excluded) is true. Reference: ``aten.avg_pool{2,3}d`` in float64 (within
  "math"); for integer types the float64 window sums (``divisor_override=1``) divided with
  truncation by the divisor torch used.
* ``max_pool_backward_<T>`` (float types): grad_input (atomic; the host zeroes it),
  grad_output, indices, ``PoolingBackwardParams``; grad_output.numel() threads, each adding
  its element at its index. Reference: ``aten.max_pool3d_with_indices_backward``.
* ``avg_pool_backward_<T>``: grad_input (atomic, zeroed), grad_output, ``AvgPoolingParams``
  (pooling_dims = 3); grad_output.numel() threads, each adding ``grad / divisor`` (in T) over
  its window. Reference: ``aten.avg_pool3d_backward``.
* ``max_unpool_<T>``: output (the host zeroes it), input, indices, ``MaxUnpoolingParams``
  (sizes/strides of input, output, indices), error buffer; input.numel() threads, each
  writing its element at its index into its (N, C) plane of the output. Reference:
  ``aten.max_unpool{2,3}d`` in float64 (exact for these small integers) with distinct indices per plane; exact.

Outputs are strided views in sentinel storage (a write outside them is caught); inputs
are transposed in memory.
"""

import re
from typing import Optional, Tuple

import torch

from .buffers import exact, sentinel_view, untouched
from .compare import mismatch
from .dtypes import METAL_DTYPES, is_integral
from .elementwise import NoHarness
from .inputs import generator
from .structs import argument, pack

_NAME = re.compile(r"^(max_pool|avg_pool|max_unpool|max_pool_backward|avg_pool_backward)_"
                   r"(float|half|bfloat|int|long|short|char|uchar|bool)$")
# (input shape, kernel, stride, padding, dilation, ceil_mode)
_MAX_CASES = [((2, 3, 5, 6, 7), (2, 3, 2), (1, 2, 2), (1, 1, 0), (1, 1, 2), False),
              ((3, 4, 5, 6), (3, 3, 3), (2, 2, 2), (1, 1, 1), (1, 1, 1), True)]
# (input shape, pooling dims, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override)
_AVG_CASES = [((2, 3, 5, 6, 7), 3, (2, 3, 2), (1, 2, 2), (1, 1, 0), False, True, None),
              ((3, 4, 5, 6), 3, (3, 3, 3), (2, 2, 2), (1, 1, 1), True, False, None),
              ((2, 3, 5, 6, 7), 3, (3, 2, 3), (2, 1, 2), (1, 0, 1), False, True, 5)]
_AVG2D_CASES = [((2, 3, 6, 7), 2, (3, 2), (2, 1), (1, 1), False, False, None),
                ((2, 3, 6, 7), 2, (3, 3), (2, 2), (1, 0), True, True, None)]


def parse(name: str) -> Optional[Tuple]:
    match = _NAME.match(name)
    if not match:
        return None
    return (match.group(1), match.group(1), METAL_DTYPES[match.group(2)])


def _transposed(x: torch.Tensor) -> torch.Tensor:
    """`x` with its last two dimensions swapped in memory."""
    return x.transpose(-1, -2).contiguous().transpose(-1, -2)


def _distinct(shape, t, gen) -> torch.Tensor:
    n = 1
    for s in shape:
        n *= s
    if t == torch.bool:
        return (torch.rand(n, generator=gen) < 0.5).reshape(shape)
    if t == torch.uint8:
        perm = torch.randperm(n, generator=gen) % 256
    elif t == torch.int8:
        perm = torch.randperm(n, generator=gen) % 256 - 128
    else:
        perm = torch.randperm(n, generator=gen) - n // 2
    if t.is_floating_point:
        return (perm.double() / 4).to(t).reshape(shape)  # exact in half and bfloat below 2^8 / 4
    return perm.to(t).reshape(shape)


def _unit(shape, t, gen) -> torch.Tensor:
    """Gradients of scale about 1, where "math"'s absolute floor applies: the backward kernels
    add in T (atomically), rounding after each term."""
    return (torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1).to(t)


def _order(ndim):
    """A storage order with the last two dimensions swapped."""
    return list(range(ndim - 2)) + [ndim - 1, ndim - 2]


def _problem(storage, out, expected, tolerance) -> Optional[str]:
    if not untouched(storage, out):
        return "wrote outside its output"
    return exact(out, expected) if tolerance is None else mismatch(out, expected, tolerance)


def _max_pool(function, t, gen):
    params_arg = argument(function, "params")
    for shape, k, s, p, d, ceil in _MAX_CASES:
        x = _transposed(_distinct(shape, t, gen))
        ref, ref_idx = torch.ops.aten.max_pool3d_with_indices(x.double(), k, s, p, d, ceil)
        storage, out = sentinel_view(ref.shape, t, order=_order(len(shape)))
        istorage, idx = sentinel_view(ref.shape, torch.int64, gap=2)
        dims = len(shape)
        params = pack(params_arg, dict(dims=dims, pooling_dims=3, input_sizes=x.shape, input_strides=x.stride(),
                                       output_sizes=out.shape, output_strides=out.stride(), indices_sizes=idx.shape,
                                       indices_strides=idx.stride(), kernel_size=k, stride=s, padding=p, dilation=d,
                                       return_indices=True))
        function(x, out, idx, params, threads=out.numel(), group_size=64)
        label = f"{tuple(shape)} k={k} s={s} p={p} d={d} ceil={ceil}"
        problem = _problem(storage, out, ref, None) or _problem(istorage, idx, ref_idx, None)
        if problem:
            return f"{label}: {problem}"
    return None


def _avg_reference(x, pooling_dims, k, s, p, ceil, include, divisor, t):
    op = torch.ops.aten.avg_pool3d if pooling_dims == 3 else torch.ops.aten.avg_pool2d
    xd = x.double()
    if t.is_floating_point:
        return op(xd, k, s, p, ceil, include, divisor)
    sums = op(xd, k, s, p, ceil, include, 1)
    if t == torch.bool:  # opmath_t<bool> is bool: the sum saturates, the division is folded away
        return sums != 0
    if divisor is None:  # the divisor torch used: window sums of ones over their averages
        ones = torch.ones_like(xd)
        divisor = (op(ones, k, s, p, ceil, include, 1) / op(ones, k, s, p, ceil, include, None)).round()
    return torch.trunc(sums / divisor).to(torch.int64)


def _avg_params(function, x, out, pooling_dims, k, s, p, include, divisor):
    return pack(argument(function, "params"),
                dict(dims=x.dim(), pooling_dims=pooling_dims, input_sizes=x.shape, input_strides=x.stride(),
                     output_sizes=out.shape, output_strides=out.stride(), kernel_size=k, stride=s, padding=p,
                     count_include_pad=include, has_divisor_override=divisor is not None,
                     divisor_override=divisor or 0))


def _avg_pool(function, t, gen):
    for shape, pd, k, s, p, ceil, include, divisor in _AVG_CASES + _AVG2D_CASES:
        x = _transposed(_distinct(shape, t, gen))
        ref = _avg_reference(x, pd, k, s, p, ceil, include, divisor, t)
        storage, out = sentinel_view(ref.shape, t, order=_order(len(shape)))
        function(x, out, _avg_params(function, x, out, pd, k, s, p, include, divisor), threads=out.numel(),
                 group_size=64)
        label = f"{tuple(shape)} pooling_dims={pd} k={k} s={s} p={p} ceil={ceil} include_pad={include} divisor={divisor}"
        problem = _problem(storage, out, ref, None if is_integral(t) else "math")
        if problem:
            return f"{label}: {problem}"
    return None


def _max_pool_backward(function, t, gen):
    params_arg = argument(function, "params")
    for shape, k, s, p, d, ceil in _MAX_CASES:
        x = _transposed(_distinct(shape, t, gen))
        ref_out, ref_idx = torch.ops.aten.max_pool3d_with_indices(x.double(), k, s, p, d, ceil)
        grad = _transposed(_unit(ref_out.shape, t, gen))
        idx = _transposed(ref_idx)
        storage, gin = sentinel_view(shape, t, order=_order(len(shape)), initial=torch.zeros(shape, dtype=t))
        params = pack(params_arg, dict(dims=len(shape), pooling_dims=3, grad_input_sizes=gin.shape,
                                       grad_input_strides=gin.stride(), grad_output_sizes=grad.shape,
                                       grad_output_strides=grad.stride(), indices_strides=idx.stride()))
        function(gin, grad, idx, params, threads=grad.numel(), group_size=64)
        ref = torch.ops.aten.max_pool3d_with_indices_backward(grad.double(), x.double(), k, s, p, d, ceil, ref_idx)
        problem = _problem(storage, gin, ref, "math")
        if problem:
            return f"{tuple(shape)} k={k} s={s} p={p} d={d} ceil={ceil}: {problem}"
    return None


def _avg_pool_backward(function, t, gen):
    for shape, pd, k, s, p, ceil, include, divisor in _AVG_CASES:
        x = _distinct(shape, t, gen)
        out_shape = torch.ops.aten.avg_pool3d(x.double(), k, s, p, ceil, include, divisor).shape
        grad = _transposed(_unit(out_shape, t, gen))
        storage, gin = sentinel_view(shape, t, order=_order(len(shape)), initial=torch.zeros(shape, dtype=t))
        params = _avg_params(function, gin, grad, pd, k, s, p, include, divisor)
        function(gin, grad, params, threads=grad.numel(), group_size=64)
        ref = torch.ops.aten.avg_pool3d_backward(grad.double(), x.double(), k, s, p, ceil, include, divisor)
        problem = _problem(storage, gin, ref, "math")
        if problem:
            return f"{tuple(shape)} k={k} s={s} p={p} ceil={ceil} include_pad={include} divisor={divisor}: {problem}"
    return None


def _max_unpool(function, t, gen):
    params_arg = argument(function, "params")
    # (output shape, pooling dims, input pooling sizes)
    for out_shape, pd, in_pool in (((2, 3, 4, 5, 6), 3, (2, 3, 2)), ((2, 3, 6, 5), 2, (3, 2)), ((3, 6, 7), 2, (2, 4))):
        lead = out_shape[:len(out_shape) - pd]
        planes = 1
        for s_ in lead:
            planes *= s_
        plane = 1
        for s_ in out_shape[len(lead):]:
            plane *= s_
        count = 1
        for s_ in in_pool:
            count *= s_
        in_shape = tuple(lead) + tuple(in_pool)
        index = torch.stack([torch.randperm(plane, generator=gen)[:count] for _ in range(planes)]).reshape(in_shape)
        idx = _transposed(index)
        x = _transposed(_distinct(in_shape, t, gen))
        storage, out = sentinel_view(out_shape, t, order=_order(len(out_shape)), initial=torch.zeros(out_shape, dtype=t))
        errors = torch.zeros(argument(function, "error_buffer").type_size, dtype=torch.uint8)
        params = pack(params_arg, dict(dims=len(out_shape), pooling_dims=pd, input_sizes=x.shape,
                                       input_strides=x.stride(), output_sizes=out.shape, output_strides=out.stride(),
                                       indices_strides=idx.stride()))
        function(out, x, idx, params, errors, threads=x.numel(), group_size=64)
        w = torch.float64  # CPU max_unpool has no integer kernels; every value here is exact in float64
        if pd == 3:
            ref = torch.ops.aten.max_unpool3d(x.to(w), index, out_shape[-3:], (1, 1, 1), (0, 0, 0))
        else:
            ref = torch.ops.aten.max_unpool2d(x.to(w), index, out_shape[-2:])
        label = f"output {tuple(out_shape)} pooling_dims={pd}"
        if errors[:4].view(torch.int32).item() != 0:
            return f"{label}: reported an error for valid indices"
        problem = _problem(storage, out, ref, None)
        if problem:
            return f"{label}: {problem}"
    return None


def check(function, device: str) -> Tuple[str, str]:
    op, _, t = parse(function.name)
    gen = generator(function.name)
    run = {"max_pool": _max_pool, "avg_pool": _avg_pool, "max_pool_backward": _max_pool_backward,
           "avg_pool_backward": _avg_pool_backward, "max_unpool": _max_unpool}.get(op)
    if run is None:
        raise NoHarness(op)
    problem = run(function, t, gen)
    return ("wrong", problem) if problem else ("correct", "")

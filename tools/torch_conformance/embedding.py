"""PyTorch's ``embedding_dense_backward`` kernels (Embedding.metal), as Embedding.mm calls them.

``EmbeddingDenseBackwardParams``: the index tensor's sizes (``outer_sizes``), grad's and
indices' strides along them (elements), grad's feature stride, the index rank, the
feature size, padding_idx (-1: none), scale_grad_by_freq. An outer position decomposes
over ``outer_sizes`` with the last dimension fastest.

* ``embedding_dense_backward_count_<I>_<32|64>``: indices, counts (atomic uint, zeroed);
  indices.numel() threads, each counting its index unless it is padding_idx.
  Reference: ``torch.bincount`` of the non-padding indices; exact.
* ``embedding_dense_backward_<T>_<I>_<32|64>``: grad, indices, counts, grad_weight
  (zeroed), params; indices.numel() * feature_size threads, each adding its grad element
  (divided by its index's count under scale_grad_by_freq) into row ``index``. In torch
  2.13's AIR grad_weight is a float accumulator for every T (``air.atomic.global.add.f32``
  after ``fpext``, no ``fptrunc``: half and bfloat grads are summed in float, the host
  converts afterwards), so it binds as float32. Reference:
  ``aten.embedding_dense_backward`` in float64, within "math" of float32 (sums in any
  order). The ``_32``/``_64`` suffix is the width of the kernel's offsets only.

grad is transposed in memory, indices strided; grad_weight and counts lie in sentinel storage.
"""

import re
from typing import Optional, Tuple

import torch

from .buffers import exact, sentinel_view, untouched
from .compare import mismatch
from .dtypes import METAL_DTYPES
from .inputs import generator
from .structs import argument, pack

_NAME = re.compile(r"^embedding_dense_backward_(?:(count)|(float|half|bfloat))_(int|long)_(32|64)$")
_INDEX = {"int": torch.int32, "long": torch.int64}
# (index shape, feature size, num weights, padding_idx, scale_grad_by_freq)
_CASES = [((3, 5), 6, 7, -1, False), ((4, 3), 5, 6, 2, True), ((2, 3, 4), 3, 5, 0, False), ((9,), 4, 4, -1, True)]


def parse(name: str) -> Optional[Tuple]:
    match = _NAME.match(name)
    if not match:
        return None
    count, t, i, _ = match.groups()
    return ("embedding_dense_backward" + ("_count" if count else ""), None if count else METAL_DTYPES[t], _INDEX[i])


def check(function, device: str) -> Tuple[str, str]:
    op, t, it = parse(function.name)
    gen = generator(function.name)
    params_arg = argument(function, "params")
    for shape, features, num_weights, padding_idx, scale in _CASES:
        label = f"indices {shape} features={features} weights={num_weights} padding_idx={padding_idx} scale={scale}"
        index = torch.randint(0, num_weights, shape, generator=gen)
        base = torch.zeros((2,) + shape, dtype=it)
        base[1] = index.to(it)
        idx = base[1].transpose(0, -1).contiguous().transpose(0, -1) if len(shape) > 1 else base[1]
        ndim = len(shape)
        grad_full = (torch.rand(shape + (features,), generator=gen, dtype=torch.float64) * 2 - 1)
        grad = grad_full.to(t or torch.float32).transpose(0, -1).contiguous().transpose(0, -1)
        params = pack(params_arg, dict(outer_sizes=shape, grad_outer_strides=grad.stride()[:ndim],
                                       indices_strides=idx.stride(), grad_feature_stride=grad.stride(-1),
                                       outer_ndim=ndim, feature_size=features, padding_idx=padding_idx,
                                       scale_grad_by_freq=scale))
        kept = index.flatten()[index.flatten() != padding_idx]
        counts_ref = torch.bincount(kept, minlength=num_weights).to(torch.int32)
        if op.endswith("count"):
            storage, counts = sentinel_view((num_weights,), torch.int32, initial=torch.zeros(num_weights, dtype=torch.int32))
            function(idx, counts, params, threads=index.numel(), group_size=32)
            problem = "wrote outside its output" if not untouched(storage, counts) else exact(counts, counts_ref)
        else:
            storage, gw = sentinel_view((num_weights, features), torch.float32,
                                        initial=torch.zeros(num_weights, features))
            function(grad, idx, counts_ref, gw, params, threads=index.numel() * features, group_size=32)
            ref = torch.ops.aten.embedding_dense_backward(grad.double(), index, num_weights, padding_idx, scale)
            problem = "wrote outside its output" if not untouched(storage, gw) else mismatch(gw, ref, "math")
        if problem:
            return "wrong", f"{label}: {problem}"
    return "correct", ""

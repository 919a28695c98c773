"""What the harnesses share: outputs inside sentinel-filled storage, exact comparisons, and
the other kernels a multi-pass host sequence calls.

An output is a view (any strides, gaps between its elements) of a storage whose every byte
starts as 0xA5: after the call, every byte no element of the view covers must still be 0xA5.
"""

import math
from typing import Optional, Sequence

import torch

from .dtypes import is_complex

SENTINEL = 0xA5
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bindable(t: torch.Tensor) -> torch.Tensor:
    """Complex tensors bind as their (real, imaginary) pairs: Metal's float2 and half2."""
    return torch.view_as_real(t) if is_complex(t.dtype) else t


def sentinel_view(shape: Sequence[int], dtype: torch.dtype, order: Optional[Sequence[int]] = None,
                  gap: int = 1, pad: int = 16, initial: Optional[torch.Tensor] = None):
    """(storage, view): a view of `shape` whose dimensions lie in storage outermost-first in
    `order` (default: contiguous), every `gap`-th element of it, `pad` elements from both ends.
    The view holds `initial` where given, else the sentinel."""
    order = list(order) if order is not None else list(range(len(shape)))
    count = math.prod(shape)
    storage = torch.empty(count * gap + 2 * pad, dtype=dtype)
    storage.view(torch.uint8).fill_(SENTINEL)
    permuted = [shape[i] for i in order]
    inverse = [order.index(i) for i in range(len(shape))]
    view = storage.as_strided(permuted, _contiguous_strides(permuted, gap), pad).permute(*inverse)
    if initial is not None:
        view.copy_(initial)
    return storage, view


def zeroed_between_sentinels(count: int, dtype: torch.dtype, device: str = "cpu", pad: int = 16):
    """(storage, view): `count` zeros on `device` with `pad` sentinel elements each side;
    `untouched(storage.cpu(), view)` checks the margins afterwards."""
    storage, _ = sentinel_view((count,), dtype, pad=pad, initial=torch.zeros(count, dtype=dtype))
    storage = storage.to(device)
    return storage, storage[pad:pad + count]


def _contiguous_strides(shape, step=1):
    strides, s = [], step
    for size in reversed(shape):
        strides.insert(0, s)
        s *= size
    return strides


def untouched(storage: torch.Tensor, view: torch.Tensor) -> bool:
    """Whether every byte of `storage` outside `view`'s elements still holds the sentinel."""
    outside = torch.ones(storage.numel(), dtype=torch.bool)
    if view.numel():
        outside.as_strided(view.shape, view.stride(), view.storage_offset()).fill_(False)
    raw = storage.view(torch.uint8).view(storage.numel(), storage.element_size())
    return bool((raw[outside] == SENTINEL).all())


# Float products accumulated with a compare-and-swap loop (``atomic_compare_exchange`` on
# ``atomic<float>``): Apple's compiler tests the exchange's success as ``fcmp ueq found,
# expected``, which calls 0.0 and -0.0 equal. When another thread turns a zero's sign while
# one multiplies, that one's factor is dropped (a bitwise exchange) or applied to the old
# sign (a float one): the zero's magnitude is right, its sign depends on which thread came
# first, on an Apple GPU as on CUDA. Their results are compared with zeros of either sign.
ATOMIC_PRODUCT_ZEROS = "either sign of zero (atomic float products)"


def bits(t: torch.Tensor) -> torch.Tensor:
    """`t`'s elements as integers of the same size: bit patterns, for exact comparisons."""
    t = t.contiguous()
    return t.view(_BITS[t.element_size()]).to(torch.int64).flatten()


def exact(actual: torch.Tensor, expected: torch.Tensor, zero_sign: bool = True) -> Optional[str]:
    """None when `actual` holds bit for bit `expected` converted to `actual`'s dtype; else why.
    NaNs match any NaN: their sign and payload are not part of any op's meaning. Where not
    `zero_sign`, 0.0 and -0.0 match (ATOMIC_PRODUCT_ZEROS)."""
    a, e = bits(actual), bits(expected.to(actual.dtype))
    differ = a != e
    if not zero_sign and actual.dtype.is_floating_point:
        differ &= ~((actual.contiguous().flatten() == 0) & (expected.to(actual.dtype).contiguous().flatten() == 0))
    if actual.dtype.is_floating_point or is_complex(actual.dtype):
        nan = lambda t: (torch.view_as_real(t) if is_complex(t.dtype) else t).contiguous().flatten()  # noqa: E731
        both = nan(actual).isnan() & nan(expected.to(actual.dtype)).isnan()
        if is_complex(actual.dtype):  # a NaN part of a complex element: compare the parts
            a, e = nan(actual).to(torch.float64), nan(expected.to(actual.dtype)).to(torch.float64)
            differ = (a != e) & ~both
        else:
            differ &= ~both
    bad = differ.nonzero().flatten()
    if len(bad) == 0:
        return None
    i = int(bad[0])
    flat_a, flat_e = actual.contiguous().flatten(), expected.to(actual.dtype).contiguous().flatten()
    return (f"{len(bad)} of {a.numel()} differ; first at {i}: got {flat_a[i].item()!r}, "
            f"expected {flat_e[i].item()!r}")


def strides_bytes(t: torch.Tensor):
    return [s * t.element_size() for s in t.stride()]


def sibling(function, name: str):
    """The kernel called `name` in `function`'s library (`function` itself for its own name):
    another pass of the host's sequence. NoHarness where the library lacks it (a subset)."""
    from .elementwise import NoHarness  # here: elementwise imports this module
    if name == function.name:
        return function
    try:
        return function.library[name]
    except (KeyError, AttributeError) as missing:
        raise NoHarness(f"the host pairs it with {name}, which this library lacks") from missing

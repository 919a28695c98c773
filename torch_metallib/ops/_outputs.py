"""How an operator allocates the tensors it returns: ``ops.like`` and ``ops.empty``.

The same rule allocates outputs in the native kernel and builds the fake (meta) kernel
that ``torch.compile`` and ``torch.export`` trace with.
"""

from typing import Optional, Sequence, Union

import torch

from ..errors import DispatchError, TorchMetallibError
from ._rules import Rule, as_rule

__all__ = ["Output", "like", "empty"]


class Output:
    """An output allocation rule; build it with :func:`like` or :func:`empty`."""

    __slots__ = ("shape_like", "shape", "dtype_like", "dtype")

    def __init__(self, shape_like: Optional[str], shape: tuple, dtype_like: Optional[str],
                 dtype: Optional[torch.dtype]):
        self.shape_like = shape_like  # argument name, or None for `shape`
        self.shape = shape            # rules
        self.dtype_like = dtype_like  # argument name, or None for `dtype`
        self.dtype = dtype

    def __repr__(self):
        shape = f"like {self.shape_like}" if self.shape_like else "(" + ", ".join(r.text for r in self.shape) + ")"
        dtype = f"dtype of {self.dtype_like}" if self.dtype_like else str(self.dtype)
        return f"Output({shape}, {dtype})"

    def allocate(self, values: dict) -> torch.Tensor:
        """A new (fake, when tracing) tensor for arguments `values` (name -> value)."""
        like = values[self.shape_like] if self.shape_like else None
        shape = like.shape if like is not None else [rule.evaluate(values) for rule in self.shape]
        for rule, extent in zip(self.shape, shape):
            if isinstance(extent, int) and extent < 0:
                raise DispatchError(f"output shape: {rule.text} is {extent}, below 0")
        dtype = values[self.dtype_like].dtype if self.dtype_like else self.dtype
        device = next((v.device for v in values.values() if isinstance(v, torch.Tensor)), None)
        return torch.empty(shape, dtype=dtype, device=device)


def like(name: str, dtype: Optional[torch.dtype] = None) -> Output:
    """An output with the shape of tensor argument `name`, and its dtype unless `dtype` is
    given (contiguous, uninitialized until the kernel writes it)."""
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise TorchMetallibError(f"ops.like({name!r}): dtype must be a torch.dtype, got {dtype!r}")
    return Output(name, (), None if dtype is not None else name, dtype)


def empty(shape: Sequence[Union[Rule, int]], dtype: Union[torch.dtype, str]) -> Output:
    """An output of `shape` (rules or ints, e.g. ``(size("x", 0),)``) and `dtype`: a
    torch.dtype, or the name of a tensor argument whose dtype it takes."""
    if isinstance(shape, (Rule, int)):
        shape = (shape,)
    rules = tuple(as_rule(extent) for extent in shape)
    if isinstance(dtype, str):
        return Output(None, rules, dtype, None)
    if not isinstance(dtype, torch.dtype):
        raise TorchMetallibError(f"ops.empty: dtype must be a torch.dtype or an argument name, got {dtype!r}")
    return Output(None, rules, None, dtype)

"""Checked execution, as a caller asks for it: ``fn(..., checked=True)``, the context
manager ``torch_metallib.checked()``, or ``TORCH_METALLIB_CHECKED=1`` in the environment.
A backend that supports it bounds-checks every access of the kernel against the memory
the call bound and raises ``KernelMemoryError`` for one outside it (the CPU backend:
backends/cpu/bounds_checks.py); a backend without checks runs as usual.

A tensor argument is bounded by its view (the bytes its sizes and strides reach), since
a slice's neighbours are usually other slices. A kernel that indexes past a view on
purpose names the argument in ``storage_bounds`` (``fn(..., storage_bounds={"out"})``, or
``checked(storage_bounds=...)`` for every kernel of a block that has such an argument),
and that argument is bounded by its storage instead.

Checked calls can also report reads of threadgroup memory that no thread of the threadgroup
has written in the launch (the CPU backend's threadgroup initcheck), with
``checked(initcheck=True)`` or ``TORCH_METALLIB_INITCHECK=1``; it is a switch of its own,
as compute-sanitizer's initcheck is a tool of its own, since some correct kernels read slots
they never wrote and discard what they read."""

import contextlib
import contextvars
from typing import FrozenSet, Optional

from .. import _C, config
from ..errors import KernelArgumentError

__all__ = ["checked", "checked_requested", "initcheck_requested", "storage_bounds_requested", "block_storage_bounds",
           "ENVIRONMENT_VARIABLE"]

ENVIRONMENT_VARIABLE = config.CHECKED.name
_context = contextvars.ContextVar("torch_metallib_checked", default=None)
_storage_bounds = contextvars.ContextVar("torch_metallib_storage_bounds", default=frozenset())
_initcheck = contextvars.ContextVar("torch_metallib_initcheck", default=None)


@contextlib.contextmanager
def checked(enabled: bool = True, storage_bounds=(), initcheck: Optional[bool] = None):
    """Kernel calls inside the block run checked (or, with False, unchecked).

    `storage_bounds`: argument names (a str or a collection of them) bounded by their
    storage rather than their view in each kernel of the block that has them; they add to
    an enclosing block's. `initcheck`: True also reports threadgroup memory read before
    any thread of the threadgroup wrote it (None: as the enclosing block, else
    TORCH_METALLIB_INITCHECK, default off)."""
    names = _names(storage_bounds)
    initcheck_token = _initcheck.set(bool(initcheck)) if initcheck is not None else None
    token = _context.set(bool(enabled))
    storage_token = _storage_bounds.set(_storage_bounds.get() | names) if names else None
    if enabled:  # native launchers leave calls to the full path while any such block is open
        _C.add_checked_blocks(1)
    try:
        yield
    finally:
        if enabled:
            _C.add_checked_blocks(-1)
        if storage_token is not None:
            _storage_bounds.reset(storage_token)
        _context.reset(token)
        if initcheck_token is not None:
            _initcheck.reset(initcheck_token)


def _names(value) -> FrozenSet[str]:
    items = (value,) if isinstance(value, str) else value
    try:
        names = frozenset(items)
    except TypeError:
        names = None
    if names is None or not all(isinstance(n, str) for n in names):
        raise KernelArgumentError(f"checked: storage_bounds: expected argument names, got {value!r}. "
                                  f"Pass e.g. storage_bounds={{'out'}}")
    return names


# The enclosing blocks' storage_bounds names: a call looks here first (a few tens of ns)
# and asks storage_bounds_requested only when there are some.
block_storage_bounds = _storage_bounds.get


def storage_bounds_requested(explicit, argument_names: FrozenSet[str]):
    """The call's own `storage_bounds` (the binding plan refuses names the kernel lacks),
    with the enclosing blocks' names that the kernel has; None when there are none."""
    inherited = _storage_bounds.get()
    if not inherited:
        return explicit
    mine = inherited & argument_names
    if explicit is None or not mine:
        return explicit if explicit is not None else (tuple(mine) or None)
    return tuple(mine) + ((explicit,) if isinstance(explicit, str) else tuple(explicit))


def initcheck_requested() -> bool:
    """Whether checked calls also report unwritten threadgroup memory: the innermost
    checked() block that says, then the environment."""
    value = _initcheck.get()
    return config.INITCHECK.get() if value is None else value


def checked_requested(explicit: Optional[bool]) -> bool:
    """The call's own `checked=` wins, then the innermost checked() block, then the environment."""
    if explicit is not None:
        return bool(explicit)
    value = _context.get()
    if value is not None:
        return value
    return config.CHECKED.get()

"""Checked execution, as a caller asks for it: ``fn(..., checked=True)``, the context
manager ``torch_metallib.checked()``, or ``TORCH_METALLIB_CHECKED=1`` in the environment.
A backend that supports it bounds-checks every access of the kernel against the memory
the call bound and raises ``KernelMemoryError`` for one outside it (the CPU backend:
backends/cpu/bounds_checks.py); a backend without checks runs as usual."""

import contextlib
import contextvars
import os
from typing import Optional

__all__ = ["checked", "checked_requested", "ENVIRONMENT_VARIABLE"]

ENVIRONMENT_VARIABLE = "TORCH_METALLIB_CHECKED"
_context = contextvars.ContextVar("torch_metallib_checked", default=None)


@contextlib.contextmanager
def checked(enabled: bool = True):
    """Kernel calls inside the block run checked (or, with False, unchecked)."""
    token = _context.set(bool(enabled))
    try:
        yield
    finally:
        _context.reset(token)


def checked_requested(explicit: Optional[bool]) -> bool:
    """The call's own `checked=` wins, then the innermost checked() block, then the environment."""
    if explicit is not None:
        return bool(explicit)
    value = _context.get()
    if value is not None:
        return value
    return os.environ.get(ENVIRONMENT_VARIABLE, "").strip().lower() in ("1", "true", "yes", "on")

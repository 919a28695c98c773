"""Turning what a user passes to `load` into a read-only, zero-copy byte view."""

import mmap
import os

from ..errors import MetallibFormatError

__all__ = ["open_source"]


def open_source(src):
    """Returns ``(view, description)``: a read-only byte memoryview over `src` and a short
    text naming it for messages. Paths are memory-mapped, never read into memory; buffers
    (bytes, bytearray, memoryview, mmap, any contiguous byte buffer) are not copied.

    The view keeps its owner (the bytes object or the mmap) alive.
    """
    if isinstance(src, (str, os.PathLike)):
        return _map_file(os.fspath(src)), f"file {os.fspath(src)!r}"
    try:
        view = memoryview(src)
    except TypeError:
        raise TypeError(
            "torch_metallib.load: expected bytes, bytearray, memoryview, mmap or a path "
            f"(str or os.PathLike); got {type(src).__name__}"
        ) from None
    if not view.c_contiguous:
        raise TypeError("torch_metallib.load: the buffer is not contiguous; pass bytes(buffer)")
    if view.itemsize != 1 or view.ndim != 1:
        view = view.cast("B")
    return view.toreadonly(), f"{type(src).__name__} of {view.nbytes} bytes"


def _map_file(path):
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        if size == 0:
            raise MetallibFormatError(
                f"metallib: header at byte offset 0: expected at least 88 bytes, got 0 bytes "
                f"(file {path!r} is empty). The file is truncated, corrupt or not a .metallib.",
                offset=0,
                field="header",
            )
        # The mapping stays valid after the file object is closed.
        mapping = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    return memoryview(mapping)

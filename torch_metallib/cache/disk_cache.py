"""The on-disk cache shared by the JIT (compiled objects) and calls (argument tables).

Root: ``$TORCH_METALLIB_CACHE_DIR``, else ``$XDG_CACHE_HOME/torch_metallib``, else
``~/.cache/torch_metallib``; ``TORCH_METALLIB_CACHE=0`` turns it off. Each entry is
``magic, u64 payload length, SHA-256 of the payload, payload``, written to a temporary
file and renamed into place, so readers never see half an entry and concurrent writers
of the same entry just replace identical files. A truncated or corrupt entry reads as
missing and is removed, so it is rebuilt.
"""

import hashlib
import os
import struct
from typing import Optional

__all__ = ["user_cache_root", "cache_directory", "read_entry", "write_entry"]

_MAGIC = b"TMCACHE1"
_HEADER = len(_MAGIC) + 8 + 32


def user_cache_root() -> str:
    """``$XDG_CACHE_HOME/torch_metallib``, else ``~/.cache/torch_metallib``."""
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
                        "torch_metallib")


def cache_directory(kind: str) -> Optional[str]:
    """The directory for `kind` ("jit", "calls"), or None when the disk cache is off."""
    if os.environ.get("TORCH_METALLIB_CACHE", "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    return os.path.join(os.environ.get("TORCH_METALLIB_CACHE_DIR") or user_cache_root(), kind)


def read_entry(path: str) -> Optional[bytes]:
    """The payload stored at `path`; None if missing, truncated or corrupt (then removed)."""
    try:
        with open(path, "rb") as file:
            data = file.read()
    except OSError:
        return None
    if len(data) >= _HEADER and data.startswith(_MAGIC):
        (size,) = struct.unpack_from("<Q", data, len(_MAGIC))
        payload = data[_HEADER:]
        if len(payload) == size and hashlib.sha256(payload).digest() == data[len(_MAGIC) + 8:_HEADER]:
            return payload
    try:
        os.remove(path)
    except OSError:
        pass
    return None


def write_entry(path: str, payload: bytes) -> None:
    """Stores `payload` at `path` atomically; a failure (full disk, read-only home) only
    costs the cache entry, never the call."""
    import tempfile  # only when writing: it is slow to import on a warm start

    temporary = None
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
        with os.fdopen(fd, "wb") as file:
            file.write(_MAGIC + struct.pack("<Q", len(payload)) + hashlib.sha256(payload).digest() + payload)
        os.replace(temporary, path)
    except OSError:
        if temporary is not None:
            try:
                os.remove(temporary)
            except OSError:
                pass

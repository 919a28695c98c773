"""The on-disk cache shared by the JIT (compiled objects) and calls (argument tables).

Root: ``$TORCH_METALLIB_CACHE_DIR``, else ``$XDG_CACHE_HOME/torch_metallib``, else
``~/.cache/torch_metallib``; ``TORCH_METALLIB_CACHE=0`` turns it off.

An entry is ``magic, u32 key length, key, u64 payload length, SHA-256 of key and payload,
payload``: it names the full key it was written for (the file name is only a digest of
it), so an entry copied or renamed onto another key reads as missing. Entries are written
to a temporary file and renamed into place, so readers never see half an entry and
concurrent writers of the same entry replace identical files. Whatever is at an entry's
path that is not such an entry for that key (truncated, corrupt, another key's, a FIFO, a
directory) reads as missing and is removed where possible, so the caller rebuilds it.
A cache directory that cannot be read or written is skipped with one warning: calls never fail or
hang on it.
"""

import errno
import hashlib
import os
import stat
import struct
import time
import warnings
from typing import Optional

from .. import config
from ..diagnostics import get_logger

__all__ = ["user_cache_root", "cache_directory", "read_entry", "write_entry"]

_MAGIC = b"TMCACHE2"
_warned = set()


def user_cache_root() -> str:
    """``$XDG_CACHE_HOME/torch_metallib``, else ``~/.cache/torch_metallib``."""
    return os.path.join(config.XDG_CACHE_HOME.get() or os.path.join(os.path.expanduser("~"), ".cache"),
                        "torch_metallib")


def cache_directory(kind: str) -> Optional[str]:
    """The directory for `kind` ("jit", "calls"), or None when the disk cache is off."""
    if not config.CACHE.get():
        return None
    return os.path.join(config.CACHE_DIR.get() or user_cache_root(), kind)


def _warn_once(path: str, what: str, error: OSError) -> None:
    directory = os.path.dirname(path)
    if directory not in _warned:
        _warned.add(directory)
        warnings.warn(f"torch_metallib cache: cannot {what} {directory} ({error.strerror or error}); running "
                      f"without it. Fix its permissions, or move it with TORCH_METALLIB_CACHE_DIR "
                      f"(TORCH_METALLIB_CACHE=0 turns it off)", RuntimeWarning, stacklevel=3)


def _digest(key: bytes, payload: bytes) -> bytes:
    return hashlib.sha256(struct.pack("<I", len(key)) + key + payload).digest()


def _decode(data: bytes, key: bytes) -> Optional[bytes]:
    head = len(_MAGIC) + 4
    if len(data) < head or not data.startswith(_MAGIC):
        return None
    (key_size,) = struct.unpack_from("<I", data, len(_MAGIC))
    if data[head:head + key_size] != key or len(data) < head + key_size + 8 + 32:
        return None
    at = head + key_size
    (size,) = struct.unpack_from("<Q", data, at)
    digest, payload = data[at + 8:at + 40], data[at + 40:]
    if len(payload) != size or _digest(key, payload) != digest:
        return None
    return payload


def read_entry(path: str, key: str) -> Optional[bytes]:
    """The payload stored at `path` for `key`; None if there is none (anything else found
    there is removed where possible)."""
    started = time.perf_counter()
    payload = _read_entry(path, key)
    get_logger().debug("disk cache %s: %s (%.1f ms)", "miss" if payload is None else "hit", path,
                       1000 * (time.perf_counter() - started))
    return payload


def _read_entry(path: str, key: str) -> Optional[bytes]:
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return None
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENXIO):  # a symlink or a socket: not ours
            _discard(path)
        else:
            _warn_once(path, "read", error)
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            payload = None
        else:
            with os.fdopen(fd, "rb", closefd=False) as file:
                payload = _decode(file.read(), key.encode())
    except OSError:
        payload = None
    finally:
        os.close(fd)
    if payload is None:
        _discard(path)
    return payload


def _discard(path: str) -> None:
    """Removes what is at `path` (an empty directory too); what cannot be removed stays,
    and the next write_entry reports it."""
    try:
        os.remove(path)
    except IsADirectoryError:
        try:
            os.rmdir(path)
        except OSError:
            pass
    except OSError:
        pass


def write_entry(path: str, key: str, payload: bytes) -> None:
    """Stores `payload` for `key` at `path` atomically; a failure (full disk, read-only
    home) only costs the cache entry, never the call."""
    import tempfile  # only when writing: it is slow to import on a warm start

    temporary = None
    encoded = key.encode()
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
        with os.fdopen(fd, "wb") as file:
            file.write(_MAGIC + struct.pack("<I", len(encoded)) + encoded + struct.pack("<Q", len(payload))
                       + _digest(encoded, payload) + payload)
        os.replace(temporary, path)
    except OSError as error:
        if temporary is not None:
            try:
                os.remove(temporary)
            except OSError:
                pass
        _warn_once(path, "write to", error)

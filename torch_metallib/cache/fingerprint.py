"""The fingerprint of the code that makes what the disk cache keeps.

Compiled kernels and call records are keyed by it, so a change to any module that lowers,
compiles or reflects kernels invalidates their entries without anyone bumping a version.
It is a SHA-256 of llvmlite's version and of one SHA-256 per folder whose code shapes an
entry, each over that folder's ``.py`` files by relative path and content: COMMON (reading
the file, reflection, call records and binding, AIR's meaning) for call records, and with it
the one backend's folder for that backend's compiled kernels, so editing the CUDA lowering
keeps the CPU's kernels (and the reverse). Operators, the library API and the command line
change no entry. Each folder is read and hashed once per process, so a backend's key after
the call records' costs only its own folder (~0.2 ms).
"""

import functools
import hashlib
import os
from typing import List, Tuple

import llvmlite

__all__ = ["code_fingerprint"]

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMON = ("air", "cache", "container", "dispatch", "reflection")


def _sources(folders: Tuple[str, ...]) -> List[Tuple[str, bytes]]:
    """(path relative to the package, bytes) of each ``.py`` file under `folders`, sorted."""
    found = []
    pending = [os.path.join(_PACKAGE, folder) for folder in folders]
    while pending:
        with os.scandir(pending.pop()) as entries:
            for entry in entries:
                if entry.is_dir():
                    if entry.name != "__pycache__":
                        pending.append(entry.path)
                elif entry.name.endswith(".py"):
                    with open(entry.path, "rb", buffering=0) as file:  # unbuffered: one read, no buffer
                        found.append((entry.path[len(_PACKAGE) + 1:].replace(os.sep, "/"), file.readall()))
    return sorted(found)


@functools.lru_cache(maxsize=None)
def _folder_digest(folder: str) -> bytes:
    """Once per process: the call records' key and each backend's share COMMON's folders."""
    digest = hashlib.sha256()
    for path, data in _sources((folder,)):
        digest.update(f"{path} {len(data)}\n".encode())
        digest.update(data)
    return digest.digest()


@functools.lru_cache(maxsize=None)
def code_fingerprint(backend: str = "") -> str:
    """The hex SHA-256 of COMMON's code, with `backend`'s folder (``cpu``, ``cuda``) where
    given, and of llvmlite's version."""
    digest = hashlib.sha256(f"llvmlite {llvmlite.__version__}\n".encode())
    for folder in COMMON + ((f"backends/{backend}",) if backend else ()):
        digest.update(f"{folder} ".encode() + _folder_digest(folder))
    return digest.hexdigest()


def clear_cache() -> None:
    """Forgets every digest (tests that edit a source in memory)."""
    _folder_digest.cache_clear()
    code_fingerprint.cache_clear()

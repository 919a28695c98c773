"""The fingerprint of the code that makes what the disk cache keeps.

Compiled kernels and call records are keyed by it, so a change to any module that lowers,
compiles or reflects kernels invalidates their entries without anyone bumping a version.
It is a SHA-256 of every ``.py`` file in the folders whose code shapes an entry, by
relative path and content, and of llvmlite's version: COMMON (reading the file, reflection,
call records and binding, AIR's meaning) for call records, and with it the one backend's
folder for that backend's compiled kernels, so editing the CUDA lowering keeps the CPU's
kernels (and the reverse). Operators, the library API and the command line change no
entry. Computed once per process and key (~2 ms).
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
    return sorted(item for folder in folders for item in _folder_sources(folder))


@functools.lru_cache(maxsize=None)
def _folder_sources(folder: str) -> Tuple[Tuple[str, bytes], ...]:
    """Read once per process: the call records' key and each backend's share COMMON."""
    found = []
    for root, folders, names in os.walk(os.path.join(_PACKAGE, folder)):
        folders[:] = [f for f in folders if f != "__pycache__"]
        for name in sorted(names):
            if name.endswith(".py"):
                path = os.path.join(root, name)
                with open(path, "rb") as file:
                    found.append((os.path.relpath(path, _PACKAGE).replace(os.sep, "/"), file.read()))
    return tuple(found)


@functools.lru_cache(maxsize=None)
def code_fingerprint(backend: str = "") -> str:
    """The hex SHA-256 of COMMON's code, with `backend`'s folder (``cpu``, ``cuda``) where
    given, and of llvmlite's version."""
    digest = hashlib.sha256(f"llvmlite {llvmlite.__version__}\n".encode())
    for path, data in _sources(COMMON + ((f"backends/{backend}",) if backend else ())):
        digest.update(f"{path} {len(data)}\n".encode())
        digest.update(data)
    return digest.hexdigest()

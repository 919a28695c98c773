"""The fingerprint of the code that makes what the disk cache keeps.

Compiled kernels and call records are keyed by it, so a change to any module that lowers,
compiles or reflects kernels invalidates their entries without anyone bumping a version.
It is a SHA-256 of every ``.py`` file in the folders whose code shapes an entry (COVERED:
reading the file, reflection, call records and binding, AIR's meaning and the backends'
lowering), by relative path and content, and of llvmlite's version; computed once per
process (~2 ms). Operators, the library API and the command line change no entry, so
editing them keeps the cache warm.
"""

import functools
import hashlib
import os
from typing import List, Tuple

import llvmlite

__all__ = ["code_fingerprint"]

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COVERED = ("air", "backends", "cache", "container", "dispatch", "reflection")


def _sources() -> List[Tuple[str, bytes]]:
    """(path relative to the package, bytes) of each ``.py`` file the fingerprint covers, sorted."""
    found = []
    for folder in COVERED:
        for root, folders, names in os.walk(os.path.join(_PACKAGE, folder)):
            folders[:] = [f for f in folders if f != "__pycache__"]
            for name in sorted(names):
                if name.endswith(".py"):
                    path = os.path.join(root, name)
                    with open(path, "rb") as file:
                        found.append((os.path.relpath(path, _PACKAGE).replace(os.sep, "/"), file.read()))
    return sorted(found)


@functools.lru_cache(maxsize=None)
def code_fingerprint() -> str:
    """The hex SHA-256 of the package's code (_sources) and llvmlite's version."""
    digest = hashlib.sha256(f"llvmlite {llvmlite.__version__}\n".encode())
    for path, data in _sources():
        digest.update(f"{path} {len(data)}\n".encode())
        digest.update(data)
    return digest.hexdigest()

"""The fingerprint of the code that makes what the disk cache keeps.

Compiled kernels and call records are keyed by it, so a change to any module that lowers,
compiles or reflects kernels invalidates their entries without anyone bumping a version.
It is a SHA-256 of every ``.py`` file of the installed package (but the command line's,
``cli/``), by relative path and content, and of llvmlite's version; computed once per
process (~2 ms).
"""

import functools
import hashlib
import os
from typing import List, Tuple

import llvmlite

__all__ = ["code_fingerprint"]

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SKIPPED = ("cli",)  # folders whose code never reaches a cache entry


def _sources() -> List[Tuple[str, bytes]]:
    """(path relative to the package, bytes) of each ``.py`` file the fingerprint covers, sorted."""
    found = []
    for root, folders, names in os.walk(_PACKAGE):
        folders[:] = [f for f in folders if f != "__pycache__" and not (root == _PACKAGE and f in _SKIPPED)]
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

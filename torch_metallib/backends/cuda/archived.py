"""The CUDA backend's side of ahead-of-time archives (cache/archive.py): PTX per
architecture (``cuda:sm_90``), which needs no GPU to build, looked up before the JIT."""

import functools
from typing import Optional

import llvmlite

from ...cache.archives import archives_for, warn_once
from ...cache.fingerprint import code_fingerprint

__all__ = ["cuda_toolchain", "ptx_form", "constants_text", "archived_ptx"]


@functools.lru_cache(maxsize=None)
def cuda_toolchain() -> str:
    return f"llvmlite {llvmlite.__version__} code {code_fingerprint('cuda')}"


def ptx_form(grid_only: bool) -> str:
    return "ptx+grid-only" if grid_only else "ptx"


def constants_text(constants: tuple) -> str:
    return repr(tuple(sorted(constants)))


def archived_ptx(function, constants: tuple, arch: str, grid_only: bool) -> Optional[bytes]:
    """The PTX of `function` with `constants` for `arch` from the first archive that has
    it for this toolchain; None otherwise."""
    target = f"cuda:{arch}"
    for archive in archives_for(function):
        found = archive.lookup(target, function.hash, constants_text(constants), ptx_form(grid_only))
        if found is None:
            continue
        entry, payload = found
        if entry.target.toolchain != cuda_toolchain():
            warn_once((archive.description, target, "toolchain"),
                      f"archive {archive.description}: its {target} PTX was built by another toolchain or "
                      f"torch_metallib version; expected '{cuda_toolchain()}', got '{entry.target.toolchain}'. "
                      f"Compiling instead; rebuild the archive with this version's `python -m torch_metallib "
                      f"precompile`")
            continue
        return payload
    return None

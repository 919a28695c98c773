"""The CUDA backend's side of ahead-of-time archives (cache/archive.py), looked up before
the JIT. Per architecture (``cuda:sm_90``) an archive holds PTX, which needs no GPU to
build, and, where ptxas was there to assemble it, the cubin (SASS) of the same PTX: a GPU
of exactly that architecture loads it without the driver compiling anything. The PTX stays
beside it for a driver that refuses the cubin and for other GPUs.

A cubin's target record carries the ptxas version after the PTX's toolchain, so which
assembler made it shows in every message about it."""

import functools
import os
import re
import struct
import subprocess
import tempfile
from typing import NamedTuple, Optional

import llvmlite

from ... import config
from ...cache.archives import archives_for, warn_once
from ...cache.fingerprint import code_fingerprint
from .ptx import ptxas_path

__all__ = ["cuda_toolchain", "cubin_toolchain", "ptx_form", "cubin_form", "constants_text", "archived_ptx",
           "archived_cubin", "ArchivedCubin", "ptxas_for_archives", "ptxas_version", "assemble_cubin",
           "cubin_problem"]


@functools.lru_cache(maxsize=None)
def cuda_toolchain() -> str:
    return f"llvmlite {llvmlite.__version__} code {code_fingerprint('cuda')}"


def cubin_toolchain(ptxas_version_text: str) -> str:
    """The toolchain of cubins assembled by that ptxas from this toolchain's PTX."""
    return f"{cuda_toolchain()} ptxas {ptxas_version_text}"


def ptx_form(grid_only: bool) -> str:
    return "ptx+grid-only" if grid_only else "ptx"


def cubin_form(grid_only: bool) -> str:
    return "cubin+grid-only" if grid_only else "cubin"


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
            _warn_toolchain(archive, target, "PTX", cuda_toolchain(), entry.target.toolchain)
            continue
        return payload
    return None


class ArchivedCubin(NamedTuple):
    image: bytes
    entry: str     # the kernel's entry point in it (lowering.entry_name: says whether it is coarsened)
    ptxas: str     # the version that assembled it
    archive: str   # the archive's description, for messages


def archived_cubin(function, constants: tuple, arch: str, grid_only: bool) -> Optional[ArchivedCubin]:
    """The cubin of `function` with `constants` for exactly `arch` from the first archive
    that has one for this toolchain (any ptxas); None otherwise."""
    target = f"cuda:{arch}"
    prefix = cubin_toolchain("")
    for archive in archives_for(function):
        found = archive.lookup(target, function.hash, constants_text(constants), cubin_form(grid_only))
        if found is None:
            continue
        entry, payload = found
        if not entry.target.toolchain.startswith(prefix):
            _warn_toolchain(archive, target, "cubins", prefix + "<version>", entry.target.toolchain)
            continue
        return ArchivedCubin(payload, entry.symbol, entry.target.toolchain[len(prefix):], archive.description)
    return None


def _warn_toolchain(archive, target: str, what: str, expected: str, got: str) -> None:
    warn_once((archive.description, target, what, "toolchain"),
              f"archive {archive.description}: its {target} {what} were built by another toolchain or "
              f"torch_metallib version; expected '{expected}', got '{got}'. Compiling instead; rebuild the "
              f"archive with this version's `python -m torch_metallib precompile`")


# --- building (precompile) -------------------------------------------------------------

def ptxas_for_archives():
    """(ptxas's path, None) where precompile can assemble cubins, else (None, why not)."""
    path = ptxas_path()
    if path is None:
        return None, "ptxas not found (not on PATH, in a CUDA toolkit or in triton; set PTXAS to name it)"
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        return None, f"ptxas {path} {'(PTXAS) ' if config.PTXAS.get() else ''}is not an executable file"
    return path, None


@functools.lru_cache(maxsize=None)
def ptxas_version(path: str) -> str:
    """ptxas's version as it prints it ("V13.0.88"), or its first line where it prints none."""
    said = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60).stdout
    found = re.search(r"\bV\d+\.\d+\.\d+\b", said)
    return found.group(0) if found else (said.strip().splitlines() or ["unknown"])[-1][:80]


def assemble_cubin(path: str, ptx: bytes, arch: str) -> bytes:
    """The cubin ptxas at `path` assembles from `ptx` for exactly `arch`; raises
    RuntimeError with ptxas's message where it refuses."""
    with tempfile.TemporaryDirectory() as folder:
        source, output = os.path.join(folder, "kernel.ptx"), os.path.join(folder, "kernel.cubin")
        with open(source, "wb") as f:
            f.write(ptx)
        done = subprocess.run([path, f"-arch={arch}", source, "-o", output], capture_output=True, text=True,
                              timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"ptxas -arch={arch} refused the PTX: {(done.stderr or done.stdout).strip()[:400]}")
        with open(output, "rb") as f:
            return f.read()


# --- loading: what the driver may be given ---------------------------------------------

_ELF_HEADER = struct.Struct("<16sHHIQQQIHHHHHH")  # ELF64: ident .. e_shstrndx (64 bytes)
_SECTION = struct.Struct("<IIQQQQIIQQ")            # ELF64 section header (64 bytes)
_SEGMENT = struct.Struct("<IIQQQQQQ")              # ELF64 program header (56 bytes)
_EM_CUDA, _SHT_NOBITS = 190, 8


def cubin_problem(image: bytes) -> Optional[str]:
    """Why `image` is not a cubin the driver can be given (None: it may be). The driver
    reads a cubin through its own headers and is given no length: every header, section
    and segment must lie inside the bytes, so that a damaged one is refused here, not read
    past its end."""
    if len(image) < _ELF_HEADER.size:
        return f"{len(image)} bytes, fewer than an ELF header's {_ELF_HEADER.size}"
    (ident, _, machine, _, _, phoff, shoff, _, ehsize, phentsize, phnum, shentsize, shnum,
     shstrndx) = _ELF_HEADER.unpack_from(image)
    if ident[:4] != b"\x7fELF" or ident[4] != 2 or ident[5] != 1:
        return f"not a 64-bit little-endian ELF file (it starts {ident[:6]!r})"
    if machine != _EM_CUDA or ehsize != _ELF_HEADER.size:
        return f"ELF machine {machine} and header size {ehsize}; a cubin has {_EM_CUDA} and {_ELF_HEADER.size}"
    for what, offset, size, count, layout in (("section", shoff, shentsize, shnum, _SECTION),
                                              ("program", phoff, phentsize, phnum, _SEGMENT)):
        if count and (size != layout.size or offset + count * size > len(image)):
            return f"{count} {what} headers of {size} bytes at {offset} do not fit in its {len(image)} bytes"
    if shnum and shstrndx >= shnum:
        return f"section name table {shstrndx} of {shnum} sections"
    for number in range(shnum):
        _, kind, _, _, offset, size, _, _, _, _ = _SECTION.unpack_from(image, shoff + number * _SECTION.size)
        if kind != _SHT_NOBITS and offset + size > len(image):
            return f"section {number}: {size} bytes at {offset}, past its {len(image)} bytes"
    for number in range(phnum):
        _, _, offset, _, _, size, _, _ = _SEGMENT.unpack_from(image, phoff + number * _SEGMENT.size)
        if offset + size > len(image):
            return f"segment {number}: {size} bytes at {offset}, past its {len(image)} bytes"
    return None

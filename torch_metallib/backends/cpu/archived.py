"""The CPU backend's side of ahead-of-time archives (cache/archive.py): the instruction
sets objects are built for, the toolchain an archive must share with this process, and
the lookup compile_kernel makes before it compiles.

Objects are built for a named x86-64 level, not the building machine, so an archive runs
on other machines. The default, ``x86-64-v3`` (AVX2, FMA, BMI2: every x86-64 server and
desktop CPU since 2013-2015), keeps the vector width and fused multiply-adds that the JIT
gives such a host, so a kernel from the archive computes what the JIT's would there; an
older CPU passes the entries over (one warning) and compiles as before.
"""

import functools
from typing import Optional, Tuple

import llvmlite
import llvmlite.binding as llvm

from ...cache.archives import archives_for, warn_once
from ...cache.fingerprint import code_fingerprint

__all__ = ["LEVELS", "DEFAULT_LEVEL", "cpu_toolchain", "host_cpu_features", "form_of", "archived_object"]

_V2 = ("cx16", "popcnt", "sahf", "sse3", "sse4.1", "sse4.2", "ssse3")
_V3 = _V2 + ("avx", "avx2", "bmi", "bmi2", "f16c", "fma", "lzcnt", "movbe", "xsave")
# The x86-64 levels (psABI) as LLVM's CPU names, with the features each needs of a host.
LEVELS = {
    "x86-64": ("sse2",),
    "x86-64-v2": _V2,
    "x86-64-v3": _V3,
    "x86-64-v4": _V3 + ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"),
}
DEFAULT_LEVEL = "x86-64-v3"


@functools.lru_cache(maxsize=None)
def cpu_toolchain() -> str:
    """What an archive's CPU objects must share with this process to be loaded here: LLVM,
    the target triple and the code that lowers kernels (not the host CPU: the target's
    level says what it needs)."""
    llvm.initialize_native_target()
    return (f"llvmlite {llvmlite.__version__} llvm {llvm.llvm_version_info} {llvm.get_process_triple()} "
            f"code {code_fingerprint('cpu')}")


@functools.lru_cache(maxsize=None)
def host_cpu_features():
    """LLVM's map of this CPU's features, read once (the JIT's target machine and the
    archive's level check both need it; each read costs about 0.2 ms)."""
    return llvm.get_host_cpu_features()


@functools.lru_cache(maxsize=None)
def _host_features() -> frozenset:
    return frozenset(name for name, on in host_cpu_features().items() if on)


def form_of(cooperative: bool, checked: bool, lanes: bool, initcheck: bool = True) -> str:
    """The archive form of a compile_kernel request (checked: with the threadgroup
    initcheck, or bounds only)."""
    checks = ("+checked" if initcheck else "+bounds-checked") if checked else ""
    return ("lanes" if lanes else "coroutines" if cooperative else "threads") + checks


def archived_object(function, constants: tuple, form: str) -> Optional[Tuple[bytes, str, str]]:
    """(object, its symbol, the archive's description) for `function` with `constants`
    in `form`, from the first archive that has it for this toolchain and a CPU level
    this host runs; None otherwise."""
    archives = archives_for(function)
    if not archives:
        return None
    constants_text = repr(constants)
    for archive in archives:
        for target in archive.targets:
            if not target.name.startswith("cpu:"):
                continue
            found = archive.lookup(target.name, function.hash, constants_text, form)
            if found is None:
                continue
            if target.toolchain != cpu_toolchain():
                warn_once((archive.description, target.name, "toolchain"),
                          f"archive {archive.description}: its {target.name} kernels were built by another "
                          f"toolchain or torch_metallib version; expected '{cpu_toolchain()}', got "
                          f"'{target.toolchain}'. Compiling instead; rebuild the archive with this version's "
                          f"`python -m torch_metallib precompile`")
                continue
            missing = sorted(set(target.features) - _host_features())
            if missing:
                warn_once((archive.description, target.name, "features"),
                          f"archive {archive.description}: its {target.name} kernels need CPU features this "
                          f"machine lacks ({', '.join(missing)}). Compiling instead; build an archive for a "
                          f"lower level (--target cpu:x86-64-v2) to use one here")
                continue
            entry, payload = found
            return payload, entry.symbol, archive.description
    return None

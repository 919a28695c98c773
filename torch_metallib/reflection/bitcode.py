"""Parsing a function's bitcode with LLVM without letting damaged bitcode kill the process.

LLVM's bitcode reader aborts on some malformed input ("LLVM ERROR: out of memory" for a
huge length field): a file whose HASHes were recomputed over damaged or crafted bitcode
reaches it. llvmlite's ``LLVMPY_ParseBitcode`` is therefore called through
``_C.parse_bitcode_guarded``, which turns such an abort (or fault) into an error. The LLVM
context it was parsing into is then left as it is (leaked): it may be half-built.
"""

import ctypes

import llvmlite.binding as llvm
from llvmlite.binding import ffi

from .. import _C
from ..errors import ReflectionError

__all__ = ["parse_bitcode"]

_entry_points = None


def _addresses():
    global _entry_points
    if _entry_points is None:
        lib = ffi.lib
        lib.LLVMPY_ParseBitcode  # loads the library on first use
        handle = lib._lib_handle
        _entry_points = tuple(ctypes.cast(getattr(handle, symbol), ctypes.c_void_p).value
                              for symbol in ("LLVMPY_ParseBitcode", "LLVMPY_DisposeString"))
    return _entry_points


def parse_bitcode(name: str, bitcode, context) -> llvm.ModuleRef:
    """`bitcode` (bytes-like) parsed into `context`, like ``llvm.parse_bitcode``.

    Raises:
        ReflectionError: LLVM cannot parse it, or aborted while trying (then `context` is
            detached: it must not be used or closed).
    """
    parse, dispose = _addresses()
    context_address = ctypes.cast(context, ctypes.c_void_p).value
    with ffi.lib._lock:
        module, message, stopped = _C.parse_bitcode_guarded(parse, dispose, context_address, bytes(bitcode))
    message = message.decode("utf-8", "backslashreplace")
    llvm_version = ".".join(map(str, llvm.llvm_version_info))
    if stopped:
        context.detach()
        raise ReflectionError(
            f"{name}: LLVM {llvm_version} (llvmlite) stopped with {stopped} while reading "
            f"the function's bitcode; the process continues. The bitcode is damaged although its HASH "
            f"matches (recomputed, or a crafted file): load only .metallib files you trust", function=name)
    if message or not module:
        detail = message.replace("LLVM bitcode parsing error\n", "").strip() or "no module"
        raise ReflectionError(
            f"{name}: LLVM {llvm_version} (llvmlite) cannot parse the function's bitcode: {detail}. The "
            f"module is corrupt or was written by a newer LLVM", function=name)
    return llvm.ModuleRef(ctypes.cast(module, ffi.LLVMModuleRef), context)

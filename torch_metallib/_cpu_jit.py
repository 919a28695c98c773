"""Compiles lowered kernels to host machine code with LLVM and caches the result.

Each compiled object gets its own MCJIT engine (one shared engine resolved a second
object's references into the first one's data). A compiled kernel is keyed by
content (DESIGN.md §3): the function's SHA-256 ``HASH``, its function-constant values,
the host target and the toolchain. Objects are cached in memory and on disk (under
``~/.cache/torch_metallib/jit``, ``$TORCH_METALLIB_CACHE_DIR`` to move it,
``TORCH_METALLIB_CACHE=0`` to turn it off). Entries are written atomically
(temporary file + rename) and carry their own SHA-256, so a corrupt or truncated entry
is detected, removed and rebuilt; concurrent processes at worst compile the same
kernel twice and rename identical files over each other.
"""

import ctypes
import hashlib
import os
import struct
import tempfile
import threading
from dataclasses import dataclass
from typing import Dict, Optional

import llvmlite
import llvmlite.binding as llvm

from ._cpu_lowering import lower

__all__ = ["CompiledKernel", "compile_kernel", "cache_directory"]

LOWERING_VERSION = 1  # bump when _cpu_lowering or _cpu_intrinsics change what they emit
_ENTRY_MAGIC = b"TMJIT001"


@dataclass(frozen=True)
class CompiledKernel:
    launcher: int       # address of __tm_launch_<symbol>
    serial: bool        # threadgroup variables are shared: run groups one at a time
    from_disk: bool


class _Host:
    """The host target machine, created on first use."""

    def __init__(self):
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        self.triple = llvm.get_process_triple()
        features = llvm.get_host_cpu_features().flatten()
        self.cpu = llvm.get_host_cpu_name()
        self.machine = llvm.Target.from_triple(self.triple).create_target_machine(
            cpu=self.cpu, features=features, opt=3, reloc="pic", codemodel="jitdefault")
        self.datalayout = str(self.machine.target_data)
        self.toolchain = (f"llvmlite {llvmlite.__version__} llvm {llvm.llvm_version_info} "
                          f"{self.triple} {self.cpu} {features} lowering {LOWERING_VERSION}")


_host: Optional[_Host] = None
_compiled: Dict[str, CompiledKernel] = {}
_engines = []  # every engine lives as long as the process: launchers point into them
_lock = threading.RLock()  # one compile at a time; llvmlite serializes LLVM calls anyway


def host() -> _Host:
    global _host
    with _lock:
        if _host is None:
            _host = _Host()
        return _host


def cache_directory() -> Optional[str]:
    """Where compiled kernels are kept on disk, or None when the disk cache is off."""
    if os.environ.get("TORCH_METALLIB_CACHE", "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    root = os.environ.get("TORCH_METALLIB_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "torch_metallib")
    return os.path.join(root, "jit")


def _cache_key(function_hash: str, constants: tuple) -> str:
    text = f"{function_hash}|{constants!r}|{host().toolchain}"
    return hashlib.sha256(text.encode()).hexdigest()


def _read_entry(path: str) -> Optional[bytes]:
    """The object stored at `path`, or None if it is missing, truncated or corrupt
    (in which case the file is removed so it is rebuilt)."""
    try:
        with open(path, "rb") as file:
            data = file.read()
    except OSError:
        return None
    header = len(_ENTRY_MAGIC) + 8 + 32
    if len(data) >= header and data.startswith(_ENTRY_MAGIC):
        (size,) = struct.unpack_from("<Q", data, len(_ENTRY_MAGIC))
        digest, payload = data[len(_ENTRY_MAGIC) + 8:header], data[header:]
        if len(payload) == size and hashlib.sha256(payload).digest() == digest:
            return payload
    try:
        os.remove(path)
    except OSError:
        pass
    return None


def _write_entry(path: str, payload: bytes) -> None:
    """Atomically stores `payload` at `path`; a failure only costs the cache entry."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
        with os.fdopen(fd, "wb") as file:
            file.write(_ENTRY_MAGIC + struct.pack("<Q", len(payload)) + hashlib.sha256(payload).digest() + payload)
        os.replace(temporary, path)
    except OSError:
        try:
            os.remove(temporary)
        except (OSError, UnboundLocalError):
            pass


def _build_object(function, constants: dict, symbol: str) -> bytes:
    machine = host()
    context = llvm.create_context()
    module = llvm.parse_bitcode(bytes(function.bitcode), context=context)
    text = lower(str(module), function.name, function.arguments, constants, symbol,
                 machine.triple, machine.datalayout)
    module = llvm.parse_assembly(text, context=context)
    module.verify()
    builder = llvm.create_pass_builder(machine.machine, llvm.create_pipeline_tuning_options(speed_level=3))
    builder.getModulePassManager().run(module, builder)
    return machine.machine.emit_object(module)


def compile_kernel(function, constants: tuple) -> CompiledKernel:
    """The compiled launcher of `function` with `constants` ((index, value) pairs)."""
    key = _cache_key(function.hash, constants)
    compiled = _compiled.get(key)
    if compiled is not None:
        return compiled
    with _lock:
        compiled = _compiled.get(key)
        if compiled is not None:
            return compiled
        machine = host()
        symbol = key[:24]
        directory = cache_directory()
        path = os.path.join(directory, f"{key}.o") if directory else None
        payload = _read_entry(path) if path else None
        from_disk = payload is not None
        if payload is None:
            payload = _build_object(function, dict(constants), symbol)
            if path:
                _write_entry(path, payload)
        engine = llvm.create_mcjit_compiler(
            llvm.parse_assembly(f'target triple = "{machine.triple}"'), machine.machine)
        _engines.append(engine)
        engine.add_object_file(llvm.ObjectFileRef.from_data(payload))
        init = engine.get_function_address(f"__tm_init_{symbol}")
        ctypes.CFUNCTYPE(None)(init)()  # the kernel's air.static_init constructors
        compiled = CompiledKernel(engine.get_function_address(f"__tm_launch_{symbol}"),
                                  serial=bool(function.threadgroup_variables), from_disk=from_disk)
        _compiled[key] = compiled
        return compiled

"""Compiles lowered kernels to host machine code with LLVM and caches the result.

Each compiled object gets its own MCJIT engine (one shared engine resolved a second
object's references into the first one's data). A compiled kernel is keyed by
content (DESIGN.md §3): the function's SHA-256 ``HASH``, its function-constant values,
the host target and the toolchain. Objects are cached in memory and on disk (``<cache>/jit``, see _disk_cache);
concurrent processes at worst compile the same kernel twice and rename identical files
over each other.
"""

import ctypes
import hashlib
import os
import threading
from dataclasses import dataclass
from typing import Dict, Optional

import llvmlite
import llvmlite.binding as llvm

from . import _C
from ._disk_cache import cache_directory, read_entry, write_entry

__all__ = ["CompiledKernel", "compile_kernel"]

LOWERING_VERSION = 2  # bump when _cpu_lowering or _cpu_intrinsics change what they emit


@dataclass(frozen=True)
class CompiledKernel:
    launcher: int       # address of __tm_launch_<symbol>, or __tm_thread_<symbol> if cooperative
    serial: bool        # threadgroup variables are shared: run groups one at a time
    cooperative: bool   # threads meet at barriers / SIMD-group functions: run as fibers
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
        for name, address in _C.runtime_symbols().items():  # what cooperative kernels call
            llvm.add_symbol(name, address)
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


def _cache_key(function_hash: str, constants: tuple) -> str:
    text = f"{function_hash}|{constants!r}|{host().toolchain}"
    return hashlib.sha256(text.encode()).hexdigest()


def _build_object(function, constants: dict, symbol: str, cooperative: bool) -> bytes:
    from ._cpu_lowering import lower  # only on a cache miss

    machine = host()
    # Modules are closed before their context, explicitly: if lowering raises, the
    # traceback would otherwise keep them for the cyclic collector, which may free the
    # context first (and LLVM then crashes freeing the module).
    context = llvm.create_context()
    modules = []
    try:
        modules.append(llvm.parse_bitcode(bytes(function.bitcode), context=context))
        text = lower(str(modules[0]), function.name, function.arguments, constants, symbol,
                     machine.triple, machine.datalayout, cooperative)
        modules.append(llvm.parse_assembly(text, context=context))
        module = modules[-1]
        module.verify()
        builder = llvm.create_pass_builder(machine.machine, llvm.create_pipeline_tuning_options(speed_level=3))
        builder.getModulePassManager().run(module, builder)
        return machine.machine.emit_object(module)
    finally:
        for module in modules:
            module.close()
        context.close()


def compile_kernel(function, constants: tuple, serial: bool, cooperative: bool) -> CompiledKernel:
    """The compiled launcher of `function` with `constants` ((index, value) pairs);
    `serial`: its threadgroups must run one at a time; `cooperative`: its threads meet."""
    key = _cache_key(function.hash, (constants, cooperative))
    compiled = _compiled.get(key)
    if compiled is not None:
        return compiled
    with _lock:
        compiled = _compiled.get(key)
        if compiled is not None:
            return compiled
        machine = host()
        symbol = key[:24]
        directory = cache_directory("jit")
        path = os.path.join(directory, f"{key}.o") if directory else None
        payload = read_entry(path) if path else None
        from_disk = payload is not None
        if payload is None:
            payload = _build_object(function, dict(constants), symbol, cooperative)
            if path:
                write_entry(path, payload)
        engine = llvm.create_mcjit_compiler(
            llvm.parse_assembly(f'target triple = "{machine.triple}"'), machine.machine)
        _engines.append(engine)
        engine.add_object_file(llvm.ObjectFileRef.from_data(payload))
        init = engine.get_function_address(f"__tm_init_{symbol}")
        ctypes.CFUNCTYPE(None)(init)()  # the kernel's air.static_init constructors
        entry = f"__tm_thread_{symbol}" if cooperative else f"__tm_launch_{symbol}"
        compiled = CompiledKernel(engine.get_function_address(entry), serial=serial,
                                  cooperative=cooperative, from_disk=from_disk)
        _compiled[key] = compiled
        return compiled

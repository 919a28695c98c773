"""NVVM IR -> PTX with llvmlite's NVPTX target, and CUDA's ``ptxas`` to check it.

A kernel is lowered (lowering.py), linked with libdevice where it calls libdevice's math
(everything but the entry then internal, so the unused library goes before O3 runs),
optimized at O3, its runs of consecutive global accesses versioned on their alignment at
run time (vector_accesses.py: NVPTX's code generation then merges the aligned copy's into
16-byte accesses), and emitted for one GPU architecture (``sm_80``, ``sm_90``...). The driver
compiles the PTX for the GPU it runs on (driver.py); ``ptxas`` does the same ahead of time
where CUDA's compiler is installed, which is how CI checks PTX without a GPU.
"""

import functools
import os
import re
import shutil
import subprocess
import tempfile
import threading
import warnings
from typing import Dict, FrozenSet

import llvmlite.binding as llvm

from torch_metallib import config, diagnostics
from ...reflection.ir_model import branches
from ...errors import UnsupportedKernelError
from ...reflection.bitcode import parse_bitcode
from .coarsening import COARSENING
from .libdevice import LIBDEVICE_FUNCTIONS, libdevice_path, needs_libdevice
from .lowering import TRIPLE, entry_name, lower
from .matrix_products import PLACEHOLDER
from .private_registers import private_arrays_in_registers
from .shared_alignment import proven_shared_alignment
from .shared_copies import versioned_shared_copies
from .tensor_core_products import tensor_core_products
from .toolkit import toolkit_files
from .vector_accesses import vector_accesses

__all__ = ["air_text", "kernel_ptx", "compile_ptx", "ptxas_path", "run_ptxas", "DEFAULT_ARCH"]

DEFAULT_ARCH = "sm_80"
_lock = threading.Lock()  # LLVM target machines are not shared between threads while emitting


@functools.lru_cache(maxsize=None)
def _machine(arch: str):
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    # Code generation at O2: O3 only adds a second GVN before instruction selection, which
    # took ~10% of the lowering and changed no arithmetic (48 of 58 MLX kernels' PTX
    # identical, the others 1-2 integer instructions shorter; ptxas's code the same).
    return llvm.Target.from_triple(TRIPLE).create_target_machine(cpu=arch, opt=2)


_context = None  # one LLVM context for every compile (under _lock): libdevice is parsed into it once
_libdevice = None  # libdevice cut to what use_libdevice can call (parsed and cut once per process)
_libdevice_parts: Dict[FrozenSet[str], bytes] = {}  # the functions a kernel calls -> libdevice cut to them


def _cut(module, keep) -> None:
    """Every function of `module` but those named in `keep` (and what they call) removed."""
    for function in module.functions:
        if not function.is_declaration and function.name not in keep:
            function.linkage = "internal"
    unused = llvm.create_new_module_pass_manager()
    unused.add_global_dead_code_eliminate_pass()
    unused.run(module, llvm.create_pass_builder(_machine(DEFAULT_ARCH), llvm.create_pipeline_tuning_options()))


def _libdevice_module(text: str, triple: str, data_layout: str):
    """The part of libdevice that module `text` calls (what those functions need included),
    cut once per set of functions from the library parsed once per process. The library is
    first cut to the functions the lowering can call (70 of its 464 KB): each later cut clones
    that, ~10 ms instead of ~70."""
    global _libdevice
    names = frozenset(re.findall(r"@(__nv_\w+)\(", text))
    part = _libdevice_parts.get(names)
    if part is None:
        if _libdevice is None:
            with open(libdevice_path(), "rb") as f:
                library = llvm.parse_bitcode(f.read(), context=_context)
            library.triple, library.data_layout = triple, data_layout
            _cut(library, LIBDEVICE_FUNCTIONS)
            _libdevice = library
        copy = _libdevice.clone()
        try:
            _cut(copy, names)
            part = _libdevice_parts[names] = copy.as_bitcode()
        finally:
            copy.close()
    return llvm.parse_bitcode(part, context=_context)


class _Straight(Exception):
    """compile_ptx stopped before code generation: the kernel is straight-line code."""


class _NoRuns(Exception):
    """compile_ptx stopped before code generation: no run of global accesses to merge."""


def compile_ptx(text: str, entry: str, arch: str = DEFAULT_ARCH, stop_if_straight: bool = False,
                needs_runs: bool = False) -> str:
    """PTX of NVVM IR module `text`, exporting `entry` alone. Before code generation, raise
    _Straight where `stop_if_straight` and the optimized entry has no branch, and _NoRuns
    where `needs_runs` and it has no run of global accesses to merge (coarsening.py)."""
    global _context
    machine = _machine(arch)
    with _lock:
        if _context is None:
            _context = llvm.create_context()
        module = None
        try:
            diagnostics.dump_stage("lowered", text)
            module = llvm.parse_assembly(text, context=_context)
            if needs_libdevice(text):
                module.link_in(_libdevice_module(text, module.triple, module.data_layout))
            for function in module.functions:
                if function.name != entry and not function.is_declaration:
                    function.linkage = "internal"
            module.verify()
            # What the kernel does not call goes before the optimizer sees it (most of libdevice).
            unused = llvm.create_new_module_pass_manager()
            unused.add_global_dead_code_eliminate_pass()
            builder = llvm.create_pass_builder(machine, llvm.create_pipeline_tuning_options(speed_level=3))
            unused.run(module, builder)
            builder.getModulePassManager().run(module, builder)
            if f"@{PLACEHOLDER}(" in text:
                module = _tensor_cores(module, machine)
            if stop_if_straight and not branches(module.get_function(entry)):
                raise _Straight()
            versioned = _vector_accesses(module, entry)
            if needs_runs and versioned is module:
                raise _NoRuns()
            module = versioned
            diagnostics.dump_stage("optimized", lambda: str(module))
            return machine.emit_assembly(module)
        except RuntimeError as error:
            raise UnsupportedKernelError(f"{entry}: LLVM's NVPTX backend refused the lowered kernel: "
                                         f"{str(error)[:500]}. Please report the kernel") from None
        finally:
            if module is not None:
                module.close()


def _tensor_cores(module, machine):
    """`module` (optimized, calling PLACEHOLDER) with its float simdgroup products defined
    (tensor_core_products.py), its shared accesses and tile copies as wide as proven
    (shared_alignment.py, shared_copies.py), and optimized again."""
    defined = proven_shared_alignment(versioned_shared_copies(tensor_core_products(str(module))))
    edited = llvm.parse_assembly(defined, context=_context)
    try:
        edited.verify()
        builder = llvm.create_pass_builder(machine, llvm.create_pipeline_tuning_options(speed_level=3))
        builder.getModulePassManager().run(edited, builder)
    except RuntimeError:
        edited.close()
        raise
    module.close()
    return edited


def _vector_accesses(module, entry: str):
    """`module` (optimized) with runs of global accesses versioned on their alignment at run
    time (vector_accesses.py): the same module where it has none, or where LLVM refuses the
    rewrite (a bug: warned, and the kernel compiled without it)."""
    optimized = str(module)
    versioned = vector_accesses(optimized)
    if versioned is optimized:
        return module
    edited = None
    try:
        edited = llvm.parse_assembly(versioned, context=_context)
        edited.verify()
    except RuntimeError as error:
        if edited is not None:
            edited.close()
        warnings.warn(f"{entry}: the CUDA lowering's vector accesses were refused by LLVM ({str(error)[:300]}); "
                      f"compiled with scalar accesses. Please report the kernel", RuntimeWarning)
        return module
    module.close()
    return edited


def air_text(function) -> str:
    """The printed AIR module of `function` (a KernelFunction)."""
    context = llvm.create_context()
    try:
        module = parse_bitcode(function.name, function.bitcode, context)
        try:
            return str(module)
        finally:
            module.close()
    finally:
        context.close()


def kernel_ptx(function, constants: dict, symbol: str, arch: str = DEFAULT_ARCH, grid_only: bool = False) -> str:
    """PTX of `function` (a KernelFunction) with these function-constant values; where it is
    `grid_only` (backend.py), its kernel may run several grid positions per thread (its
    entry's name then says so: lowering.entry_name)."""
    air = air_text(function)
    diagnostics.dump_stage("air", air)
    text, coarse = lower(air, function.name, function.arguments, constants, symbol, str(_machine(arch).target_data),
                         grid_only)
    entry = entry_name(symbol)
    try:
        ptx = compile_ptx(text, entry, arch, stop_if_straight=coarse is not None)
    except _Straight:
        # Straight-line one-position code: worth COARSENING positions per thread where its
        # copies' accesses merge into vector accesses (coarsening.py).
        try:
            ptx = compile_ptx(coarse, entry_name(symbol, COARSENING), arch, needs_runs=True)
            text, entry = coarse, entry_name(symbol, COARSENING)
        except _NoRuns:
            ptx = compile_ptx(text, entry, arch)
    if "__local_depot" in _entry_body(ptx, entry):
        # A private array left in local memory: again with its run-time indexed accesses as
        # selects (private_registers.py). Only then: where O3 promotes the arrays itself
        # (most kernels) the selects only cost compile time (steel GEMM's twice). The
        # kernel's arrays are in its entry (every function of its own is inlined there); the
        # functions called (tensor_core_products.py's exact products) have local arrays of
        # their own.
        registers = private_arrays_in_registers(text)
        if registers != text:
            ptx = compile_ptx(registers, entry, arch)
    diagnostics.dump_stage("kernel", ptx, suffix=".ptx")
    return ptx


def _entry_body(ptx: str, entry: str) -> str:
    """The text of `entry`'s definition in `ptx`."""
    start = ptx.find(f".entry {entry}(")
    return ptx[start:ptx.find("\n}\n", start)] if start >= 0 else ptx


def ptxas_path():
    """CUDA's ptxas ($PTXAS, then PATH, then a toolkit or package: toolkit.py), or None."""
    explicit = config.PTXAS.get()
    if explicit:
        return explicit
    candidates = [shutil.which("ptxas") or ""] + toolkit_files("bin/ptxas")
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


def run_ptxas(ptx: str, arch: str = DEFAULT_ARCH) -> subprocess.CompletedProcess:
    """ptxas on `ptx` for `arch` (a cubin, discarded); the completed process."""
    ptxas = ptxas_path()
    if ptxas is None:
        raise FileNotFoundError("ptxas not found: install CUDA's compiler or set PTXAS")
    with tempfile.TemporaryDirectory() as folder:
        source = os.path.join(folder, "kernel.ptx")
        with open(source, "w") as f:
            f.write(ptx)
        return subprocess.run([ptxas, f"-arch={arch}", source, "-o", os.path.join(folder, "kernel.cubin")],
                              capture_output=True, text=True)

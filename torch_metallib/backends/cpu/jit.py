"""Compiles lowered kernels to host machine code with LLVM and caches the result.

Each compiled object gets its own MCJIT engine (one shared engine resolved a second
object's references into the first one's data). A compiled kernel is keyed by
content (ARCHITECTURE.md, "Rules"): the function's SHA-256 ``HASH``, its function-constant values,
the host target, the toolchain and the package's code (cache/fingerprint.py). Objects come
from an ahead-of-time archive where one has them (archived.py), else are cached in memory
and on disk (``<cache>/jit``, see _disk_cache);
concurrent processes at worst compile the same kernel twice and rename identical files
over each other.
"""

import ctypes
import functools
import hashlib
import os
import threading
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import llvmlite
import llvmlite.binding as llvm

from ... import _C
from torch_metallib import config, diagnostics
from ...errors import TorchMetallibError
from ...cache.disk_cache import cache_directory, read_entry, write_entry
from ...cache.fingerprint import code_fingerprint
from ...reflection import ir_model
from ...reflection.bitcode import parse_bitcode
from .archived import archived_object, form_of, host_cpu_features

__all__ = ["CompiledKernel", "compile_kernel", "build_object", "build_for_level"]

@dataclass(frozen=True)
class CompiledKernel:
    # Address of __tm_launch_<symbol> (or __tm_thread_<symbol> if cooperative), one per
    # loaded copy of the object. A kernel with threadgroup variables gets a copy per worker
    # thread, so threadgroups running at the same time each have their own variables.
    launchers: Tuple[int, ...]
    serial: bool        # it has threadgroup variables
    cooperative: bool   # threads meet at barriers / SIMD-group functions
    from_disk: bool
    lanes: bool = False  # cooperative, as lane loops (regions.py): launchers are region tables
    vector: bool = False  # lane loops, some regions of which run lanes as vector lanes (vectorize.py)

    @property
    def scheme(self) -> str:
        """How its threads run: "threads" (one after another), "lanes" (a cooperative
        kernel cut into lane loops at its waits), "vector" (lane loops, some of them run as
        vector lanes) or "coroutines" (each thread a coroutine)."""
        if self.lanes:
            return "vector" if self.vector else "lanes"
        return "coroutines" if self.cooperative else "threads"


class _Host:
    """What the JIT compiles for: the host's triple, CPU and features (the disk cache key's
    toolchain), with the runtime's symbols registered; for ahead-of-time builds
    (archived.py), the host's triple with a named CPU level and its own features. Its
    target machine is made on the first compile: loading an object needs none of it."""

    def __init__(self, cpu: Optional[str] = None):
        llvm.initialize_native_target()
        self.triple = llvm.get_process_triple()
        self.features = host_cpu_features().flatten() if cpu is None else ""
        self.cpu = cpu or llvm.get_host_cpu_name()
        _register_runtime_symbols()
        self.toolchain = (f"llvmlite {llvmlite.__version__} llvm {llvm.llvm_version_info} "
                          f"{self.triple} {self.cpu} {self.features}")

    @functools.cached_property
    def machine(self):
        llvm.initialize_native_asmprinter()
        return llvm.Target.from_triple(self.triple).create_target_machine(
            cpu=self.cpu, features=self.features, opt=3, reloc="pic", codemodel="jitdefault")

    @functools.cached_property
    def datalayout(self) -> str:
        return str(self.machine.target_data)


@functools.lru_cache(maxsize=None)
def _register_runtime_symbols() -> None:
    """Once: the addresses of what cooperative kernels call, for every engine's linking."""
    for name, address in _C.runtime_symbols().items():
        llvm.add_symbol(name, address)


@functools.lru_cache(maxsize=None)
def _loader_machine():
    """The target machine of the engines objects are loaded into. An engine only links its
    object (its own module is empty), so a generic machine of the host's triple does:
    about half the cost of the host's, which reads the CPU's name and features."""
    llvm.initialize_native_target()
    _register_runtime_symbols()
    return llvm.Target.from_triple(llvm.get_process_triple()).create_target_machine(reloc="pic",
                                                                                   codemodel="jitdefault")


_host: Optional[_Host] = None
_compiled: Dict[str, CompiledKernel] = {}
_payloads: Dict[str, Tuple[bytes, str]] = {}  # (object, symbol) of kernels that may need more copies
_engines = []  # every engine lives as long as the process: launchers point into them
_lock = threading.RLock()  # one compile at a time; llvmlite serializes LLVM calls anyway

# (wall, CPU) seconds spent in each step of compiling, summed over the process, each step
# without the steps inside it (benchmarks/cold_compile.py reads them). Compiles hold _lock.
PHASES: Dict[str, Tuple[float, float]] = {}
_phase_stack = []  # [(wall, CPU) time spent in nested phases] per open phase


def _clock() -> Tuple[float, float]:
    return time.perf_counter(), time.thread_time()


def _account(name: str, start: Tuple[float, float]) -> None:
    """Closes the phase `name` opened at `start` (its entry on _phase_stack)."""
    now = _clock()
    elapsed = (now[0] - start[0], now[1] - start[1])
    nested = _phase_stack.pop()
    old = PHASES.get(name, (0.0, 0.0))
    PHASES[name] = (old[0] + elapsed[0] - nested[0], old[1] + elapsed[1] - nested[1])
    if _phase_stack:
        outer = _phase_stack[-1]
        _phase_stack[-1] = (outer[0] + elapsed[0], outer[1] + elapsed[1])


@contextmanager
def _phase(name: str):
    start = _clock()
    _phase_stack.append((0.0, 0.0))
    try:
        yield
    finally:
        _account(name, start)


def host() -> _Host:
    global _host
    with _lock:
        if _host is None:
            with _phase("host target machine"):
                _host = _Host()
        return _host


def build_for_level(cpu: str) -> None:
    """Makes this process build objects for CPU level `cpu` (``x86-64-v3``) instead of
    its host: only in precompile's workers, which load nothing they build."""
    global _host
    with _lock:
        _host = _Host(cpu)


def _cache_key(function_hash: str, constants: tuple) -> str:
    """The full key of a compiled kernel (content, constants, host, toolchain)."""
    return f"{function_hash}|{constants!r}|{host().toolchain}|code {code_fingerprint('cpu')}"


def lowered_ir(function, constants: dict, symbol: str, cooperative: bool, checked: bool = False,
               lanes: bool = False, initcheck: bool = True, vector: bool = False) -> str:
    """The host IR of `function` (_cpu_lowering.lower), before inlining and optimization."""
    with _phase("import lowering"):
        from .lowering import lower  # only on a cache miss

    machine = host()
    with _phase("host target machine"):
        machine.machine  # made at the first compile
    # Modules are closed before their context, explicitly: if lowering raises, the
    # traceback would otherwise keep them for the cyclic collector, which may free the
    # context first (and LLVM then crashes freeing the module).
    context = llvm.create_context()
    modules = []
    try:
        with _phase("parse AIR bitcode"):
            modules.append(parse_bitcode(function.name, function.bitcode, context))
        diagnostics.dump_stage("air", lambda: str(modules[0]))
        with _phase("print AIR"):
            air = str(modules[0])
        with _phase("lower (Python text)"):
            text = lower(air, function.name, function.arguments, constants, symbol,
                         machine.triple, machine.datalayout, cooperative,
                         unroll=lambda text: _unroll_loops(text, context, modules), checked=checked,
                         lanes=lanes, initcheck=initcheck, vector=vector)
        diagnostics.dump_stage("lowered", text)
        return text
    finally:
        _close(modules, context)


def _build_object(function, constants: dict, symbol: str, cooperative: bool, checked: bool,
                  initcheck: bool = True) -> bytes:
    from .coroutine import split_at_suspends  # only on a cache miss

    text = lowered_ir(function, constants, symbol, cooperative, checked, initcheck=initcheck)
    context = llvm.create_context()
    modules = []
    try:
        with _phase("parse host IR"):
            modules.append(llvm.parse_assembly(text, context=context))
        if cooperative:  # inline every wait into the thread entry, then make them suspensions
            with _phase("inline + fold (passes)"):
                _inline_everything(modules[-1])
                _fold_constants(modules[-1].get_function(f"__tm_thread_{symbol}"))
            with _phase("print host IR"):
                text = str(modules[-1])
            with _phase("coroutines (Python text)"):
                text = split_at_suspends(text, f"__tm_thread_{symbol}", function.name)
            diagnostics.dump_stage("coroutines", text)
            with _phase("parse host IR"):
                modules.append(llvm.parse_assembly(text, context=context))
        return _optimized_object(modules[-1])
    finally:
        _close(modules, context)


def _build_lanes_object(function, constants: dict, symbol: str, vector: bool = False) -> bytes:
    """The object of a cooperative kernel as lane loops (regions.py), with `vector` those
    regions that allow it as vector lanes (vectorize.py); NotLanes where the kernel waits
    in a way lane loops do not take. With vector lanes, the kernel is first cut at its
    barriers only, its SIMD-group's exchanges inside regions that vector lanes run a
    SIMD-group at a time; where one of those regions does not take vector lanes, it is
    cut at every wait, as lane loops."""
    entry = f"__tm_lanes_{symbol}"
    text = lowered_ir(function, constants, symbol, True, lanes=True, vector=vector)
    context = llvm.create_context()
    modules = []
    try:
        with _phase("parse host IR"):
            modules.append(llvm.parse_assembly(text, context=context))
        with _phase("inline + fold (passes)"):
            _inline_everything(modules[-1])
            _fold_constants(modules[-1].get_function(entry), scalars=True)
        with _phase("print host IR"):
            inlined = _unrolled_for_vector_lanes(modules[-1]) if vector else str(modules[-1])
        vectorized = vector and _exchanges_may_stay_inside(inlined, entry) and _parse_vector_lanes(
            function.name, _regions(inlined, entry, symbol, context, modules, False), symbol, context, modules,
            whole=True)
        if not vectorized:
            text = _regions(inlined, entry, symbol, context, modules, True)
            vectorized = vector and _parse_vector_lanes(function.name, text, symbol, context, modules)
        if not vectorized and vector:  # no region takes vector lanes: the lane loops' own build
            return _build_lanes_object(function, constants, symbol)
        if not vectorized:
            with _phase("parse host IR"):
                modules.append(llvm.parse_assembly(text, context=context))
        diagnostics.dump_stage("lanes", lambda: str(modules[-1]))
        return _optimized_object(modules[-1])
    finally:
        _close(modules, context)


def _unrolled_for_vector_lanes(module) -> str:
    """The text of `module` with its small constant-trip loops unrolled, for vector lanes:
    a thread's few reads of a row become reads at constant offsets, which vector lanes read
    with one wide load, and a loop of SIMD-group sums a sequence of them, which they do in
    registers."""
    with _phase("unroll (passes)"):
        return _unroll_passes(host(), module)


def _regions(inlined: str, entry: str, symbol: str, context, modules: list, exchanges: bool) -> str:
    """build_regions' module of the kernel `inlined` (every function inlined into `entry`),
    cut at every wait or, without `exchanges`, at its barriers only."""
    from .regions import build_regions, cut_at_markers  # only on a cache miss

    with _phase("lanes (Python text)"):
        text = cut_at_markers(inlined, entry, exchanges)
    with _phase("parse host IR"):
        modules.append(llvm.parse_assembly(text, context=context))
    with _phase("inline + fold (passes)"):
        demote = llvm.create_new_function_pass_manager()
        demote.add_register_to_memory_pass()
        demote.add_instruction_namer_pass()
        demote.run(modules[-1].get_function(entry), _builder())
    with _phase("print host IR"):
        text = str(modules[-1])
    with _phase("lanes (Python text)"):
        return build_regions(text, entry, symbol, exchanges_inside=not exchanges)


def _exchanges_may_stay_inside(inlined: str, entry: str) -> bool:
    """Whether the kernel `inlined` exchanges between its SIMD-group's lanes and nothing in
    it already rules out vector lanes (which its regions with exchanges inside need)."""
    from .vectorize import refuses  # only on a cache miss

    lines = inlined.split("\n")
    found = ir_model.function(lines, entry)
    body = lines[found.start:found.end]
    return any("@tm.lanes.deposit(" in line for line in body) and not any(
        "@tm.lanes.stage" in line or "@tm.lanes.kept(" in line or refuses(line) for line in body)


def _permutes() -> bool:
    """Whether the target has AVX-512's permutes of two registers (vector lanes read small
    tables with them): the host's features, none for a named CPU level."""
    return "+avx512f" in host().features.split(",")


def _parse_vector_lanes(kernel: str, text: str, symbol: str, context, modules: list, whole: bool = False) -> bool:
    """Appends to `modules` the lane-loop module `text` with the regions that allow it as
    vector lanes, and marks it so (``@__tm_vector_<symbol>``); False where no region
    does (`whole`: where a region with an exchange inside does not), or vectorize.py fails
    or LLVM refuses what it wrote (a bug there: the lane loops run, with a warning)."""
    from .regions import MEET
    from .vectorize import GROUP_WIDTH, WIDTH, vectorize_regions  # only on a cache miss

    try:
        with _phase("vector lanes (Python text)"):
            vector_text, vectorized, refused = vectorize_regions(text, GROUP_WIDTH if whole else WIDTH, _permutes())
    except Exception as error:  # noqa: BLE001 - an opt-in rewrite: any bug of it falls back
        return _vector_failed(kernel, f"{type(error).__name__}: {error}")
    logger = diagnostics.get_logger()
    for region, why in refused.items():
        logger.debug("cpu: %s: %s stays a lane loop: %s", kernel, region, why)
    if not vectorized or (whole and f"call void @{MEET}(" in vector_text):  # a lane loop can't meet inside
        return False
    try:
        with _phase("parse host IR"):
            module = llvm.parse_assembly(vector_text + f"\n@__tm_vector_{symbol} = constant i8 1\n", context=context)
        with _phase("verify"):
            module.verify()
    except RuntimeError as error:
        return _vector_failed(kernel, str(error))
    modules.append(module)
    return True


def _vector_failed(kernel: str, why: str) -> bool:
    warnings.warn(f"{kernel}: vector lanes failed ({why[:300]}); running it as lane loops. Please report the kernel",
                  RuntimeWarning, stacklevel=5)
    return False


def _close(modules: list, context) -> None:
    """Frees `modules`, then their `context` (in that order: see lowered_ir)."""
    with _phase("free modules"):
        for module in modules:
            module.close()
        context.close()


def _builder(speed_level: int = 2):
    return llvm.create_pass_builder(host().machine, llvm.create_pipeline_tuning_options(speed_level=speed_level))


def _inline_everything(module) -> None:
    """Inlines every wait into a cooperative kernel's entry (everything is alwaysinline)."""
    inliner = llvm.create_new_module_pass_manager()
    inliner.add_always_inliner_pass()
    inliner.run(module, _builder())


def _optimized_object(module) -> bytes:
    """`module` verified, optimized at O3 and compiled to an object for the host."""
    with _phase("verify"):
        module.verify()
    with _phase("optimize (O3)"):
        builder = _builder(speed_level=3)
        builder.getModulePassManager().run(module, builder)
    diagnostics.dump_stage("optimized", lambda: str(module))
    with _phase("codegen (object)"):
        return host().machine.emit_object(module)


def _fold_constants(function, scalars: bool = False) -> None:
    """Folds constant expressions in `function`: thread memory that Metal 4 code sizes
    through calls (a tensor descriptor's ``air.get_descriptor_size_tensor``) gets a
    constant size once those are inlined, which split_at_suspends needs to keep it in
    the coroutine's frame (which moves instructions: every value gets a name, as numbered
    values must stay in order)."""
    passes = llvm.create_new_function_pass_manager()
    if scalars:  # private arrays as scalars: each then has its own array in the lanes' context
        passes.add_sroa_pass()
    passes.add_instruction_combine_pass()
    passes.add_instruction_namer_pass()
    passes.run(function, _builder())


def _unroll_loops(text: str, context, modules: list) -> str:
    """`text` with its small constant-trip loops unrolled and its private arrays in
    registers where that became possible, every value named (_cpu_matrix_batches moves
    instructions, which numbered values forbid)."""
    machine = host()
    with _phase("unroll: parse"):
        modules.append(llvm.parse_assembly(text, context=context))
    with _phase("unroll: passes"):
        return _unroll_passes(machine, modules[-1])


def _unroll_passes(machine, module) -> str:
    passes = llvm.create_new_function_pass_manager()
    for add in (passes.add_sroa_pass, passes.add_instruction_combine_pass, passes.add_simplify_cfg_pass,
                passes.add_loop_rotate_pass, passes.add_loop_unroll_pass, passes.add_sroa_pass,
                passes.add_instruction_combine_pass, passes.add_simplify_cfg_pass, passes.add_instruction_namer_pass):
        add()
    builder = llvm.create_pass_builder(machine.machine, llvm.create_pipeline_tuning_options(speed_level=3))
    for function in module.functions:
        if not function.is_declaration:
            passes.run(function, builder)
    with _phase("unroll: print"):
        return str(module)


def _load_copy(payload: bytes, symbol: str, cooperative: bool) -> Tuple[int, str]:
    """Loads one copy of the object in its own engine; runs its constructors; returns its
    entry point (a lane-loop kernel's region table) and "lanes" or "vector" for lane loops
    ("" otherwise). Engines live as long as the process: launchers point into them."""
    with _phase("load object (engine)"):
        return _load(payload, symbol, cooperative)


def _load(payload: bytes, symbol: str, cooperative: bool) -> Tuple[int, str]:
    engine = llvm.create_mcjit_compiler(
        llvm.parse_assembly(f'target triple = "{llvm.get_process_triple()}"'), _loader_machine())
    _engines.append(engine)
    engine.add_object_file(llvm.ObjectFileRef.from_data(payload))
    init = engine.get_function_address(f"__tm_init_{symbol}")
    lanes = cooperative and engine.get_global_value_address(f"__tm_lanes_{symbol}")
    entry = lanes or engine.get_function_address(f"__tm_thread_{symbol}" if cooperative else f"__tm_launch_{symbol}")
    if not init or not entry:
        raise RuntimeError(f"the object does not define the entry points of {symbol}")
    ctypes.CFUNCTYPE(None)(init)()  # air.static_init
    vector = bool(lanes) and bool(engine.get_global_value_address(f"__tm_vector_{symbol}"))
    return entry, "vector" if vector else "lanes" if lanes else ""


def build_object(function, constants: tuple, symbol: str, cooperative: bool, checked: bool = False,
                 lanes: bool = False, initcheck: bool = True, vector: bool = False) -> bytes:
    """The object of `function` with `constants` for this process's target machine: lane
    loops where `lanes` asks and the kernel allows (`vector`: with vector lanes where its
    regions allow), else coroutines (`cooperative`) or threads; entry points named after
    `symbol`; `checked` (with the threadgroup initcheck unless `initcheck` is False) adds
    the checks."""
    if lanes:
        from .regions import NotLanes
        try:
            return _build_lanes_object(function, dict(constants), symbol, vector)
        except (NotLanes, TorchMetallibError):  # coroutines, or the same refusal from there
            pass
        except RuntimeError as error:  # LLVM refused what regions.py made: a bug there
            warnings.warn(f"{function.name}: lane loops failed ({str(error)[:300]}); running it as "
                          f"coroutines. Please report the kernel", RuntimeWarning, stacklevel=3)
    return _build_object(function, dict(constants), symbol, cooperative, checked, initcheck)


def compile_kernel(function, constants: tuple, serial: bool, cooperative: bool, copies: int = 1,
                   checked: bool = False, lanes: bool = False, initcheck: bool = True) -> CompiledKernel:
    """The compiled kernel `function` with `constants` ((index, value) pairs), loaded at
    least `copies` times; `serial`: it has threadgroup variables; `cooperative`: its
    threads meet; `lanes`: as lane loops where the kernel allows (else coroutines);
    `checked` with `initcheck`: bounds checks and the threadgroup initcheck, without it
    bounds checks only."""
    lanes = lanes and cooperative and not checked and config.CPU_LANES.get()
    vector = lanes and config.CPU_VECTORIZE.get()
    initcheck = checked and initcheck
    variant = ((constants, cooperative) + (("checked",) if checked else ())
               + (("bounds only",) if checked and not initcheck else ()) + (("lanes",) if lanes else ())
               + (("vector",) if vector else ()))
    # In memory, toolchain and code are this process's: the full key (_cache_key) is
    # needed only where an archive does not have the kernel.
    memory_key = (function.hash, variant)
    compiled = _compiled.get(memory_key)
    if compiled is not None and len(compiled.launchers) >= copies:
        return compiled
    with _lock:
        compiled = _compiled.get(memory_key)
        if compiled is not None and len(compiled.launchers) >= copies:
            return compiled  # another thread compiled it while this one waited
        if compiled is None:
            started = time.perf_counter()
            phase_start = _clock()  # the compile's time outside its named steps: "other"
            _phase_stack.append((0.0, 0.0))
            launchers, kind, source = (), "", "compiled"
            archived = None if diagnostics.dumps() or vector else archived_object(function, constants,
                                                                        form_of(cooperative, checked, lanes, initcheck))
            if archived is not None:
                payload, symbol, where = archived
                try:
                    entry, kind = _load_copy(payload, symbol, cooperative)
                    launchers, source = (entry,), f"loaded from archive {where}"
                except RuntimeError:  # its SHA-256 matched, so a bug of the builder: compile instead
                    pass
            if not launchers:
                payload, symbol, launchers, kind, source = _from_disk_or_built(
                    function, constants, variant, cooperative, checked, lanes, initcheck, vector)
            from_disk = source != "compiled"
            _account("other", phase_start)
        else:
            (payload, symbol), from_disk, launchers = _payloads[memory_key], compiled.from_disk, compiled.launchers
            kind = compiled.scheme if compiled.lanes else ""
        while len(launchers) < copies:
            entry, kind = _load_copy(payload, symbol, cooperative)
            launchers += (entry,)
        if compiled is None:
            diagnostics.get_logger().info("cpu: %s: %s (as %s) in %.3f s", function.name, source,
                                          kind or ("coroutines" if cooperative else "threads"),
                                          time.perf_counter() - started)
        if serial:
            _payloads[memory_key] = (payload, symbol)
        compiled = _compiled[memory_key] = CompiledKernel(launchers, serial, cooperative, from_disk,
                                                           bool(kind), kind == "vector")
        return compiled


def _from_disk_or_built(function, constants: tuple, variant: tuple, cooperative: bool, checked: bool, lanes: bool,
                        initcheck: bool, vector: bool) -> tuple:
    """(object, symbol, launchers, scheme ("lanes", "vector" or ""), source) of a kernel no archive had: loaded
    from the disk cache, else built (and written there)."""
    key_text = _cache_key(function.hash, variant)
    key = hashlib.sha256(key_text.encode()).hexdigest()
    symbol = key[:24]
    directory = cache_directory("jit")
    path = os.path.join(directory, f"{key}.o") if directory else None
    if path and not diagnostics.dumps():
        payload = read_entry(path, key_text)
        if payload is not None:
            try:
                entry, kind = _load_copy(payload, symbol, cooperative)
                return payload, symbol, (entry,), kind, "loaded from the disk cache"
            except RuntimeError:  # not an object LLVM can load, or without our symbols
                pass
    with diagnostics.dumping(function.name, key):
        payload = build_object(function, constants, symbol, cooperative, checked, lanes, initcheck, vector)
    if path:
        write_entry(path, key_text, payload)
    return payload, symbol, (), "", "compiled"

"""``python -m torch_metallib precompile LIB --kernel ... --target cpu -o ARCHIVE``: a
library's kernels compiled ahead of time, in parallel worker processes, into one archive
(cache/archive.py) that ``tm.load(..., archives=)`` and ``TORCH_METALLIB_ARCHIVES`` read.

For the CPU each kernel is built in the form a normal call asks for (lane loops where it
is cooperative, else plain threads; with --checked, the checked variant too), for a named
x86-64 level; for CUDA, PTX per architecture and, where ptxas is installed, the cubin
ptxas assembles from it for exactly that architecture (a GPU of it then compiles nothing).
"""

import concurrent.futures
import json
import multiprocessing
import os
import re
import subprocess
import sys
import time
from typing import Dict, List, Optional, Tuple

from ..errors import TorchMetallibError

__all__ = ["add_parser", "precompile"]


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "precompile", help="compile kernels ahead of time into an archive",
        description="Compile a library's kernels into one archive, so that a process loading the library with "
                    "archives=[ARCHIVE] (or TORCH_METALLIB_ARCHIVES=ARCHIVE) runs them on first call without "
                    "compiling.")
    parser.add_argument("library", help="the .metallib")
    parser.add_argument("--kernel", action="append", default=[], metavar="NAME|REGEX",
                        help="a kernel's name, or a regular expression its whole name matches (repeatable; "
                             "default: every kernel)")
    parser.add_argument("--constants", metavar="JSON",
                        help="function-constant values to build: a JSON list of {name: value} objects (each "
                             "applies to the kernels that declare all its names), or an object mapping a "
                             "kernel name or regex to such a list; @FILE reads the JSON from a file")
    parser.add_argument("--target", action="append", default=[],
                        help="cpu[:LEVEL] (LEVEL: x86-64, x86-64-v2, x86-64-v3 (default), x86-64-v4 or native) "
                             "or cuda:sm_80[,sm_90...] (PTX, and cubins where ptxas is installed); repeatable; "
                             "default: cpu")
    parser.add_argument("--checked", action="store_true", help="also build the CPU's checked variants")
    parser.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1, help="worker processes")
    parser.add_argument("-o", "--output", required=True, help="the archive to write")
    parser.set_defaults(run=_run)


def _targets(texts: List[str]) -> List[str]:
    """Each --target as one archive target name: ``cpu:x86-64-v3``, ``cuda:sm_90``."""
    from ..backends.cpu.archived import DEFAULT_LEVEL, LEVELS

    targets = []
    for text in texts or ["cpu"]:
        kind, _, rest = text.partition(":")
        if kind == "cpu":
            level = rest or DEFAULT_LEVEL
            if level not in LEVELS and level != "native":
                raise TorchMetallibError(f"precompile: --target {text}: unknown CPU level; expected one of "
                                         f"{', '.join(LEVELS)} or native, got {level!r}")
            targets.append(f"cpu:{level}")
        elif kind == "cuda" and rest:
            for arch in rest.split(","):
                if not re.fullmatch(r"sm_\d+", arch):
                    raise TorchMetallibError(f"precompile: --target {text}: expected architectures like sm_80, "
                                             f"got {arch!r}")
                targets.append(f"cuda:{arch}")
        else:
            raise TorchMetallibError(f"precompile: --target {text}: expected cpu[:LEVEL] or cuda:sm_XX[,sm_YY]")
    return list(dict.fromkeys(targets))


def _kernels(library, patterns: List[str]) -> List[str]:
    kernels = [name for name in library.function_names if library[name].type == "kernel"]
    if not patterns:
        return kernels
    chosen = []
    for pattern in patterns:
        if pattern in library:
            found = [pattern]
        else:
            try:
                expression = re.compile(pattern)
            except re.error as error:
                raise TorchMetallibError(f"precompile: --kernel {pattern!r}: neither a kernel's name nor a regular "
                                         f"expression ({error})") from None
            found = [name for name in kernels if expression.fullmatch(name)]
        if not found:
            raise KeyError(library._missing_message(pattern, "No kernel's name matches it either."))
        chosen += found
    return list(dict.fromkeys(chosen))


def _combinations(text: Optional[str], kernels: List[str]) -> Dict[str, Optional[Tuple[list, bool]]]:
    """Per kernel, (the constants dicts the user gave for it, whether they were given for
    every kernel); None: none given."""
    if text is None:
        return {name: None for name in kernels}
    if text.startswith("@"):
        with open(text[1:]) as file:
            text = file.read()
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise TorchMetallibError(f"precompile: --constants: expected JSON, got an error at character "
                                 f"{error.pos}: {error.msg}") from None
    if isinstance(value, list):
        return {name: (value, True) for name in kernels}
    if isinstance(value, dict) and all(isinstance(combos, list) for combos in value.values()):
        found = {}
        for pattern, combos in value.items():
            for name in kernels:
                if name == pattern or re.fullmatch(pattern, name):
                    found.setdefault(name, []).extend(combos)
        return {name: (found[name], False) if name in found else None for name in kernels}
    raise TorchMetallibError("precompile: --constants: expected a JSON list of objects or an object of lists, "
                             f"got {type(value).__name__}")


def _tasks(library, path: str, kernels, combinations, targets, checked, ptxas) -> Tuple[list, list]:
    """(tasks for the workers, kernels skipped and why)."""
    tasks, skipped = [], []
    for name in kernels:
        function = library[name]
        state = function._dispatch_state()
        if state.problem:
            skipped.append(f"{name}: {state.problem}")
            continue
        declared = {c.name for c in function.function_constants}
        required = sorted(c.name for c in function.function_constants if c.required)
        given = combinations[name]
        if given is None:
            combos = [{}]
        elif given[1]:  # a shared list applies to the kernels that declare every name of a combination
            combos = [c for c in given[0] if isinstance(c, dict) and set(c) <= declared] or ([{}] if not declared else [])
        else:
            combos = given[0]
        canonical = []
        for combo in combos:
            try:
                canonical.append(state.spec.pipeline_plan(combo).constants)
            except TorchMetallibError as error:
                skipped.append(f"{name} with constants {json.dumps(combo)}: {error}; precompile takes them from --constants")
        if not combos:
            skipped.append(f"{name}: needs function constants ({', '.join(required) or 'none required'}); none of "
                           f"--constants' combinations fits it")
        tasks.append(("record", name))  # constants or not: records and summaries do not depend on them
        for constants in dict.fromkeys(canonical):
            for target in targets:
                tasks.append((path, name, constants, target, checked, state.cooperative, state.serial, ptxas))
    return tasks, skipped


# --- in the workers --------------------------------------------------------------------

_libraries = {}
_level = [None]


def _build(task) -> Tuple[list, Optional[str]]:
    """([(target record, name, HASH, constants text, form, symbol, payload)], what failed)
    of one task (a failure to assemble a cubin keeps the PTX)."""
    import hashlib

    import torch_metallib as tm
    from .. import config

    path, name, constants, target, checked, cooperative, serial, ptxas = task
    library = _libraries.get(path) or _libraries.setdefault(path, tm.load(path))
    function = library[name]
    kind, _, level = target.partition(":")
    if kind == "cuda":
        from ..backends.cuda.archived import assemble_cubin, constants_text, cubin_form, ptx_form
        from ..backends.cuda.backend import grid_only
        from ..backends.cuda.coarsening import COARSENING
        from ..backends.cuda.lowering import entry_name
        from ..backends.cuda.ptx import kernel_ptx

        only = grid_only(function, cooperative, serial)
        symbol = "k" + function.hash[:16]  # as CudaKernel names it
        ptx = kernel_ptx(function, dict(constants), symbol, level, only).encode()
        key = constants_text(constants)
        built = [(target, name, function.hash, key, ptx_form(only), symbol, ptx)]
        if ptxas is None:
            return built, None
        coarse = entry_name(symbol, COARSENING)
        entry = coarse if f".entry {coarse}(".encode() in ptx else entry_name(symbol)
        try:
            cubin = assemble_cubin(ptxas, ptx, level)
        except (RuntimeError, OSError, subprocess.SubprocessError) as error:
            return built, f"{name} ({target} cubin): {str(error)[:400]}"
        return built + [(_cubin_record(target), name, function.hash, key, cubin_form(only), entry, cubin)], None
    from ..backends.cpu import jit
    from ..backends.cpu.archived import form_of

    if _level[0] != level:
        jit.build_for_level(None if level == "native" else level)
        _level[0] = level
    lanes = cooperative and config.CPU_LANES.get()
    forms = [(cooperative, False, lanes)] + ([(cooperative, True, False)] if checked else [])
    built = []
    for cooperative_form, checked_form, lanes_form in forms:
        form = form_of(cooperative_form, checked_form, lanes_form)
        symbol = hashlib.sha256(f"{target} {function.hash} {constants!r} {form}".encode()).hexdigest()[:24]
        payload = jit.build_object(function, constants, symbol, cooperative_form, checked_form, lanes_form)
        built.append((target, name, function.hash, repr(constants), form, symbol, payload))
    return built, None


def _build_or_say(task):
    if task[0] == "record":  # made here: reflection only, no compile
        return [], None
    try:
        return _build(task)
    except Exception as error:  # noqa: BLE001 - one kernel's failure is reported, the rest go on
        return [], f"{task[1]} ({task[3]}): {type(error).__name__}: {str(error)[:400]}"


# --- the archive -----------------------------------------------------------------------

def _records(library, names: List[str]) -> list:
    """Call-record and operator-summary entries of `names` (what a call and ``ops.define``
    read from reflection), so that neither a first call nor defining an operator parses
    the bitcode."""
    from ..dispatch.call_record import RECORD_TARGET, call_record
    from ..ops._kernel_summary import SUMMARY_TARGET, summary_payload

    made = {RECORD_TARGET: lambda function: json.dumps(call_record(function)).encode(),
            SUMMARY_TARGET: summary_payload}
    return [(target, name, library[name].hash, "", library[name].type, "", make(library[name]))
            for name in names for target, make in made.items()]


_RECORD_TARGETS = ("calls", "ops")  # call_record.RECORD_TARGET, _kernel_summary.SUMMARY_TARGET


def _cubin_record(target: str) -> str:
    """The key of the target record of `target`'s cubins (their toolchain names ptxas)."""
    return f"{target} cubin"


def _target_record(name: str, ptxas: Optional[str]):
    from ..cache.archive import Target

    if name.endswith(" cubin"):
        from ..backends.cuda.archived import cubin_toolchain, ptxas_version

        return Target(name[:-len(" cubin")], cubin_toolchain(ptxas_version(ptxas)), ())
    if name == "calls":
        from ..dispatch.call_record import record_toolchain

        return Target(name, record_toolchain(), ())
    if name == "ops":
        from ..ops._kernel_summary import summary_toolchain

        return Target(name, summary_toolchain(), ())
    kind, _, level = name.partition(":")
    if kind == "cuda":
        from ..backends.cuda.archived import cuda_toolchain

        return Target(name, cuda_toolchain(), ())
    import llvmlite.binding as llvm

    from ..backends.cpu.archived import LEVELS, cpu_toolchain

    toolchain = cpu_toolchain()
    if level == "native":
        features = tuple(sorted(f for f, on in llvm.get_host_cpu_features().items() if on))
    else:
        features = LEVELS[level]
    return Target(name, toolchain, features)


def precompile(library_path: str, kernels: List[str], constants: Optional[str], targets: List[str], output: str,
               jobs: int, checked: bool = False, say=print) -> int:
    """Builds the archive; returns the number of kernels that failed to build."""
    import torch_metallib as tm
    from ..cache.archive import Entry, write_archive

    started = time.perf_counter()
    library = tm.load(library_path)
    names = _kernels(library, kernels)
    targets = _targets(targets)
    ptxas = _ptxas(targets, say)
    tasks, skipped = _tasks(library, os.path.abspath(library_path), names, _combinations(constants, names), targets,
                            checked, ptxas)
    for reason in skipped:
        say(f"skipped {reason}")
    results, failures = _records(library, [task[1] for task in tasks if task[0] == "record"]), []
    tasks = [task for task in tasks if task[0] != "record"]
    jobs = max(1, min(jobs, len(tasks)))
    if jobs == 1:
        outcomes = map(_build_or_say, tasks)
    else:  # spawn: the workers start clean (no LLVM or torch thread state copied from here)
        pool = concurrent.futures.ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"))
        outcomes = pool.map(_build_or_say, tasks)
    try:
        for built, failure in outcomes:
            results += built
            if failure:
                failures.append(failure)
                say(f"failed {failure}")
    finally:
        if jobs > 1:
            pool.shutdown()
    keys = targets + [_cubin_record(t) for t in targets if ptxas and t.startswith("cuda:")]
    records = {key: _target_record(key, ptxas) for key in keys + (list(_RECORD_TARGETS) if results else [])}
    entries = [(Entry(records[target], name, hash_, constants_text, form, symbol, 0, 0), payload)
               for target, name, hash_, constants_text, form, symbol, payload in sorted(results, key=lambda r: r[:5])]
    compiled = [e for e, _ in entries if e.target.name not in _RECORD_TARGETS]
    if not compiled:
        raise TorchMetallibError(f"precompile: {library_path}: nothing was compiled; expected at least one kernel "
                                 f"with the function constants it needs. Check --kernel and --constants")
    data = write_archive(list(records.values()), entries)
    temporary = f"{output}.tmp-{os.getpid()}"
    with open(temporary, "wb") as file:
        file.write(data)
    os.replace(temporary, output)
    cubins = [e for e in compiled if e.form.startswith("cubin")]
    assembled = f"; {len(cubins)} of them cubins, by ptxas {cubins[0].target.toolchain.rsplit(' ptxas ', 1)[1]}" \
        if cubins else ""
    say(f"wrote {output}: {len(compiled)} entries ({len({e.function for e in compiled})} kernels; "
        f"{', '.join(targets)}{assembled}) and {(len(entries) - len(compiled)) // 2} call records and as many "
        f"operator summaries, {len(data):,} bytes, in "
        f"{time.perf_counter() - started:.1f} s with {jobs} "
        f"process{'es' if jobs > 1 else ''}")
    return len(failures)


def _ptxas(targets: List[str], say) -> Optional[str]:
    """The ptxas that assembles cubins for the CUDA targets; None (said once) where there is none."""
    if not any(target.startswith("cuda:") for target in targets):
        return None
    from ..backends.cuda.archived import ptxas_for_archives

    ptxas, why = ptxas_for_archives()
    if ptxas is None:
        say(f"{why}: storing PTX only, no cubins (a GPU's driver compiles the PTX when it loads it)")
    return ptxas


def _run(args) -> int:
    failed = precompile(args.library, args.kernel, args.constants, args.target, args.output, args.jobs,
                        args.checked)
    if failed:
        print(f"error: {failed} build(s) failed; those kernels compile at first call", file=sys.stderr)
    return 1 if failed else 0

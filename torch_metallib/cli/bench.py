"""``python -m torch_metallib bench LIB``: the start-up time a user saves with their own
precompiled library, measured in fresh processes.

Every figure is taken in a new child process (bench_probe.py, run by path so imports are
timed too), ``--repeat`` times, in rounds that alternate the order of the kinds of probe;
reported as median, p10 and p90. The baselines run in the same rounds: a plain Python
reading of the file's function list (function_list_baseline.py) and, on a Mac, torch's own
``torch.mps.compile_shader`` (given the library's source with ``--source``) and
``torch.mps.load_metallib`` (where the installed torch has it), each to its first finished
kernel. On mps, ``warm`` probes take pipelines from the binary archive the cache holds, and
``unarchived`` probes (warm, the archive off) have Metal compile them: the two first calls
differ by the pipeline compile the archive saves. A figure that cannot be taken is listed
under ``not_measured`` with the reason.

JSON (``--json FILE``), schema ``torch_metallib.bench/1``::

    {"schema": "torch_metallib.bench/1", "date": ISO-8601 UTC, "machine": {...},
     "versions": {"python", "torch", "torch_metallib", "llvmlite"},
     "library": {"path", "bytes", "functions"}, "kernels": [names], "device": "cpu" | "mps",
     "repeat": N, "calls": N,
     "figures": {label: {"unit": "ms" | "MB", "median", "p10", "p90", "min", "max", "samples": [...]}},
     "first_result": {approach: {"phases": {phase: median ms}, "total_ms": sum}},
     "ratios": {label: number}, "targets": {label: {"value", "limit", "met"}},
     "not_measured": {label: reason}}

Labels of per-kernel figures end in `` (KERNEL)``.

With ``--scenario NAME`` (bench_scenario.py) the same keys hold a model's start-up: "library" is
MLX's, "kernels" the distinct kernels the scenario compiles, "calls" 0; figures are labelled
``PHASE, MODE`` (phases ``import torch``, ``import torch_metallib``, ``mlx.load``, ``first
result``, ``steady-state run``; modes ``cold JIT``, ``warm disk cache``, ``archive``), and one
more key describes the scenario::

     "scenario": {"name", "description",
                  "compiles": [{"kernel", "constants": {name: value}, "target", "form"}],
                  "distinct_kernels": N, "compiled": {mode: [[kernel, where from], ...]},
                  "checksums": {mode: [sum of the result per process]},
                  "threads": [torch's thread count in the processes],
                  "archive": {"targets", "build_s", "bytes", "failed"}}
"""

import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

from .. import errors
from ..library.library import load
from .bench_scenarios import SCENARIOS

__all__ = ["add_parser", "measure", "SCHEMA"]

SCHEMA = "torch_metallib.bench/1"
PROBE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_probe.py")
DEFAULT_KERNELS = ("vv_Addfloat32", "vector_add_float")
LOAD_BYTES_LIMIT_MS = 1.0
SPEEDUP_LIMIT = 30.0
MEMORY_LIMIT_MB = 5.0


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "bench", help="start-up figures for a metallib: load, reflect, first call, memory, against baselines",
        description=__doc__.split("\n\n")[1])
    parser.add_argument("library", nargs="?",
                        help="the .metallib to measure (with --scenario: MLX's, by default the cached one)")
    parser.add_argument("--scenario", choices=sorted(SCENARIOS),
                        help="time a model's start-up instead: the scenario's distinct MLX kernels from a fresh "
                             "process to its first result, with a cold JIT, a warm disk cache and an archive")
    parser.add_argument("--kernel", action="append", metavar="NAME",
                        help="a kernel to reflect and call (repeatable; default: vv_Addfloat32 or the first "
                             "kernel whose arguments bench can make up)")
    parser.add_argument("--repeat", type=int, default=7, metavar="N", help="fresh processes per figure (default 7)")
    parser.add_argument("--calls", type=int, default=20, metavar="N",
                        help="calls timed for the steady-state figure (default 20)")
    parser.add_argument("--source", metavar="FILE.metal",
                        help="the library's Metal source, for the torch.mps.compile_shader baseline (macOS)")
    parser.add_argument("--device", choices=("cpu", "mps", "cuda"),
                        help="where calls run (default: mps where available; with --scenario, cpu)")
    parser.add_argument("--json", metavar="FILE", help="write every figure as JSON (schema in --help of the module)")
    parser.add_argument("--plot", metavar="FILE.png", help="draw time to first result, by phase (needs matplotlib)")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    parser.set_defaults(run=run)


def run(args) -> int:
    from . import bench_report

    if args.repeat < 1 or args.calls < 0:
        raise errors.TorchMetallibError("bench: --repeat must be at least 1 and --calls at least 0")
    if args.plot:
        bench_report.require_matplotlib()
    if args.scenario:
        from .bench_scenario import MODES, measure_scenario

        if args.kernel or args.source:
            raise errors.TorchMetallibError("bench: --scenario measures the kernels its model calls; expected no "
                                            "--kernel or --source with it, got "
                                            + ("--kernel" if args.kernel else "--source")
                                            + ". Leave them out, or leave out --scenario")
        progress = _Progress(2 + len(MODES) * args.repeat, sys.stderr.isatty())
        result = measure_scenario(args.scenario, args.library, args.repeat, args.device, progress)
        progress.close()
    elif args.library is None:
        raise errors.TorchMetallibError("bench: expected a .metallib to measure, or --scenario NAME; got neither")
    else:
        result = measure(args.library, args.kernel, args.repeat, args.calls, args.source, args.device,
                         progress=sys.stderr.isatty())
    print(bench_report.table(result, markdown=args.markdown))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=1)
    if args.plot:
        bench_report.plot(result, args.plot)
    return 0


def choose_kernels(library, names) -> list:
    from .bench_arguments import arguments_for

    if names:
        for name in names:
            library[name]  # KeyError naming the closest names
        return list(names)
    preferred = [name for name in DEFAULT_KERNELS if name in library]
    for name in preferred + list(library.function_names):
        function = library[name]
        if function.type != "kernel":
            continue
        try:
            arguments_for(function, 1)
        except (errors.UnsupportedKernelError, errors.ReflectionError):
            continue
        return [name]
    raise errors.UnsupportedKernelError(
        f"bench: no kernel of {len(library)} has arguments bench can make up (scalar buffers only); "
        f"name one with --kernel, or measure loading alone with --calls 0")


def _device(requested):
    import torch

    available = torch.backends.mps.is_available()
    if requested == "mps" and not available:
        raise errors.UnsupportedDeviceError("bench: --device mps, but torch.backends.mps.is_available() is False")
    if requested == "cuda" and not torch.cuda.is_available():
        raise errors.UnsupportedDeviceError("bench: --device cuda, but torch.cuda.is_available() is False; run on "
                                            "a machine with an NVIDIA GPU, or leave out --device")
    return requested or ("mps" if available else "cpu")


class _Progress:
    def __init__(self, total: int, shown: bool):
        self.total, self.done, self.shown = total, 0, shown

    def step(self, what: str) -> None:
        self.done += 1
        if self.shown:
            filled = 30 * self.done // self.total
            print(f"\r[{'#' * filled}{'.' * (30 - filled)}] {self.done}/{self.total} {what:<40.40}", end="",
                  file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.shown:
            print(file=sys.stderr)


def _probe(kind, library, kernel, calls, device, source, cache_dir) -> dict:
    # The probe imports the torch_metallib that runs this, wherever it is installed.
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(PROBE)))
    path = os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, TORCH_METALLIB_CACHE_DIR=cache_dir, PYTHONPATH=path)
    if kind == "unarchived":
        env["TORCH_METALLIB_METAL_ARCHIVE"] = "0"
    command = [sys.executable, PROBE, kind, library, kernel, str(calls), device, source or ""]
    run = subprocess.run(command, capture_output=True, text=True, env=env)
    if run.returncode != 0:
        tail = (run.stderr.strip().splitlines() or [f"exit status {run.returncode}"])[-1]
        raise errors.TorchMetallibError(f"bench: the {kind} probe of {kernel} failed: {tail}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def _plan(kernels, source, device="cpu") -> tuple:
    """(probe kinds per round, figures that cannot be taken here and why)."""
    import torch

    kinds = [("baseline", kernels[0]), ("bytes", kernels[0])]
    kinds += [(kind, kernel) for kernel in kernels for kind in ("cold", "warm")]
    if device == "mps":  # warm: pipelines from the binary archive; unarchived: the same, compiled by Metal
        kinds += [("unarchived", kernel) for kernel in kernels]
    skipped = {}
    mps = torch.backends.mps.is_available()
    if not mps:
        reason = "needs an MPS device (torch.backends.mps.is_available() is False)"
        skipped["torch.mps.compile_shader"] = reason
        skipped["torch.mps.load_metallib"] = reason
    else:
        if source:
            kinds.append(("compile_shader", kernels[0]))
        else:
            skipped["torch.mps.compile_shader"] = "give the library's Metal source with --source FILE.metal"
        if hasattr(torch.mps, "load_metallib"):
            kinds.append(("torch_load_metallib", kernels[0]))
        else:
            skipped["torch.mps.load_metallib"] = f"torch {torch.__version__} has no torch.mps.load_metallib"
    return kinds, skipped


def _summary(samples: list, unit: str) -> dict:
    ordered = sorted(samples)
    if len(ordered) > 1:
        deciles = statistics.quantiles(ordered, n=10, method="inclusive")
        p10, p90 = deciles[0], deciles[-1]
    else:
        p10 = p90 = ordered[0]
    return {"unit": unit, "median": statistics.median(ordered), "p10": p10, "p90": p90, "min": ordered[0],
            "max": ordered[-1], "samples": samples}


def measure(path: str, kernel_names=None, repeat: int = 7, calls: int = 20, source=None, device=None,
            progress: bool = False) -> dict:
    """Every figure for the library at `path`, as the JSON document described above."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"bench: {path}: no such file")
    library = load(path)  # refuses a file that is not a metallib, with the byte offset
    kernels = choose_kernels(library, kernel_names)
    device = _device(device)
    kinds, skipped = _plan(kernels, source, device)
    samples = {}
    progress_bar = _Progress(len(kinds) * repeat + len(kernels), progress)
    with tempfile.TemporaryDirectory(prefix="torch_metallib_bench_") as scratch:
        warm_cache = os.path.join(scratch, "warm")
        for kernel in kernels:  # fills the warm cache, untimed
            _probe("warm", path, kernel, 0, device, source, warm_cache)
            progress_bar.step(f"filling the cache for {kernel}")
        for round_ in range(repeat):
            for number, (kind, kernel) in enumerate(kinds if round_ % 2 == 0 else kinds[::-1]):
                cache = warm_cache if kind in ("warm", "unarchived") else os.path.join(scratch, f"cold-{round_}-{number}")
                # Steady-state calls are the same whatever the cache held: timed in warm probes only.
                figures = _probe(kind, path, kernel, calls if kind == "warm" else 0, device, source, cache)
                for label, value in figures.items():
                    if label == "functions":
                        continue
                    library_wide = label.startswith(("import", "load", "memory", "function list"))
                    per_kernel = kind in ("cold", "warm", "unarchived") and not library_wide
                    samples.setdefault(f"{label} ({kernel})" if per_kernel else label, []).append(value)
                progress_bar.step(f"{kind} {kernel}")
    progress_bar.close()
    figures = {label: _summary(values, "MB" if label.startswith("memory") else "ms")
               for label, values in samples.items()}
    return _document(path, library, kernels, device, repeat, calls, figures, skipped)


def _versions() -> dict:
    import llvmlite
    import torch

    from .. import __version__

    return {"python": platform.python_version(), "torch": torch.__version__, "torch_metallib": __version__,
            "llvmlite": llvmlite.__version__}


def _machine() -> dict:
    return {"system": platform.system(), "release": platform.release(), "machine": platform.machine(),
            "processor": platform.processor() or platform.machine(), "cpus": os.cpu_count()}


def _first_result(figures: dict, kernels: list) -> dict:
    median = {label: figure["median"] for label, figure in figures.items()}
    kernel = kernels[0]
    approaches = {}
    imports = {"import torch": median.get("import torch"), "import torch_metallib": median.get("import torch_metallib")}
    for cache in ("warm", "cold"):
        approaches[f"torch_metallib, {cache} cache"] = {
            **imports, "load(path)": median.get("load(path)"),
            "first reflection": median.get(f"first reflection ({kernel})"),
            "first call": median.get(f"first call, {cache} cache ({kernel})")}
    if f"first call, unarchived cache ({kernel})" in median:  # mps: the pipeline compiled, not archived
        approaches["torch_metallib, warm cache, pipeline archive off"] = {
            **imports, "load(path)": median.get("load(path)"),
            "first reflection": median.get(f"first reflection ({kernel})"),
            "first call": median.get(f"first call, unarchived cache ({kernel})")}
    approaches["plain Python, function list only"] = {"read the function list": median.get("python function list")}
    if "compile_shader" in median:
        approaches["torch.mps.compile_shader"] = {
            "import torch": median.get("import torch"), "compile": median["compile_shader"],
            "first call": median.get("first call, compile_shader")}
    if "torch.mps.load_metallib" in median:
        approaches["torch.mps.load_metallib"] = {
            "import torch": median.get("import torch"), "load": median["torch.mps.load_metallib"],
            "first call": median.get("first call, torch.mps.load_metallib")}
    return {name: {"phases": phases, "total_ms": sum(v for v in phases.values() if v is not None)}
            for name, phases in approaches.items()}


def _document(path, library, kernels, device, repeat, calls, figures, skipped) -> dict:
    median = {label: figure["median"] for label, figure in figures.items()}
    baseline = median.get("python function list")
    ratios, targets = {}, {}
    for source in ("bytes", "path"):
        if baseline and f"load({source})" in median:
            ratios[f"python function list / load({source})"] = baseline / median[f"load({source})"]
    if "load(bytes)" in median:
        targets[f"load(bytes) median <= {LOAD_BYTES_LIMIT_MS:g} ms"] = {
            "value": median["load(bytes)"], "limit": LOAD_BYTES_LIMIT_MS,
            "met": median["load(bytes)"] <= LOAD_BYTES_LIMIT_MS}
    speedup = ratios.get("python function list / load(bytes)")
    if speedup is not None:
        targets[f"load(bytes) >= {SPEEDUP_LIMIT:g}x faster than the Python baseline"] = {
            "value": speedup, "limit": SPEEDUP_LIMIT, "met": speedup >= SPEEDUP_LIMIT}
    if "memory added by load(path)" in median:
        added = median["memory added by load(path)"]
        targets[f"load(path) adds <= {MEMORY_LIMIT_MB:g} MB"] = {"value": added, "limit": MEMORY_LIMIT_MB,
                                                                "met": added <= MEMORY_LIMIT_MB}
    return {
        "schema": SCHEMA, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": _machine(), "versions": _versions(),
        "library": {"path": os.path.abspath(path), "bytes": library.nbytes, "functions": len(library)},
        "kernels": kernels, "device": device, "repeat": repeat, "calls": calls, "figures": figures,
        "first_result": _first_result(figures, kernels), "ratios": ratios, "targets": targets,
        "not_measured": skipped,
    }


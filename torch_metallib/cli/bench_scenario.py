"""``bench --scenario NAME``: a model's start-up, many distinct MLX kernels from a fresh
process to the first result, with a cold JIT, a warm disk cache and an ahead-of-time
archive, side by side in one run.

First one untimed process runs the scenario with an empty disk cache (which it fills, for
the warm mode) and records every compile it asks for: the kernel, its function constants
and its form, as the archive lookups each compile makes first (scenario_probe.py). The
archive of exactly those is built with ``precompile`` (its build time is reported). Then
each round runs one fresh process per mode, in alternating order, ``--repeat`` rounds:

* cold JIT: ``TORCH_METALLIB_CACHE=0``, every kernel compiled;
* warm disk cache: the cache the first process filled;
* archive: ``TORCH_METALLIB_CACHE=0`` and ``TORCH_METALLIB_ARCHIVES`` naming the archive.

The document is schema ``torch_metallib.bench/1`` with a ``scenario`` section (see
bench.py); each process's compile log says, per mode, which kernels it compiled and which
it loaded, and a checksum of the result shows every mode computed the same.
"""

import datetime
import json
import os
import subprocess
import sys
import tempfile
import time

from .. import errors
from .bench_scenarios import DESCRIPTIONS

__all__ = ["measure_scenario", "MODES", "SPEEDUP_LIMIT"]

PROBE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scenario_probe.py")
MODES = ("cold JIT", "warm disk cache", "archive")
PHASES = ("import torch", "import torch_metallib", "mlx.load", "first result")
SPEEDUP_LIMIT = 20.0


def _device(requested) -> str:
    import torch

    device = requested or "cpu"
    if device == "mps":
        raise errors.UnsupportedDeviceError("bench: --scenario runs on cpu or cuda; expected --device cpu or "
                                            "--device cuda, got mps (archives hold CPU objects and CUDA PTX)")
    if device == "cuda" and not torch.cuda.is_available():
        raise errors.UnsupportedDeviceError("bench: --device cuda, but torch.cuda.is_available() is False; "
                                            "run on a machine with an NVIDIA GPU, or leave out --device")
    return device


def _probe(scenario, device, library, env, record=False) -> dict:
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(PROBE)))
    path = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    command = [sys.executable, PROBE, scenario, device, library, "1" if record else "0"]
    run = subprocess.run(command, capture_output=True, text=True, env=dict(env, PYTHONPATH=path))
    if run.returncode != 0:
        tail = (run.stderr.strip().splitlines() or [f"exit status {run.returncode}"])[-1]
        raise errors.TorchMetallibError(f"bench: a {scenario} process failed: {tail}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def _build_archive(library, requests, device, output) -> dict:
    """The archive of exactly `requests` (precompile, every core); what it took."""
    from .precompile import precompile

    constants = {}
    for request in requests:
        combos = constants.setdefault(request["kernel"], [])
        if request["constants"] not in combos:
            combos.append(request["constants"])
    # On the CPU, this machine's own level: the archive measured here must load here.
    targets = ["cpu:native"] if device == "cpu" else sorted({r["target"] for r in requests})
    said = []
    started = time.perf_counter()
    failed = precompile(library, list(constants), json.dumps(constants), targets, output, os.cpu_count() or 1,
                        say=said.append)
    return {"targets": targets, "build_s": time.perf_counter() - started, "bytes": os.path.getsize(output),
            "failed": failed, "log": said}


def measure_scenario(scenario: str, library=None, repeat: int = 7, device=None, progress=None) -> dict:
    """Every figure of `scenario`, as the bench document with its ``scenario`` section."""
    from .bench import _summary

    device = _device(device)
    if library is None:
        from ..mlx import library_path

        library = library_path()
    elif not os.path.isfile(library):
        raise FileNotFoundError(f"bench: {library}: no such file")
    base = {k: v for k, v in os.environ.items()
            if k not in ("TORCH_METALLIB_ARCHIVES", "TORCH_METALLIB_LOG", "TORCH_METALLIB_CACHE")}
    step = progress.step if progress else (lambda what: None)
    samples, compiled, checksums, threads = {}, {}, {}, set()
    with tempfile.TemporaryDirectory(prefix="torch_metallib_bench_") as scratch:
        warm = os.path.join(scratch, "warm")
        recorded = _probe(scenario, device, library, dict(base, TORCH_METALLIB_CACHE_DIR=warm), record=True)
        step(f"recorded {len(recorded['requests'])} compiles")
        archive_path = os.path.join(scratch, f"{scenario}.tmar")
        archive = _build_archive(library, recorded["requests"], device, archive_path)
        step(f"built the archive in {archive['build_s']:.1f} s")
        environments = {
            "cold JIT": dict(base, TORCH_METALLIB_CACHE="0"),
            "warm disk cache": dict(base, TORCH_METALLIB_CACHE_DIR=warm),
            "archive": dict(base, TORCH_METALLIB_CACHE="0", TORCH_METALLIB_ARCHIVES=archive_path),
        }
        for round_ in range(repeat):
            for mode in MODES if round_ % 2 == 0 else MODES[::-1]:
                figures = _probe(scenario, device, library, environments[mode])
                compiled[mode] = figures.pop("compiled")
                threads.add(figures.pop("threads"))
                checksums.setdefault(mode, []).append(figures.pop("checksum"))
                for label, value in figures.items():
                    samples.setdefault(f"{label}, {mode}", []).append(value)
                step(f"{mode}, round {round_ + 1}")
    figures = {label: _summary(values, "ms") for label, values in samples.items()}
    section = {
        "name": scenario, "description": DESCRIPTIONS[scenario],
        "compiles": recorded["requests"], "distinct_kernels": len(recorded["requests"]),
        "compiled": compiled, "checksums": checksums, "threads": sorted(threads),
        "archive": {key: value for key, value in archive.items() if key != "log"},
    }
    return _document(library, device, repeat, figures, section)


def first_result(figures: dict) -> dict:
    """Per mode: the phases from a fresh process to the first result (medians, ms)."""
    out = {}
    for mode in MODES:
        phases = {phase: figures[f"{phase}, {mode}"]["median"] for phase in PHASES if f"{phase}, {mode}" in figures}
        out[f"torch_metallib, {mode}"] = {"phases": phases, "total_ms": sum(phases.values())}
    return out


def ratios_and_targets(figures: dict, first: dict) -> tuple:
    median = {label: figure["median"] for label, figure in figures.items()}
    cold, warm, archived = (median[f"first result, {mode}"] for mode in MODES)
    ratios = {"first result: cold JIT / archive": cold / archived,
              "first result: archive / warm disk cache": archived / warm,
              "first result, archive: first run / steady-state run": archived / median["steady-state run, archive"],
              "from process start: cold JIT / archive": (first["torch_metallib, cold JIT"]["total_ms"]
                                                         / first["torch_metallib, archive"]["total_ms"])}
    speedup = ratios["first result: cold JIT / archive"]
    targets = {f"first result >= {SPEEDUP_LIMIT:g}x sooner with an archive than with a cold JIT": {
        "value": speedup, "limit": SPEEDUP_LIMIT, "met": speedup >= SPEEDUP_LIMIT}}
    return ratios, targets


def _document(library_path, device, repeat, figures, section) -> dict:
    from ..library.library import load
    from .bench import SCHEMA, _machine, _versions

    library = load(library_path)
    first = first_result(figures)
    ratios, targets = ratios_and_targets(figures, first)
    not_measured = {}
    archived = [kernel for kernel, where in section["compiled"]["archive"] if where == "compiled"]
    if archived:
        not_measured["archive"] = (f"the archive lacked {len(archived)} of the scenario's compiles "
                                   f"({', '.join(archived)}); they compiled at first call")
    return {
        "schema": SCHEMA, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": _machine(), "versions": _versions(),
        "library": {"path": os.path.abspath(library_path), "bytes": library.nbytes, "functions": len(library)},
        "kernels": list(dict.fromkeys(c["kernel"] for c in section["compiles"])), "device": device,
        "repeat": repeat, "calls": 0, "figures": figures, "first_result": first, "ratios": ratios,
        "targets": targets, "not_measured": not_measured, "scenario": section,
    }

"""One fresh process's start-up figures for ``python -m torch_metallib bench``.

Run as a script by its path (``python bench_probe.py KIND LIBRARY KERNEL CALLS [DEVICE [SOURCE]]``), so that
nothing is imported before the imports are timed; prints one JSON object of figures
(milliseconds, and megabytes for memory). Kinds:

* ``baseline``: the plain Python reading of the function list (function_list_baseline.py);
* ``bytes``: import torch, import torch_metallib, ``load(bytes)`` of the file already read;
* ``cold`` / ``warm``: ``load(path)``, the function list, the first reflection, the first
  call (with an empty, or a filled, on-disk cache: the caller sets the cache directory),
  then steady-state calls;
* ``unarchived`` (mps): as ``warm``, run with TORCH_METALLIB_METAL_ARCHIVE=0, so Metal
  compiles the pipeline that ``warm`` takes from the binary archive;
* ``compile_shader`` (macOS): ``torch.mps.compile_shader`` of SOURCE (the library's Metal
  source), then the first call of KERNEL on mps;
* ``torch_load_metallib`` (macOS): ``torch.mps.load_metallib(path)``, then the first call.
"""

import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# Run by path, Python put this folder first on sys.path, where cli/inspect.py would shadow
# the standard library's inspect that torch imports.
if sys.path and os.path.abspath(sys.path[0] or ".") == HERE:
    del sys.path[0]

ELEMENTS = 1 << 12  # elements of each tensor argument of a benchmarked call


def now() -> int:
    return time.perf_counter_ns()


def since(start: int) -> float:
    return (now() - start) / 1e6


def rss_mb() -> float:
    """Resident memory now (Linux); elsewhere the peak so far (getrusage), the best the
    standard library offers."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024 / 1e6
    except OSError:
        pass
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1e6 if sys.platform == "darwin" else peak * 1024 / 1e6


def timed_imports(out: dict):
    start = now()
    import torch

    out["import torch"] = since(start)
    start = now()
    import torch_metallib

    out["import torch_metallib"] = since(start)
    return torch, torch_metallib


def call_arguments(function, device: str) -> list:
    """Arguments for `function` made from its reflection (bench_arguments.py)."""
    from torch_metallib.cli.bench_arguments import arguments_for

    return arguments_for(function, ELEMENTS, device)


def reflected(library: str, kernel_name: str):
    import torch_metallib

    return torch_metallib.load(library)[kernel_name]


def first_and_steady_calls(out: dict, torch, call, args: list, approach: str, calls: int, device: str) -> None:
    """Times the first call (figure "first call, APPROACH") and the median of `calls` more."""
    def finished():
        if device == "mps":
            torch.mps.synchronize()
        elif device == "cuda":
            torch.cuda.synchronize()

    start = now()
    call(*args)
    finished()
    out[f"first call, {approach}"] = since(start)
    samples = []
    for _ in range(calls):
        start = now()
        call(*args)
        finished()
        samples.append(since(start))
    if samples:
        ours = approach.endswith(" cache")
        out["steady-state call" + ("" if ours else f", {approach}")] = statistics.median(samples)


def main(kind: str, library: str, kernel_name: str, calls: int, device: str = "cpu", source: str = "") -> dict:
    out = {}
    if kind == "baseline":
        import importlib.util

        spec = importlib.util.spec_from_file_location("baseline", os.path.join(HERE, "function_list_baseline.py"))
        baseline = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(baseline)

        with open(library, "rb") as file:
            data = file.read()
        start = now()
        functions = baseline.parse_function_list(data)
        out["python function list"] = since(start)
        out["functions"] = len(functions)
    elif kind == "bytes":
        torch, tm = timed_imports(out)
        with open(library, "rb") as file:
            data = file.read()
        before = rss_mb()
        start = now()
        lib = tm.load(data)
        out["load(bytes)"] = since(start)
        out["memory added by load(bytes)"] = rss_mb() - before
        out["functions"] = len(lib)
    elif kind in ("cold", "warm", "unarchived"):  # unarchived: warm, TORCH_METALLIB_METAL_ARCHIVE=0 (mps)
        torch, tm = timed_imports(out)
        before = rss_mb()
        start = now()
        lib = tm.load(library)
        out["load(path)"] = since(start)
        out["memory added by load(path)"] = rss_mb() - before
        start = now()
        lib.function_names
        out["function list"] = since(start)
        kernel = lib[kernel_name]
        start = now()
        kernel.reflection
        out["first reflection"] = since(start)
        args = call_arguments(kernel, device)
        first_and_steady_calls(out, torch, kernel, args, f"{kind} cache", calls, device)
    elif kind == "compile_shader":
        torch, _ = timed_imports(out)
        with open(source) as file:
            text = file.read()
        start = now()
        compiled = torch.mps.compile_shader(text)
        out["compile_shader"] = since(start)
        args = call_arguments(reflected(library, kernel_name), "mps")
        first_and_steady_calls(out, torch, getattr(compiled, kernel_name), args, "compile_shader", calls,
                               "mps")
    elif kind == "torch_load_metallib":
        torch, _ = timed_imports(out)
        start = now()
        loaded = torch.mps.load_metallib(library)
        out["torch.mps.load_metallib"] = since(start)
        args = call_arguments(reflected(library, kernel_name), "mps")
        first_and_steady_calls(out, torch, getattr(loaded, kernel_name), args, "torch.mps.load_metallib",
                               calls, "mps")
    else:
        raise SystemExit(f"unknown probe kind {kind!r}")
    return out


if __name__ == "__main__":
    kind, library, kernel_name, calls, device, source = (sys.argv[1:] + ["cpu", ""])[:6]
    print(json.dumps(main(kind, os.path.abspath(library), kernel_name, int(calls), device, source)))

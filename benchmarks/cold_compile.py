"""Where a kernel's first call on the CPU goes when nothing is cached: compiling its AIR.

Usage: python benchmarks/cold_compile.py [--processes N] [--baseline CHECKOUT] [--json OUT]
                                         [--kernels NAME ...]

Each kernel runs its first call in a fresh process with the disk cache off
(``TORCH_METALLIB_CACHE=0``), on small tensors, and checks the result against torch. The
probe times the first call (``time.perf_counter``) and, inside it, ``compile_kernel`` and
its steps as ``backends.cpu.jit.PHASES`` records them (private: each step's seconds without
the steps nested in it): parsing the AIR bitcode, printing it, lowering it to host IR
(Python text work, with its loop unrolling apart), parsing the host IR, the cooperative
schemes' rewrites, verifying, optimizing, code generation and loading the object. "rest"
is the first call minus the compile (binding, launch, the call record where the call
builds it). Interpreter start, imports and loading the library are outside the figures,
and so is the full garbage collection that importing torch makes due (``gc.collect()``
first: about 0.1 s that would otherwise land in whatever runs next).

Kernels: ``vv_Addfloat32`` and ``v_Expfloat32float32`` (element-wise, called directly),
RMS norm and softmax over rows (``torch_metallib.mlx``'s operators, MLX's ``rms`` and
``block_softmax`` kernels: cooperative, lane loops) and a matrix product
(``torch_metallib.mlx.matmul``: steel GEMM ``bm32_bn32_bk16_wm2_wn2``). MLX's operators
are defined untimed before the first call.

``--baseline CHECKOUT`` runs the same probes against another checkout of the package (its
root, with its compiled extension) in the same run, interleaved process by process
(alternating which goes first); a baseline without the step timer reports totals only.
Medians of ``--processes`` (default 5) per kernel and checkout. Python bytecode is cached
in a temporary ``PYTHONPYCACHEPREFIX`` filled by one untimed process per checkout, as in an
ordinary install.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROBE = r"""
import gc, json, sys, time
import torch
import torch_metallib
import torch_metallib.backends.cpu.backend as backend
import torch_metallib.backends.cpu.jit as jit
import torch_metallib.mlx as mlx
from torch_metallib.cache.corpus import mlx_metallib_path

name = sys.argv[1]
clock = time.perf_counter
compiles = []
import torch_metallib.ops._define as define
compile_kernel = jit.compile_kernel
def timed_compile(*args, **kwargs):
    start = clock()
    try:
        return compile_kernel(*args, **kwargs)
    finally:
        compiles.append(clock() - start)
backend.compile_kernel = define.compile_kernel = timed_compile

torch.manual_seed(0)
lib = torch_metallib.load(mlx_metallib_path())
a, b, out = torch.randn(1024), torch.randn(1024), torch.empty(1024)
X, W = torch.randn(8, 512), torch.randn(512)
A, B = torch.randn(64, 96), torch.randn(96, 80)
if name in ("rms_norm", "softmax", "matmul"):
    mlx.load()  # defines the operators, untimed
fn = lib[name] if name.startswith("v") else None
CASES = {
    "vv_Addfloat32": (lambda: fn(a, b, out, 1024), lambda r: torch.equal(out, a + b)),
    "v_Expfloat32float32": (lambda: fn(a, out, 1024), lambda r: torch.allclose(out, a.exp())),
    "rms_norm": (lambda: mlx.rms_norm(X, W),
                 lambda r: torch.allclose(r, X * torch.rsqrt(X.pow(2).mean(-1, keepdim=True) + 1e-5) * W,
                                          atol=1e-5, rtol=1e-5)),
    "softmax": (lambda: mlx.softmax(X), lambda r: torch.allclose(r, X.softmax(-1), atol=1e-6)),
    "matmul": (lambda: mlx.matmul(A, B), lambda r: torch.allclose(r, A @ B, atol=1e-4, rtol=1e-4)),
}
run, check = CASES[name]
gc.collect()  # the collection importing torch made due, which would land anywhere
start, cpu = clock(), time.thread_time()
result = run()
first, cpu = clock() - start, time.thread_time() - cpu
phases = {k: v if isinstance(v, tuple) else (v, v) for k, v in getattr(jit, "PHASES", {}).items()}
print(json.dumps({"first call": first * 1e3, "first call CPU": cpu * 1e3, "compile": sum(compiles) * 1e3,
                  "compiles": len(compiles), "phases": {k: v[0] * 1e3 for k, v in phases.items()},
                  "phases CPU": {k: v[1] * 1e3 for k, v in phases.items()},
                  "correct": bool(check(result))}))
"""

KERNELS = ("vv_Addfloat32", "v_Expfloat32float32", "rms_norm", "softmax", "matmul")
TARGETS_MS = {"vv_Addfloat32": 20.0, "v_Expfloat32float32": 20.0, "matmul": 300.0}


def probe_env(checkout: str, pycache: str) -> dict:
    env = {**os.environ, "PYTHONPATH": checkout, "PYTHONPYCACHEPREFIX": pycache, "TORCH_METALLIB_CACHE": "0"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def run_probe(name: str, env: dict) -> dict:
    result = subprocess.run([sys.executable, "-c", PROBE, name], env=env, capture_output=True, text=True,
                            cwd=tempfile.gettempdir())
    if result.returncode != 0:
        raise RuntimeError(f"probe of {name} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def medians(probes: list) -> dict:
    phases = sorted({k for p in probes for k in p["phases"]})
    return {"first call": statistics.median(p["first call"] for p in probes),
            "first call CPU": statistics.median(p.get("first call CPU", 0.0) for p in probes),
            "compile": statistics.median(p["compile"] for p in probes),
            "rest": statistics.median(p["first call"] - p["compile"] for p in probes),
            "phases": {k: statistics.median(p["phases"].get(k, 0.0) for p in probes) for k in phases},
            "phases CPU": {k: statistics.median(p.get("phases CPU", {}).get(k, 0.0) for p in probes)
                           for k in phases},
            "correct": sum(p["correct"] for p in probes), "runs": len(probes)}


def measure(kernels, checkouts: dict, processes: int) -> dict:
    """{kernel: {checkout label: medians}}, the checkouts' probes interleaved."""
    results = {}
    with tempfile.TemporaryDirectory(prefix="tm-pyc-") as pycache:
        envs = {label: probe_env(path, os.path.join(pycache, label)) for label, path in checkouts.items()}
        for env in envs.values():
            run_probe(kernels[0], env)  # fills the bytecode cache
        for name in kernels:
            probes = {label: [] for label in checkouts}
            labels = list(checkouts)
            for i in range(processes):
                for label in (labels if i % 2 == 0 else labels[::-1]):
                    probes[label].append(run_probe(name, envs[label]))
            results[name] = {label: medians(runs) for label, runs in probes.items()}
    return results


def print_report(results: dict, labels: list) -> None:
    for name, per in results.items():
        target = TARGETS_MS.get(name)
        print(f"\n{name}" + (f" (target: first call <= {target:g} ms)" if target else ""))
        print(f"  {'ms (medians)':34}" + "".join(f"{label:>14}" for label in labels))
        rows = ["first call", "first call CPU", "compile", "rest"]
        for row in rows:
            print(f"  {row:34}" + "".join(f"{per[label][row]:14.2f}" for label in labels))
        phases = sorted({k for label in labels for k in per[label]["phases"]},
                        key=lambda k: -max(per[label]["phases"].get(k, 0.0) for label in labels))
        print("    steps, wall | CPU")
        for phase in phases:
            print(f"    {phase:32}" + "".join(f"{per[label]['phases'].get(phase, 0.0):7.2f}|"
                                          f"{per[label]['phases CPU'].get(phase, 0.0):6.2f}" for label in labels))
        print(f"  {'correct':34}" + "".join(f"{per[label]['correct']:>11}/{per[label]['runs']:<2}"
                                            for label in labels))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=5, help="fresh processes per kernel and checkout")
    parser.add_argument("--baseline", metavar="CHECKOUT", help="another checkout to compare against")
    parser.add_argument("--kernels", nargs="+", choices=KERNELS, default=list(KERNELS))
    parser.add_argument("--json", metavar="OUT", help="also write all numbers to OUT")
    args = parser.parse_args()
    if args.processes < 1:
        parser.error("--processes must be at least 1")
    checkouts = {"this": ROOT}
    if args.baseline:
        checkouts = {"baseline": os.path.abspath(args.baseline), **checkouts}
    started = time.perf_counter()
    results = measure(args.kernels, checkouts, args.processes)
    print(f"cold first calls, {args.processes} fresh processes each, cache off "
          f"({time.perf_counter() - started:.0f} s, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f})")
    print_report(results, list(checkouts))
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"processes": args.processes, "checkouts": checkouts, "results": results}, out, indent=2)


if __name__ == "__main__":
    main()

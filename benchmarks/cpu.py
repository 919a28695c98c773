"""How fast torch_metallib runs Apple-built Metal kernels on CPU tensors, against torch.

Usage: python benchmarks/cpu.py [--repeat N] [--processes N] [--json OUT]

The kernels come from the reference corpus ``mlx.metallib`` (downloaded once into a cache);
on the CPU they are lowered from AIR, JIT-compiled with LLVM and cached in memory and on
disk. Three costs matter to a user, each measured against a baseline in the same run:

* throughput: ``lib.vv_Addfloat32(a, b, c, n)`` (c = a + b) on n = 2**24 float32 against
  ``torch.add(a, b, out=c)``, both warm (the first call is excluded), interleaved call by
  call (alternating which goes first), N repeats, medians; with torch's thread count and
  again with ``torch.set_num_threads(1)``. The kernel's output is checked once against
  torch's (bit for bit: float addition is exact).
* time to first result, in fresh processes: a subprocess imports torch and torch_metallib,
  loads the corpus by path and times (``time.perf_counter``) the first call on small
  tensors, which reflects the kernel (or reads its call record from the disk cache),
  compiles or loads it, and runs it: the time to first result (interpreter start,
  imports and load are reported apart). Cold: ``TORCH_METALLIB_CACHE_DIR`` is a new
  empty directory, so the kernel is compiled; warm: a second process on the same directory
  reads the compiled object from disk. Four kernels show the spread; each runs
  ``--processes`` cold/warm pairs, each pair with its own directory; medians, and a check
  of every result against torch.
  Where the time goes: as many pairs again, in which the first call's one-time steps are
  timed one by one ahead of it: importing the JIT modules (``__call__`` imports them on
  first use), the call record (reflection, or the disk cache) and native argument table,
  the host target machine,
  compile (cold) or cache read (warm) plus the MCJIT engine, then the call itself (binding
  + launch). This uses private functions (``_dispatch_state``, ``backends.cpu.jit``); the sum of
  the steps is shown next to the first result measured above, as a check.
  Python bytecode is cached (in a temporary ``PYTHONPYCACHEPREFIX`` filled by one untimed
  process) as in an ordinary install, so imports never include compiling source, even
  where ``PYTHONDONTWRITEBYTECODE`` is set. 4 kernels x 2 x 2 x ``--processes`` = 80
  processes by default, about 75 s.
* per-call overhead: ``lib.vv_Addfloat32(x, y, z, 4)`` on 4-element tensors, warm, 20
  batches of 2,000 calls, interleaved with batches of ``torch.add(x, y, out=z)`` on the
  same tensors; median per-call time in microseconds.

As in ``timeit``, the garbage collector is off in the timed loops.

Targets (reported as met/missed; the script never fails on them): throughput <= 1.5x
torch's time (each thread count), warm first result >= 20x faster than cold (each
kernel), per-call overhead <= 10 us median.
"""

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import llvmlite
import torch

import torch_metallib
from torch_metallib.cache.corpus import mlx_metallib_path

N = 2**24
WARMUP = 3
BATCHES = 20
CALLS = 2000
THROUGHPUT_TARGET = 1.5     # kernel time / torch time, at most
WARM_SPEEDUP_TARGET = 20.0  # cold / warm first result, at least
OVERHEAD_TARGET_US = 10.0

# --- (a) throughput -------------------------------------------------------------------


def throughput(kernel, threads: int, repeat: int) -> dict:
    """Interleaved warm timings (ms) of the kernel and torch.add at `threads` threads."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    a, b = torch.randn(N), torch.randn(N)
    c, d = torch.empty(N), torch.empty(N)
    runs = {"metallib": (lambda: kernel(a, b, c, N)), "torch": (lambda: torch.add(a, b, out=d))}
    samples = {name: [] for name in runs}
    try:
        for _ in range(WARMUP):
            for run in runs.values():
                run()
        equal = torch.equal(c, d)
        gc.disable()
        for i in range(repeat):
            for name in (("metallib", "torch") if i % 2 == 0 else ("torch", "metallib")):
                start = time.perf_counter_ns()
                runs[name]()
                samples[name].append((time.perf_counter_ns() - start) / 1e6)
    finally:
        gc.enable()
        torch.set_num_threads(previous)
    medians = {name: statistics.median(values) for name, values in samples.items()}
    return {"threads": threads, "equal_to_torch": equal, "median_ms": medians,
            "gb_per_s": {name: 12 * N / ms / 1e6 for name, ms in medians.items()},
            "ratio": medians["metallib"] / medians["torch"], "samples_ms": samples}


# --- (b) time to first result, in fresh processes --------------------------------------

# Runs one kernel (argv) once on small tensors; prints its timings and checks as JSON.
# Mode "public": the first call. Mode "split": the first call's
# one-time steps, each timed, in the order KernelFunction.__call__ runs them, then the call.
PROBE = r"""
import importlib, json, sys, time
clock = time.perf_counter
t0 = clock()
import torch
t1 = clock()
import torch_metallib
t2 = clock()

path, name, mode = sys.argv[1:]
lib = torch_metallib.load(path)
t3 = clock()

torch.manual_seed(0)
a, b, out = torch.randn(1024), torch.randn(1024), torch.empty(1024)
A, B, OUT = torch.randn(32, 32), torch.randn(32, 32), torch.empty(32, 32)
CASES = {  # name: (arguments, threads, check of the result)
    "vv_Addfloat32": ((a, b, out, 1024), None, lambda: torch.equal(out, a + b)),
    "v_Expfloat32float32": ((a, out, 1024), None, lambda: torch.allclose(out, a.exp())),
    "arangefloat32": ((2.0, 0.5, out), 1024,
                      lambda: torch.equal(out, 2.0 + 0.5 * torch.arange(1024.0))),
    "g2_Multiplyfloat32": ((A, B, OUT, [32, 1], [32, 1]), (32, 32),
                           lambda: torch.equal(OUT, A * B)),
}
args, threads, check = CASES[name]
function = lib[name]

steps = []
def step(label, work):
    start = clock()
    result = work()
    steps.append((label, (clock() - start) * 1e3))
    return result

if mode == "split":
    def import_jit():
        importlib.import_module("torch_metallib.dispatch.calls")  # what __call__ imports
        return importlib.import_module("torch_metallib.backends.cpu.jit")
    jit = step("import the JIT modules", import_jit)
    state = step("call record (reflection or disk) + argument table", function._dispatch_state)
    step("host target machine", lambda: jit.host().machine)
    constants = state.spec.bind(args, {}, threads, None, None, None).constants
    step("compile or cache read + engine", lambda: jit.compile_kernel(function, constants, state.serial, state.cooperative))
    step("call (bind + launch)", lambda: function(*args, threads=threads))
else:
    step("first call", lambda: function(*args, threads=threads))
jit = sys.modules["torch_metallib.backends.cpu.jit"]
print(json.dumps({"import torch": (t1 - t0) * 1e3, "import torch_metallib": (t2 - t1) * 1e3,
                  "load(path)": (t3 - t2) * 1e3, "steps": steps, "correct": bool(check()),
                  "from_disk": any(c.from_disk for c in jit._compiled.values())}))
"""

KERNELS = ("vv_Addfloat32", "v_Expfloat32float32", "arangefloat32", "g2_Multiplyfloat32")
MODES = ("public", "split")
STATES = ("cold", "warm")
OUTSIDE = ("import torch", "import torch_metallib", "load(path)", "process wall")


def probe_env(pycache: str, cache_dir: str = "") -> dict:
    """The probes' environment: Python bytecode cached under `pycache`, as in an ordinary
    install (even if PYTHONDONTWRITEBYTECODE is set here), and the JIT cache in `cache_dir`."""
    env = {**os.environ, "PYTHONPYCACHEPREFIX": pycache, "TORCH_METALLIB_CACHE_DIR": cache_dir}
    for name in ("PYTHONDONTWRITEBYTECODE", "TORCH_METALLIB_CACHE"):
        env.pop(name, None)
    return env


def run_probe(path: str, name: str, mode: str, env: dict) -> dict:
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", PROBE, path, name, mode], env=env,
                            capture_output=True, text=True)
    wall = (time.perf_counter() - start) * 1e3
    if result.returncode != 0:
        raise RuntimeError(f"probe of {name} ({mode}) failed:\n{result.stderr}")
    probe = json.loads(result.stdout)
    probe["process wall"] = wall
    probe["first result"] = sum(ms for _, ms in probe["steps"])
    return probe


def interpreter_start(runs: int, env: dict) -> float:
    """Median wall time (ms) of ``python -c pass``: start-up and exit, no imports."""
    walls = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
        walls.append((time.perf_counter() - start) * 1e3)
    return statistics.median(walls)


def medians(probes: list) -> dict:
    labels = [label for label, _ in probes[0]["steps"]]
    return {
        **{key: statistics.median(p[key] for p in probes) for key in ("first result", *OUTSIDE)},
        "steps": {label: statistics.median(dict(p["steps"])[label] for p in probes)
                  for label in labels},
        "from_disk": sum(p["from_disk"] for p in probes),
        "correct": sum(p["correct"] for p in probes),
    }


def first_results(path: str, processes: int, pycache: str) -> dict:
    """Per kernel and mode: `processes` cold/warm pairs (a new cache directory each) and
    their medians; the cold/warm ratio of the public first result."""
    out = {}
    for name in KERNELS:
        runs = {mode: {state: [] for state in STATES} for mode in MODES}
        for _ in range(processes):
            for mode in MODES:
                with tempfile.TemporaryDirectory(prefix="tm-jit-") as cache_dir:
                    env = probe_env(pycache, cache_dir)
                    for state in STATES:
                        runs[mode][state].append(run_probe(path, name, mode, env))
        stats = {mode: {state: medians(runs[mode][state]) for state in STATES} for mode in MODES}
        public = stats["public"]
        out[name] = {"median_ms": stats,
                     "ratio": public["cold"]["first result"] / public["warm"]["first result"],
                     "runs": runs}
    return out


# --- (c) per-call overhead --------------------------------------------------------------


def overhead(kernel) -> dict:
    """Median per-call time (us) over batches of tiny calls, kernel and torch interleaved."""
    x, y, z = torch.randn(4), torch.randn(4), torch.empty(4)

    def kernel_batch():
        for _ in range(CALLS):
            kernel(x, y, z, 4)

    def torch_batch():
        add = torch.add
        for _ in range(CALLS):
            add(x, y, out=z)

    batches = {"metallib": kernel_batch, "torch": torch_batch}
    samples = {name: [] for name in batches}
    for batch in batches.values():
        batch()
    gc.disable()
    try:
        for _ in range(BATCHES):
            for name, batch in batches.items():
                start = time.perf_counter_ns()
                batch()
                samples[name].append((time.perf_counter_ns() - start) / 1e3 / CALLS)
    finally:
        gc.enable()
    medians = {name: statistics.median(values) for name, values in samples.items()}
    return {"median_us": medians, "ratio": medians["metallib"] / medians["torch"],
            "samples_us": samples}


# --- report ---------------------------------------------------------------------------


def evaluate(rates: list, firsts: dict, calls: dict) -> dict:
    targets = {}
    for rate in rates:
        targets[f"add 2**24, {rate['threads']} thread(s): <= {THROUGHPUT_TARGET:g}x torch"] = {
            "value": rate["ratio"], "met": rate["ratio"] <= THROUGHPUT_TARGET}
    for name, first in firsts.items():
        targets[f"{name}: cold/warm >= {WARM_SPEEDUP_TARGET:g}x"] = {
            "value": first["ratio"], "met": first["ratio"] >= WARM_SPEEDUP_TARGET}
    median = calls["median_us"]["metallib"]
    targets[f"per-call overhead <= {OVERHEAD_TARGET_US:g} us"] = {
        "value": median, "met": median <= OVERHEAD_TARGET_US}
    return targets


def print_report(header: dict, rates: list, firsts: dict, calls: dict, targets: dict) -> None:
    print(f"torch {header['torch']} ({header['torch_threads']} threads by default, "
          f"{header['cpus']} CPUs), llvmlite {header['llvmlite']}")
    print(f"{header['file']}\n")

    print(f"(a) c = a + b, n = 2**24 float32, warm, {header['repeat']} interleaved repeats, "
          f"medians")
    print(f"{'':12} {'metallib ms':>12} {'torch ms':>10} {'ratio':>8} "
          f"{'metallib GB/s':>14} {'torch GB/s':>11}  equal")
    for rate in rates:
        ms, gbs = rate["median_ms"], rate["gb_per_s"]
        print(f"{str(rate['threads']) + ' thread(s)':12} {ms['metallib']:12.3f} "
              f"{ms['torch']:10.3f} {rate['ratio']:7.2f}x {gbs['metallib']:14.1f} "
              f"{gbs['torch']:11.1f}  {rate['equal_to_torch']}")

    processes = header["processes"]
    print(f"\n(b) time to first result in a fresh process (the first call), ms, "
          f"medians of {processes}")
    print(f"{'':22} {'cold':>8} {'warm':>8} {'cold/warm':>10} "
          f"{'from disk c|w':>14} {'correct':>8}")
    for name, first in firsts.items():
        cold, warm = first["median_ms"]["public"]["cold"], first["median_ms"]["public"]["warm"]
        disk = f"{cold['from_disk']}|{warm['from_disk']} of {processes}"
        print(f"{name:22} {cold['first result']:8.2f} {warm['first result']:8.2f} "
              f"{first['ratio']:9.1f}x {disk:>14} "
              f"{cold['correct'] + warm['correct']:>5}/{2 * processes}")
    print("  where it goes: other processes run the first call's one-time steps ahead of it, "
          "ms, cold | warm")
    print(f"  {'':32}" + "".join(f" {name:>19}" for name in firsts))
    splits = [first["median_ms"]["split"] for first in firsts.values()]
    publics = [first["median_ms"]["public"] for first in firsts.values()]
    rows = [(label, [(s["cold"]["steps"][label], s["warm"]["steps"][label]) for s in splits])
            for label in splits[0]["warm"]["steps"]]
    rows.append(("sum of the steps", [(s["cold"]["first result"], s["warm"]["first result"])
                                      for s in splits]))
    rows.append(("(first result above)", [(p["cold"]["first result"], p["warm"]["first result"])
                                          for p in publics]))
    for label, cells in rows:
        print(f"  {label:32}" + "".join(f" {cold:9.2f} |{warm:7.2f}" for cold, warm in cells))
    everything = [p for first in firsts.values() for mode in first["runs"].values()
                  for probes in mode.values() for p in probes]
    print("  not included, medians over all processes:")
    print(f"    {'interpreter start + exit (python -c pass)':44}{header['interpreter_ms']:8.1f}")
    for key in OUTSIDE:
        print(f"    {key:44}{statistics.median(p[key] for p in everything):8.1f}")

    us = calls["median_us"]
    print(f"\n(c) per call, 4 elements, warm, median of {BATCHES} batches x {CALLS:,} calls, us")
    print(f"  lib.vv_Addfloat32(x, y, z, 4)   {us['metallib']:8.2f}")
    print(f"  torch.add(x, y, out=z)          {us['torch']:8.2f}")
    print(f"  ratio                           {calls['ratio']:7.2f}x")

    print("\ntargets:")
    for name, target in targets.items():
        print(f"  {name:46} {target['value']:8.2f}   {'met' if target['met'] else 'missed'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=30,
                        help="throughput repeats (default 30)")
    parser.add_argument("--processes", type=int, default=5,
                        help="cold/warm process pairs per kernel (default 5)")
    parser.add_argument("--json", metavar="OUT", help="also write all numbers to OUT")
    args = parser.parse_args()
    if args.repeat < 1 or args.processes < 1:
        parser.error("--repeat and --processes must be at least 1")

    path = mlx_metallib_path()
    lib = torch_metallib.load(path)
    kernel = lib.vv_Addfloat32
    header = {"file": path, "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
              "cpus": os.cpu_count(), "llvmlite": llvmlite.__version__,
              "repeat": args.repeat, "processes": args.processes, "warmup": WARMUP,
              "batches": BATCHES, "calls": CALLS}

    rates = [throughput(kernel, threads, args.repeat)
             for threads in dict.fromkeys((torch.get_num_threads(), 1))]
    with tempfile.TemporaryDirectory(prefix="tm-pyc-") as pycache:
        with tempfile.TemporaryDirectory(prefix="tm-jit-") as cache_dir:  # fills `pycache`
            run_probe(path, KERNELS[0], "split", probe_env(pycache, cache_dir))
        header["interpreter_ms"] = interpreter_start(args.processes, probe_env(pycache))
        firsts = first_results(path, args.processes, pycache)
    calls = overhead(kernel)
    targets = evaluate(rates, firsts, calls)
    print_report(header, rates, firsts, calls, targets)
    if args.json:
        with open(args.json, "w") as out:
            json.dump({**header, "throughput": rates, "first_result": firsts,
                       "per_call": calls, "targets": targets}, out, indent=2)


if __name__ == "__main__":
    main()

"""How fast torch_metallib reflects a kernel's AIR bitcode, on a real Apple-built library.

Usage: python benchmarks/reflect.py [--repeats N] [--skip-whole] [--json OUT]

The workload is the reference corpus ``mlx.metallib`` (17,248 kernels, downloaded once into
a cache). Reflection (arguments, constants, threadgroup memory...) is computed lazily, the
first time a kernel's signature is asked for, so its cold cost per kernel is what a user
pays; tools that list a whole library pay it 17,248 times.

Timed, on one CPU core where the OS allows it, with the garbage collector off in the timed
loops (as in ``timeit``):

* per kernel: ``reflect(name, lib[name].bitcode)`` called directly (cold: no KernelFunction
  cache), on 1,000 kernels chosen with ``random.Random(0).sample`` over the function names.
  The bitcode memoryview is fetched before the clock starts.
* the baseline on the same kernels: the bare llvmlite work reflection cannot avoid (new
  context, ``parse_bitcode``, ``str(module)``, close both). reflect minus baseline is the
  Python overhead on top of LLVM. For each kernel the baseline runs right before reflect,
  so machine noise hits both alike.
* the 1,000-kernel pass is repeated ``--repeats`` times; figures are over all samples, and
  the per-pass medians show the spread. A short untimed warm-up pass comes first.
* the whole library: ``reflect`` on all 17,248 kernels in order (including the ``lib[name]``
  lookup), once; total seconds, kernels/s and failures (expected 0).

Target (reported as met/missed; the script never fails on it): median <= 0.5 ms per kernel.
"""

import argparse
import gc
import json
import os
import random
import statistics
import time

import llvmlite
import llvmlite.binding as llvm

import torch_metallib
from torch_metallib.cache.corpus import mlx_metallib_path
from torch_metallib.reflection.reflect import reflect

SAMPLE = 1000
SEED = 0
WARMUP = 20  # kernels reflected (and baselined) untimed before the first pass
MEDIAN_TARGET_MS = 0.5


def pin_to_one_core():
    """Pins this process to its first allowed CPU; returns it, or None if not supported."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    core = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {core})
    return core


# --- the llvmlite baseline ------------------------------------------------------------


def baseline(bitcode) -> None:
    """What reflect cannot avoid: parse the bitcode in a fresh context and print it."""
    context = llvm.create_context()
    module = llvm.parse_bitcode(bytes(bitcode), context=context)
    str(module)
    module.close()
    context.close()


# --- timing ---------------------------------------------------------------------------


def one_pass(kernels: list) -> tuple:
    """(baseline ms, reflect ms) per kernel, interleaved, with the garbage collector off."""
    clock = time.perf_counter_ns
    base, refl = [], []
    gc.collect()
    gc.disable()
    try:
        for name, bitcode in kernels:
            start = clock()
            baseline(bitcode)
            middle = clock()
            reflect(name, bitcode)
            end = clock()
            base.append((middle - start) / 1e6)
            refl.append((end - middle) / 1e6)
    finally:
        gc.enable()
    return base, refl


def summary(values: list) -> dict:
    deciles = statistics.quantiles(values, n=10, method="inclusive")
    return {"median": statistics.median(values), "p90": deciles[-1], "max": max(values)}


def time_sample(lib, repeats: int) -> dict:
    names = random.Random(SEED).sample(lib.function_names, SAMPLE)
    kernels = [(name, lib[name].bitcode) for name in names]
    one_pass(kernels[:WARMUP])
    passes = [one_pass(kernels) for _ in range(repeats)]
    base = [t for b, _ in passes for t in b]
    refl = [t for _, r in passes for t in r]
    diff = [r - b for b, r in zip(base, refl)]
    return {
        "reflect": {**summary(refl), "samples": refl},
        "baseline": {**summary(base), "samples": base},
        "difference": {**summary(diff)},
        "ratio": statistics.median(refl) / statistics.median(base),
        "per_pass": [{"reflect": statistics.median(r), "baseline": statistics.median(b),
                      "difference": statistics.median([y - x for x, y in zip(b, r)])}
                     for b, r in passes],
    }


def time_whole(lib) -> dict:
    """Reflects every function once, in order; counts (and keeps a few) failures."""
    failures = []
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        for name in lib.function_names:
            try:
                reflect(name, lib[name].bitcode)
            except Exception as error:  # counted, not fatal: the count is the result
                failures.append(f"{name}: {error}")
        elapsed = time.perf_counter() - start
    finally:
        gc.enable()
    count = len(lib.function_names)
    return {"kernels": count, "seconds": elapsed, "kernels_per_s": count / elapsed,
            "failures": len(failures), "first_failures": failures[:5]}


# --- report ---------------------------------------------------------------------------


def print_report(header: dict, sample: dict, whole) -> None:
    core = header["core"]
    print(f"{header['file']}: {header['functions']:,} functions, llvmlite "
          f"{header['llvmlite']} (LLVM {header['llvm']})")
    print(f"pinned to CPU core {core}" if core is not None else "not pinned (no sched_setaffinity)")
    print("garbage collector disabled in the timed loops")
    print(f"{SAMPLE:,} kernels (random.Random({SEED}).sample), {header['repeats']} pass{'es' if header['repeats'] > 1 else ''} "
          f"after {WARMUP} warm-up kernels, in ms per kernel\n")
    print(f"{'':34} {'median':>9} {'p90':>9} {'max':>9}")
    for label, key in (("reflect(name, bitcode)", "reflect"),
                       ("llvmlite baseline", "baseline"),
                       ("reflect - baseline (per kernel)", "difference")):
        stats = sample[key]
        print(f"{label:34} {stats['median']:9.3f} {stats['p90']:9.3f} {stats['max']:9.3f}")
    print(f"\n{'reflect / baseline (medians)':34} {sample['ratio']:8.2f}x")
    print("\nper-pass medians (reflect, baseline, difference):")
    for i, p in enumerate(sample["per_pass"], 1):
        print(f"  pass {i}: {p['reflect']:9.3f} {p['baseline']:9.3f} {p['difference']:9.3f}")
    if whole is not None:
        print(f"\nwhole library: {whole['kernels']:,} kernels in {whole['seconds']:.2f} s, "
              f"{whole['kernels_per_s']:,.0f} kernels/s, {whole['failures']} failures")
        for failure in whole["first_failures"]:
            print(f"  {failure}")
    median = sample["reflect"]["median"]
    verdict = "met" if median <= MEDIAN_TARGET_MS else "missed"
    print(f"\ntarget: reflect median <= {MEDIAN_TARGET_MS:g} ms on one core: "
          f"{median:.3f} ms   {verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3,
                        help="passes over the 1,000 kernels (default 3)")
    parser.add_argument("--skip-whole", action="store_true",
                        help="skip reflecting the whole library (~15-20 s)")
    parser.add_argument("--json", metavar="OUT", help="also write all numbers to OUT")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")

    core = pin_to_one_core()
    path = mlx_metallib_path()
    lib = torch_metallib.load(path)
    header = {"file": path, "functions": len(lib), "core": core, "repeats": args.repeats,
              "sample": SAMPLE, "seed": SEED, "warmup_kernels": WARMUP, "gc_disabled": True,
              "llvmlite": llvmlite.__version__,
              "llvm": ".".join(map(str, llvm.llvm_version_info))}

    sample = time_sample(lib, args.repeats)
    whole = None if args.skip_whole else time_whole(lib)
    print_report(header, sample, whole)
    if args.json:
        median = sample["reflect"]["median"]
        with open(args.json, "w") as out:
            json.dump({**header, "per_kernel_ms": sample, "whole_library": whole,
                       "target": {"median_ms_max": MEDIAN_TARGET_MS, "value": median,
                                  "met": median <= MEDIAN_TARGET_MS}}, out, indent=2)


if __name__ == "__main__":
    main()

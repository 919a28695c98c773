"""The CUDA backend's lowering time (AIR -> PTX), no GPU needed (<= 20 ms median per kernel).

Usage: python benchmarks/cuda_lowering.py [--against CHECKOUT] [--rounds N] [--json OUT] [--metallib PATH]

Kernels: those benchmarks/cuda_kernels.py runs, then the first kernel of 50 other MLX families
(fixed seed). Each round lowers every kernel once in a fresh process, disk cache off (the
first kernel pays for parsing libdevice and setting up LLVM, as in a real first call);
a kernel's time is its median over the rounds, reported as median and p90 over kernels,
in wall time and in the lowering thread's CPU time (steadier where other work shares the
machine).
With ``--against`` another checkout (a baseline: its ``torch_metallib`` with a built
``_C``) is measured alike in the same run, rounds alternating which goes first.
"""

import argparse
import inspect
import json
import os
import random
import statistics
import subprocess
import sys
import time

NAMES = ["vv_Addfloat32", "v_Expfloat32float32", "block_softmax_float32", "looped_softmax_float32", "rmsfloat32",
         "layer_normfloat32", "contig_scan_inclusive_sum_float32_float32",
         "steel_gemm_fused_nn_float32_float32_bm32_bn32_bk16_wm2_wn2"]


def lowering_times(lib, names) -> dict:
    """Seconds to lower each kernel (refused ones apart), in this process, as the CUDA
    backend lowers it (grid-only kernels may be coarsened: backends/cuda/coarsening.py)."""
    from torch_metallib.backends.cuda.backend import grid_only
    from torch_metallib.backends.cuda.ptx import kernel_ptx
    from torch_metallib.dispatch.calls import dispatch_state
    from torch_metallib.errors import UnsupportedKernelError
    coarsens = "grid_only" in inspect.signature(kernel_ptx).parameters  # not in a baseline before coarsening
    seconds, cpu_seconds, refused = [], [], []
    for name in names:
        options = {}
        if coarsens:
            state = dispatch_state(lib[name])
            options["grid_only"] = grid_only(lib[name], state.cooperative, state.serial)
        start, cpu_start = time.perf_counter(), time.thread_time()
        try:
            kernel_ptx(lib[name], {}, "k", **options)
        except UnsupportedKernelError:
            refused.append(name)
            continue
        seconds.append(time.perf_counter() - start)
        cpu_seconds.append(time.thread_time() - cpu_start)
    return {"kernels": len(seconds), "refused": refused, "median_ms": 1000 * statistics.median(seconds),
            "p90_ms": 1000 * _p90(seconds), "max_ms": 1000 * max(seconds), "seconds": seconds,
            "cpu_seconds": cpu_seconds}


def _p90(values) -> float:
    ordered = sorted(values)
    return ordered[int(0.9 * (len(ordered) - 1))]


def lowering_names(lib, sample: int = 50, seed: int = 0) -> list:
    from torch_metallib.cli.cuda_coverage import compute_kernels, families
    groups = families(compute_kernels(lib))
    keys = sorted(k for k, members in groups.items() if not set(members) & set(NAMES))
    return NAMES + [groups[k][0] for k in random.Random(seed).sample(keys, sample)]


_ROUND = """
import json, sys
sys.path.insert(0, {here!r})
import torch_metallib as tm
from cuda_lowering import lowering_names, lowering_times
lib = tm.load({path!r})
print(json.dumps(lowering_times(lib, lowering_names(lib))))
"""


def measure(path: str, checkouts: dict, rounds: int) -> dict:
    here = os.path.dirname(os.path.abspath(__file__))
    runs = {name: [] for name in checkouts}
    for i in range(rounds):
        for name in (list(checkouts) if i % 2 == 0 else list(checkouts)[::-1]):
            environment = dict(os.environ, TORCH_METALLIB_CACHE="0", PYTHONPATH=checkouts[name])
            out = subprocess.run([sys.executable, "-c", _ROUND.format(here=here, path=path)], env=environment,
                                 cwd=checkouts[name], check=True, capture_output=True, text=True).stdout
            runs[name].append(json.loads(out.splitlines()[-1]))
    result = {}
    for name, found in runs.items():
        result[name] = {"checkout": checkouts[name], "kernels": found[0]["kernels"], "refused": found[0]["refused"]}
        for clock in ("seconds", "cpu_seconds"):  # wall time; the thread's CPU time (on a shared machine)
            per_kernel = [statistics.median(r[clock][k] for r in found) for k in range(found[0]["kernels"])]
            result[name][clock] = {"median_ms": 1000 * statistics.median(per_kernel), "p90_ms": 1000 * _p90(per_kernel),
                                   "max_ms": 1000 * max(per_kernel), "first_ms": 1000 * per_kernel[0],
                                   "per_kernel_ms": [1000 * s for s in per_kernel]}
            r = result[name][clock]
            print(f"{name:8} {checkouts[name]} {'wall' if clock == 'seconds' else 'CPU '}: {len(per_kernel)} kernels "
                  f"({len(found[0]['refused'])} refused): median {r['median_ms']:.1f} ms, p90 {r['p90_ms']:.1f} ms, "
                  f"max {r['max_ms']:.1f} ms, first {r['first_ms']:.1f} ms (per kernel, median of {rounds} processes)")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", help="another checkout to measure alike (a baseline)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--metallib", help="mlx.metallib (default: the cached corpus)")
    args = parser.parse_args()
    if args.metallib is None:
        from torch_metallib.cache.corpus import mlx_metallib_path
        args.metallib = mlx_metallib_path()
    checkouts = {"this": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    if args.against:
        checkouts["against"] = os.path.abspath(args.against)
    result = measure(args.metallib, checkouts, args.rounds)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()

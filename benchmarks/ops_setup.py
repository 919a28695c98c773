"""Set-up time of MLX's operators (``torch_metallib.mlx.load()``: loading mlx.metallib and
defining every ``torch.ops.tm_mlx`` operator) in fresh processes, with an empty disk cache
and a warm one.

Usage: python benchmarks/ops_setup.py [--repeat N] [--baseline CHECKOUT] [--json OUT]

Each process imports ``torch_metallib.mlx`` (timed apart), then times ``mlx.load()`` with
perf_counter (wall) and thread_time (the calling thread's CPU time, which other load on
the machine disturbs least), and counts the kernels it reflects (parses the bitcode of).
"empty cache" gives each process a new cache folder; "warm cache" one that an earlier
process filled. Figures are medians over --repeat processes per mode. --baseline names
another checkout of this repository (e.g. a ``git worktree`` of main), measured in the same
run, its processes alternating with this one's.
"""

import argparse
import os
import statistics
import sys
import tempfile

from _timing import fresh_process, medians, report

CHILD = r"""
import json, time
started = time.perf_counter()
import torch_metallib.library.function as function_module
from torch_metallib import mlx
imported = time.perf_counter()
reflected = []
real = function_module.reflect
function_module.reflect = lambda name, *args: reflected.append(name) or real(name, *args)
wall, cpu = time.perf_counter(), time.thread_time()
operators = mlx.load()
wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
print(json.dumps({"import": imported - started, "wall": wall, "cpu": cpu, "reflected": len(reflected),
                  "operators": len(operators)}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="fresh processes per checkout and mode (default 7)")
    parser.add_argument("--baseline", metavar="CHECKOUT",
                        help="another checkout of this repository to measure in the same run")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    codes = {"this": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    if args.baseline:
        codes["baseline"] = os.path.abspath(args.baseline)
    base = {k: v for k, v in os.environ.items()
            if k not in ("TORCH_METALLIB_ARCHIVES", "TORCH_METALLIB_CACHE", "TORCH_METALLIB_LOG")}
    runs = {}
    with tempfile.TemporaryDirectory() as folder:
        envs = {name: {**base, "PYTHONPATH": os.pathsep.join(filter(None, [code, base.get("PYTHONPATH")]))}
                for name, code in codes.items()}
        for name, code in codes.items():
            warm = os.path.join(folder, name, "warm")
            fresh_process(code, CHILD, {**envs[name], "TORCH_METALLIB_CACHE_DIR": warm})  # fills it
        for i in range(args.repeat):  # checkouts and modes in turn: load drifts over the run
            for name, code in codes.items():
                modes = {"empty cache": os.path.join(folder, name, f"empty{i}"),
                         "warm cache": os.path.join(folder, name, "warm")}
                for mode, cache in modes.items():
                    runs.setdefault((mode, name), []).append(
                        fresh_process(code, CHILD, {**envs[name], "TORCH_METALLIB_CACHE_DIR": cache}))
    figures = {key: {**medians(found, ("import", "wall", "cpu")), "reflected": statistics.median(
        r["reflected"] for r in found), "operators": found[0]["operators"]} for key, found in sorted(runs.items())}
    report(f"mlx.load() in fresh processes, median of {args.repeat}",
           [("mode", "12"), ("code", "9"), ("import ms", "9.1f"), ("load ms", "8.1f"), ("load CPU ms", "11.1f"),
            ("reflected", "9.0f"), ("operators", "9d")],
           figures, lambda names, f: (*names, f["import"], f["wall"], f["cpu"], f["reflected"], f["operators"]),
           args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

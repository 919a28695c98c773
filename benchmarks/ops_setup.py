"""Set-up time of MLX's operators (``torch_metallib.mlx.load()``: loading mlx.metallib and
defining every ``torch.ops.tm_mlx`` operator) in fresh processes, with an empty disk cache
and a warm one, and with --archive also with the disk cache off and an archive
(``precompile``) of the kernels the operators use.

Usage: python benchmarks/ops_setup.py [--repeat N] [--archive] [--baseline CHECKOUT] [--json OUT]

Each process imports ``torch_metallib.mlx`` (timed apart), then times ``mlx.load()`` with
perf_counter (wall) and thread_time (the calling thread's CPU time, which other load on
the machine disturbs least), and counts the kernels it reflects (parses the bitcode of).
"empty cache" gives each process a new cache folder; "warm cache" one that an earlier
process filled; "archive only" TORCH_METALLIB_CACHE=0 and an archive that each checkout's
own ``precompile`` built (about a minute each: a hundred kernels compile, the others need
function constants). Figures are medians over --repeat processes per mode. --baseline names
another checkout of this repository (e.g. a ``git worktree`` of main), measured in the same
run, its processes alternating with this one's.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

from _timing import fresh_process, medians, report

from torch_metallib.cache.corpus import mlx_metallib_path

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


KERNELS = r"""
from torch_metallib import mlx
print(" ".join(sorted({f.name for op in mlx.load().values() for f in op.kernels.values()})))
"""


def archive(code: str, env: dict, folder: str) -> str:
    """An archive of the kernels MLX's operators use, built by checkout `code`'s precompile."""
    kernels = subprocess.run([sys.executable, "-c", KERNELS], capture_output=True, text=True, env=env, check=True,
                             cwd=code).stdout.split()
    path = os.path.join(folder, "mlx.tmar")
    subprocess.run([sys.executable, "-m", "torch_metallib", "precompile", mlx_metallib_path(), "-o", path,
                    *(arg for kernel in kernels for arg in ("--kernel", kernel))],
                   env={**env, "TORCH_METALLIB_CACHE": "0"}, cwd=code, check=True, stdout=subprocess.DEVNULL)
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="fresh processes per checkout and mode (default 7)")
    parser.add_argument("--baseline", metavar="CHECKOUT",
                        help="another checkout of this repository to measure in the same run")
    parser.add_argument("--archive", action="store_true",
                        help="also measure an archive-only start (builds an archive per checkout first)")
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
        archives = {}
        for name, code in codes.items():
            warm = os.path.join(folder, name, "warm")
            fresh_process(code, CHILD, {**envs[name], "TORCH_METALLIB_CACHE_DIR": warm})  # fills it
            if args.archive:
                archives[name] = archive(code, envs[name], os.path.join(folder, name))
        for i in range(args.repeat):  # checkouts and modes in turn: load drifts over the run
            for name, code in codes.items():
                modes = {"empty cache": {"TORCH_METALLIB_CACHE_DIR": os.path.join(folder, name, f"empty{i}")},
                         "warm cache": {"TORCH_METALLIB_CACHE_DIR": os.path.join(folder, name, "warm")}}
                if args.archive:
                    modes["archive only"] = {"TORCH_METALLIB_CACHE": "0", "TORCH_METALLIB_ARCHIVES": archives[name]}
                for mode, environment in modes.items():
                    runs.setdefault((mode, name), []).append(fresh_process(code, CHILD, {**envs[name], **environment}))
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

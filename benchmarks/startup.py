"""First call against hundredth call of MLX kernels on the CPU backend, in fresh processes:
with a cold JIT (TORCH_METALLIB_CACHE=0), a warm disk cache, and an ahead-of-time archive
(``python -m torch_metallib precompile``), side by side in one run.

Usage: python benchmarks/startup.py [--repeat N] [--threads N] [--baseline CHECKOUT] [--json OUT]

Each process loads mlx.metallib and defines MLX's operators before timing (that cost is
the same in every mode), then times each kernel's first call and its hundredth, kernel
after kernel: the first kernel's first call also pays the process's one-time set-up
(LLVM's target machine, the code fingerprint, reading the archive). Figures are medians
over --repeat processes per mode, wall time and the calling thread's CPU time (which other
load on the machine disturbs least). --baseline names another checkout of this repository
(e.g. a ``git worktree`` of main), measured in the same run with its own archive, its
processes alternating with this one's. Target: with an archive, a first call is at most
2 ms slower than the hundredth.
"""

import argparse
import os
import subprocess
import sys
import tempfile

from _timing import fresh_process, medians, report

from torch_metallib.cache.corpus import mlx_metallib_path

# (label, kernel the archive holds, what the child calls)
KERNELS = (("vv_Addfloat32 (elementwise)", "vv_Addfloat32", "add"),
           ("rmsfloat32 (cooperative, lanes)", "rmsfloat32", "rms"),
           ("softmax (block_softmax_float32)", "block_softmax_float32", "softmax"))

CHILD = r"""
import json, sys, time, torch, torch_metallib as tm
from torch_metallib import mlx
torch.set_num_threads(int(sys.argv[1]))
mlx.load()  # operators defined before timing: the same cost in every mode
lib = tm.load(mlx.library_path())
a, b, c = torch.randn(4096), torch.randn(4096), torch.empty(4096)
x, w = torch.randn(32, 256), torch.randn(256)
calls = {"add": lambda: lib.vv_Addfloat32(a, b, c, threads=4096),
         "rms": lambda: mlx.rms_norm(x, w, 1e-5),
         "softmax": lambda: mlx.softmax(x)}
figures = {}
for which, call in calls.items():  # in order: the first kernel also pays the process's one-time set-up
    times, cpu = [], []
    for _ in range(100):
        started, started_cpu = time.perf_counter(), time.thread_time()
        call()
        times.append(time.perf_counter() - started)
        cpu.append(time.thread_time() - started_cpu)
    figures[which] = {"first": times[0], "hundredth": times[-1], "first CPU": cpu[0], "hundredth CPU": cpu[-1]}
print(json.dumps(figures))
"""


def _modes(code: str, folder: str, base: dict) -> dict:
    """The three modes' environments for the package at `code`, its archive built by it."""
    env = {**base, "PYTHONPATH": os.pathsep.join(filter(None, [code, base.get("PYTHONPATH")]))}
    archive = os.path.join(folder, "mlx.tmar")
    kernels = [arg for _, kernel, _ in KERNELS for arg in ("--kernel", kernel)]
    subprocess.run([sys.executable, "-m", "torch_metallib", "precompile", mlx_metallib_path(), *kernels,
                    "-o", archive], check=True, env=env, cwd=code)
    return {
        "cold JIT": {**env, "TORCH_METALLIB_CACHE": "0"},
        "warm disk cache": {**env, "TORCH_METALLIB_CACHE": "1", "TORCH_METALLIB_CACHE_DIR": os.path.join(folder, "c")},
        "archive": {**env, "TORCH_METALLIB_CACHE": "0", "TORCH_METALLIB_ARCHIVES": archive},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="fresh processes per mode")
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads in each process (default 1: on a busy machine, waking the pool's "
                             "threads adds noise to single calls)")
    parser.add_argument("--baseline", metavar="CHECKOUT",
                        help="another checkout of this repository to measure in the same run")
    args = parser.parse_args()
    this = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    codes = {"this": this}
    if args.baseline:
        codes["baseline"] = os.path.abspath(args.baseline)
    base = {k: v for k, v in os.environ.items() if k not in ("TORCH_METALLIB_ARCHIVES", "TORCH_METALLIB_LOG")}
    with tempfile.TemporaryDirectory() as folder:
        modes = {}
        for name, code in codes.items():
            os.makedirs(os.path.join(folder, name))
            modes[name] = _modes(code, os.path.join(folder, name), base)
            fresh_process(code, CHILD, modes[name]["warm disk cache"], str(args.threads))  # fills the disk cache
        runs = {}
        for _ in range(args.repeat):  # one process per checkout and mode in turn: load drifts over the run
            for name in codes:
                for mode, env in modes[name].items():
                    runs.setdefault((name, mode), []).append(fresh_process(codes[name], CHILD, env, str(args.threads)))
    figures = {}
    for label, _, which in KERNELS:
        for mode in modes["this"]:
            for name in codes:
                figures[(label, mode, name)] = medians([r[which] for r in runs[(name, mode)]],
                                                       ("first", "hundredth", "first CPU", "hundredth CPU"))
    report(None, [("kernel", "34"), ("mode", "16"), ("code", "9"), ("first ms", "9.2f"), ("100th ms", "9.3f"),
                  ("first-100th", "11.2f"), ("CPU: first-100th", "16.2f")],
           figures, lambda names, f: (*names, f["first"], f["hundredth"], f["first"] - f["hundredth"],
                                      f["first CPU"] - f["hundredth CPU"]), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`python -m torch_metallib cuda-coverage`: how many kernels of a library the CUDA backend
lowers to PTX that CUDA's ``ptxas`` accepts, per GPU architecture.

Kernels are grouped into families (the name with its type words and numbers taken out:
``vv_Addfloat32`` and ``vv_Addint64`` are one family); ``--per-family N`` checks the first
N of each, ``--all`` every kernel. Each kernel is lowered and assembled in a worker
process (a crash in LLVM or ptxas is that kernel's failure, not the run's). Outcomes:
``ptx`` (every architecture assembled), ``unsupported`` (UnsupportedKernelError: what the
backend cannot run, named), ``ptxas`` (ptxas refused the PTX: a bug), ``error`` (anything
else: a bug).
"""

import collections
import json
import multiprocessing
import os
import re
import sys
import time
from dataclasses import asdict, dataclass
from typing import Dict, List, Sequence, Tuple

__all__ = ["add_parser", "compute_kernels", "families", "check_kernels", "KernelOutcome"]

_TYPE_WORDS = re.compile(r"(bfloat|float|uint|int|bool_?|complex)(\d+)?|\d+")


@dataclass
class KernelOutcome:
    name: str
    outcome: str  # ptx, unsupported, ptxas, error
    detail: str = ""
    lower_seconds: float = 0.0


def compute_kernels(library) -> List[str]:
    """The names of a library's compute kernels (not vertex, fragment or visible functions)."""
    return [name for name in library.function_names if library[name].type == "kernel"]


def families(names: Sequence[str]) -> Dict[str, List[str]]:
    """Family key -> its kernels, in name order."""
    found: Dict[str, List[str]] = collections.defaultdict(list)
    for name in sorted(names):
        found[re.sub(r"_+", "_", _TYPE_WORDS.sub("", name))].append(name)
    return dict(found)


_library = None  # the worker's loaded library: (path, Library)


def _check(job) -> KernelOutcome:
    path, name, archs = job
    global _library
    import torch_metallib as tm
    from torch_metallib.backends.cuda.ptx import kernel_ptx, run_ptxas
    from torch_metallib.errors import UnsupportedKernelError

    if _library is None or _library[0] != path:
        _library = (path, tm.load(path))
    function = _library[1][name]
    try:
        start = time.perf_counter()
        ptx = kernel_ptx(function, {}, "k", archs[0])
        seconds = time.perf_counter() - start
    except UnsupportedKernelError as error:
        return KernelOutcome(name, "unsupported", str(error))
    except Exception as error:  # noqa: BLE001 - reported, not raised: the report is the point
        return KernelOutcome(name, "error", f"{type(error).__name__}: {error}"[:2000])
    for arch in archs:
        assembled = run_ptxas(ptx, arch)
        if assembled.returncode != 0:
            return KernelOutcome(name, "ptxas", f"{arch}: {assembled.stderr.strip()[:2000]}", seconds)
    return KernelOutcome(name, "ptx", "", seconds)


def check_kernels(kernels: Sequence[Tuple[str, str]], archs: Sequence[str] = ("sm_80", "sm_90"),
                  jobs: int = 0) -> List[KernelOutcome]:
    """One outcome per (library path, kernel name), in worker processes (`jobs`, default
    the CPU count)."""
    work = [(str(path), name, tuple(archs)) for path, name in kernels]
    context = multiprocessing.get_context("spawn")
    with context.Pool(jobs or os.cpu_count() or 1, maxtasksperchild=200) as pool:
        results = pool.map_async(_check, work, chunksize=4)
        try:
            return results.get()
        except Exception as error:  # a worker died: run one by one to name the kernel
            raise RuntimeError(f"a worker process failed ({error}); rerun with --jobs 1 to find the kernel") from None


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "cuda-coverage", help="how many kernels of a library lower to PTX that ptxas accepts",
        description="Lower kernels of a .metallib to PTX (the CUDA backend) and assemble them with "
                    "CUDA's ptxas; report per outcome, with the first examples of each.")
    parser.add_argument("path", help="a .metallib file")
    choice = parser.add_mutually_exclusive_group()
    choice.add_argument("--per-family", type=int, default=1, metavar="N", help="kernels per family (default 1)")
    choice.add_argument("--all", action="store_true", help="every kernel")
    parser.add_argument("--arch", action="append", help="GPU architectures for ptxas (default sm_80 and sm_90)")
    parser.add_argument("--jobs", type=int, default=0, help="worker processes (default: the CPU count)")
    parser.add_argument("--json", metavar="FILE", help="also write every outcome as JSON to FILE")
    parser.set_defaults(run=run)


def run(args) -> int:
    import torch_metallib as tm
    from torch_metallib.backends.cuda.ptx import ptxas_path

    if ptxas_path() is None:
        print("error: ptxas not found: install CUDA's compiler or set PTXAS", file=sys.stderr)
        return 1
    names = compute_kernels(tm.load(args.path))
    grouped = families(names)
    chosen = list(names) if args.all else [n for members in grouped.values() for n in members[:args.per_family]]
    start = time.perf_counter()
    outcomes = check_kernels([(args.path, name) for name in chosen], args.arch or ("sm_80", "sm_90"), args.jobs)
    counts = collections.Counter(o.outcome for o in outcomes)
    print(f"{args.path}: {len(names)} compute kernels in {len(grouped)} families; checked {len(outcomes)} "
          f"in {time.perf_counter() - start:.0f} s")
    for outcome in ("ptx", "unsupported", "ptxas", "error"):
        print(f"  {outcome:12} {counts.get(outcome, 0):6}  ({100 * counts.get(outcome, 0) / max(len(outcomes), 1):.1f}%)")
    lowered = sorted(o.lower_seconds for o in outcomes if o.lower_seconds)
    if lowered:
        print(f"  lowering: median {1000 * lowered[len(lowered) // 2]:.0f} ms per kernel")
    for outcome in ("unsupported", "ptxas", "error"):
        for o in [o for o in outcomes if o.outcome == outcome][:5]:
            print(f"  {outcome}: {o.name}: {o.detail[:300]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(o) for o in outcomes], f, indent=1)
    return 1 if counts.get("ptxas") or counts.get("error") else 0

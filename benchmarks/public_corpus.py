"""The whole public corpus: every file loads, round-trips byte for byte, verifies, and every
function reflects; in every MLX build (MLX 0.0.2 to 0.32, and the wheels that ship one) the
elementwise float add runs on the CPU backend and must equal torch's, and so must a kernel of
the producers too large for CI's subset (mlx-kquant's Hadamard transform). Fetch the files first (about 1.2 GB of wheels, 3.2 GB of metallibs):

    bash tests/corpora/fetch_public.sh
    python benchmarks/public_corpus.py [--jobs N] [--corpus DIR]

Prints one row per file (format, group-size convention, AIR versions, functions, load time,
round trip, verify, reflection failures, the kernel check) and the totals; exits 1 if anything
failed.
"""

import argparse
import collections
import os
import pathlib
import re
import sys
import time

import torch

import torch_metallib as tm
from torch_metallib.cli.inspect_reflection import reflect_all

DEFAULT = pathlib.Path(os.environ.get("TM_PUBLIC_CORPUS", pathlib.Path.home() / ".cache/torch_metallib/public-corpus"))


# MLX's vector-vector float add across its versions: vvaddfloat32, vvAddfloat32, vv_Addfloat32.
_ADD = re.compile(r"^vv_?add_?float32$", re.IGNORECASE)


def run_add(lib) -> str:
    """'ok' if the library's MLX add kernel equals torch's a + b, '-' if it has none."""
    name = next((n for n in lib.function_names if _ADD.match(n)), None)
    if name is None:
        return "-"
    kernel = lib[name]
    a, b, c = torch.randn(10_000), torch.randn(10_000), torch.empty(10_000)
    sizes = {"size": a.numel()} if any(arg.name == "size" for arg in kernel.buffers) else {}
    kernel(a, b, c, **sizes)
    return "ok" if torch.equal(c, a + b) else "WRONG"


def hadamard(n: int) -> torch.Tensor:
    """Sylvester's n x n Hadamard matrix (n a power of two), float64."""
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)])
    return h


def run_kquant_hadamard(lib) -> str:
    """mlx-kquant's kq_hadamard_float_256: one threadgroup of 256 threads per block of 256
    (SIMD-group shuffles, a threadgroup exchange), signs per element applied first, then
    the orthonormal transform."""
    blocks, n = 3, 256
    g = torch.Generator().manual_seed(0)
    x, signs = torch.randn(blocks, n, generator=g), torch.randint(0, 2, (blocks, n), generator=g) * 2.0 - 1
    out = torch.full_like(x, float("nan"))
    lib.kq_hadamard_float_256(x, signs, out, blocks, 1, 0, 0, 0, threads=blocks * n, group_size=n)
    expected = (x * signs).double() @ hadamard(n).T / n ** 0.5
    return "ok" if (out.double() - expected).abs().max() <= 1e-5 else "WRONG"


# Producers whose files CI does not fetch: file-name prefix -> a kernel check.
PRODUCER_KERNELS = {"mlx-kquant": run_kquant_hadamard}


def run_kernel(path: pathlib.Path, lib) -> str:
    """The producer's kernel check, or MLX's add; '-' if the file has neither."""
    special = next((run for prefix, run in PRODUCER_KERNELS.items() if path.name.startswith(prefix)), None)
    return special(lib) if special else run_add(lib)


def check(path: pathlib.Path, jobs: int) -> dict:
    data = path.read_bytes()
    started = time.perf_counter()
    lib = tm.load(data)
    load_ms = (time.perf_counter() - started) * 1e3
    round_trip = lib.to_bytes() == data
    try:
        lib.verify()
        verified = True
    except tm.MetallibFormatError:
        verified = False
    _, failures = reflect_all(lib, path=str(path), jobs=jobs, progress_out=open(os.devnull, "w"))
    airs = sorted({lib[name].air_version for name in lib.function_names if lib[name].air_version})
    return {"file": path.name, "format": ".".join(map(str, lib.file_version)),
            "sizes": lib.group_size_convention, "air": ",".join(f"{a}.{b}" for a, b in airs),
            "functions": len(lib), "load_ms": load_ms, "round_trip": round_trip, "verified": verified,
            "failures": failures, "kernel": run_kernel(path, lib)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=pathlib.Path, default=DEFAULT)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    files = sorted(args.corpus.glob("*.metallib"))
    if not files:
        print(f"no .metallib files in {args.corpus}; run: bash tests/corpora/fetch_public.sh", file=sys.stderr)
        return 1
    print(f"{'file':58} {'fmt':6} {'sizes':7} {'AIR':12} {'functions':>9} {'load ms':>8}  rt  verify  "
          f"{'reflect':>13}  kernel")
    totals, reasons, bad = collections.Counter(), collections.Counter(), 0
    for path in files:
        row = check(path, args.jobs)
        failed = len(row["failures"])
        ok = row["round_trip"] and row["verified"] and not failed and row["kernel"] != "WRONG"
        totals["kernel"] += row["kernel"] == "ok"
        bad += not ok
        totals["files"] += 1
        totals["functions"] += row["functions"]
        totals["reflected"] += row["functions"] - failed
        totals[row["sizes"]] += 1
        for message in row["failures"].values():
            reasons[message.split(": ", 1)[-1][:100]] += 1
        print(f"{row['file'][:58]:58} {row['format']:6} {row['sizes']:7} {row['air'][:12]:12} {row['functions']:>9,} "
              f"{row['load_ms']:>8.2f}  {'ok' if row['round_trip'] else 'NO':3} {'ok' if row['verified'] else 'NO':6}  "
              f"{row['functions'] - failed:>6}/{row['functions']:<6}  {row['kernel']}")
    print(f"\n{totals['files']} files ({totals['current']} current, {totals['older']} older group sizes), "
          f"{totals['reflected']:,} of {totals['functions']:,} functions reflect, a kernel (MLX's "
          f"add, or the producer's) matches torch in {totals['kernel']} files, {bad} files with a failure")
    for reason, count in reasons.most_common(5):
        print(f"  {count} x {reason}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

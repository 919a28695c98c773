"""The ceiling of MLX's f16 steel GEMM structure on this GPU, beside torch.mm, in one run.

Usage: python benchmarks/cuda_gemm_ceiling.py [--sizes 1024 2048 4096] [--json OUT]

Builds cuda_gemm_ceiling.cu (hand-written kernels with exactly the tiling, warps, copies and
barriers of the steel GEMM that benchmarks/cuda_kernels.py launches, fed by ldmatrix; and
the same tiles double-buffered with cp.async) with nvcc for this GPU, runs it, then times
torch.mm on f16 at the same sizes (CUDA events, median of 7 batches). What the structure
reaches against torch.mm bounds what any lowering of MLX's kernel can reach.

Needs a CUDA GPU and nvcc; exits with a message where either is missing.
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))


def _build(directory: str) -> str:
    nvcc = shutil.which("nvcc") or next((p for p in ("/usr/local/cuda/bin/nvcc",) if os.path.exists(p)), None)
    if nvcc is None:
        sys.exit("benchmarks/cuda_gemm_ceiling.py needs nvcc (CUDA's compiler) on the PATH")
    major, minor = torch.cuda.get_device_capability()
    binary = os.path.join(directory, "cuda_gemm_ceiling")
    built = subprocess.run([nvcc, "-O3", f"-arch=sm_{major}{minor}", "-Xptxas", "-v", "-o", binary,
                            os.path.join(_HERE, "cuda_gemm_ceiling.cu")], capture_output=True, text=True)
    if built.returncode:
        sys.exit(f"nvcc failed:\n{built.stderr[-3000:]}")
    print("\n".join(line for line in built.stderr.splitlines() if "registers" in line or "Compiling" in line))
    return binary


def _torch_mm_ms(n: int) -> float:
    a = torch.randn(n, n, device="cuda", dtype=torch.float16)
    b = torch.randn(n, n, device="cuda", dtype=torch.float16)
    calls = max(1, int(20 * 4096 ** 3 / n ** 3))
    for _ in range(3):
        torch.mm(a, b)
    samples = []
    for _ in range(7):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            torch.mm(a, b)
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / calls)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("benchmarks/cuda_gemm_ceiling.py needs a CUDA GPU (torch.cuda.is_available() is False)")
    with tempfile.TemporaryDirectory() as directory:
        ran = subprocess.run([_build(directory)] + [str(n) for n in args.sizes], capture_output=True, text=True,
                             check=True)
    rows = [dict(re.findall(r"(\w+)=(\S+)", line), variant=line.split()[0]) for line in ran.stdout.splitlines()]
    torch_ms = {n: _torch_mm_ms(n) for n in args.sizes}
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; f16 n^3, ms (torch.mm / ours)")
    for row in rows:
        n, ms = int(row["n"]), float(row["ms"])
        row["torch_ms"], row["torch_over_ours"] = torch_ms[n], torch_ms[n] / ms
        print(f"{row['variant']:10} {n:5}^3 {ms:8.4f} ms  torch.mm {torch_ms[n]:8.4f} ms ({torch_ms[n] / ms:.3f}x)"
              f"  {row['tflops']} TFLOP/s  {row['regs']} regs  max|diff|/sqrt(K) {row['max_diff_over_sqrtk']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()

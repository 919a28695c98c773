"""How fast torch_metallib runs cooperative Metal kernels (barriers, SIMD-group functions,
simdgroup matrices) on CPU tensors, against torch.

Usage: python benchmarks/cooperative.py [--repeat N] [--json OUT]

Each thread of a threadgroup is a coroutine; a thread that reaches a barrier or a SIMD-group
collective suspends, and the runtime resumes the next (csrc/cpu/cooperative.cpp). Three measurements, each
against a baseline in the same run, warm (the first call, which compiles, is excluded),
interleaved call by call (alternating which goes first), N repeats, medians, GC off:

* softmax: MLX ``block_softmax_float32`` on 4096 x 4096 float32 (4,096 threadgroups of
  1,024 threads; 2 SIMD reductions and 4 barriers per thread) against
  ``torch.softmax(x, -1)``; the result is checked against torch's (max abs difference).
* GEMM: MLX ``steel_gemm_fused_nn_float32_float32_bm64_bn64_bk16_wm2_wn2`` on
  1024 x 1024 x 1024 (256 threadgroups of 128 threads; each SIMD-group multiplies 8x8
  simdgroup matrices, 2 barriers per k-step) against ``torch.mm``; result checked.
* barrier cost: ``benchmarks/kernels/barrier_loop.ll`` (a loop of n threadgroup barriers)
  on 64 threadgroups of 1,024 and of 256 threads, n = 1,000 against n = 0 in the same
  run: (t(n) - t(0)) / (threads x n) is the cost per thread per barrier.

Runs on torch's thread count (``torch.get_num_threads()``, reported), like torch itself.
Targets (reported as met/missed; the script never fails on them): softmax <= 10x torch,
GEMM <= 25x torch.mm, barrier <= 50 ns per thread per barrier.
"""

import argparse
import json
import pathlib
import struct

import llvmlite.binding as llvm
import torch

import torch_metallib as tm
from _timing import interleaved
from torch_metallib.cli.corpus import mlx_metallib_path

SOFTMAX_TARGET = 10.0
GEMM_TARGET = 25.0
BARRIER_TARGET_NS = 50.0
BARRIERS = 1000
GEMM_NAME = "steel_gemm_fused_nn_float32_float32_bm64_bn64_bk16_wm2_wn2"


def softmax(lib, repeat: int) -> dict:
    rows = size = 4096
    x = torch.randn(rows, size, generator=torch.Generator().manual_seed(0))
    out = torch.empty_like(x)
    kernel = lib.block_softmax_float32
    result = interleaved({
        "metallib": lambda: kernel(x, out, size, threads=rows * 1024, group_size=1024),
        "torch": lambda: torch.softmax(x, -1),
    }, repeat)
    result["max_abs_difference"] = (out - torch.softmax(x, -1)).abs().max().item()
    return result


def gemm(lib, repeat: int) -> dict:
    m = n = k = 1024
    bm, bn, bk, wm, wn = 64, 64, 16, 2, 2
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)
    d, expected = torch.empty(m, n), torch.empty(m, n)
    tiles_n, tiles_m = n // bn, m // bm
    # mlx::steel::GEMMParams: M N K lda ldb ldd tiles_n tiles_m, batch strides a b d (long),
    # swizzle_log, gemm_k_iterations_aligned, batch_ndim (offsets from its reflection).
    params = struct.pack("<8i3q3i4x", m, n, k, k, n, n, tiles_n, tiles_m, m * k, k * n, m * n, 0, k // bk, 0)
    constants = {"has_batch": False, "use_out_source": False, "do_axpby": False,
                 "align_M": True, "align_N": True, "align_K": True}
    kernel = lib[GEMM_NAME]
    # MLX dispatches threadgroups (tiles_n, tiles_m, 1) of (32, wn, wm) threads.
    result = interleaved({
        "metallib": lambda: kernel(a, b, d, params, threads=(tiles_n * 32, tiles_m * wn, wm),
                                   group_size=(32, wn, wm), constants=constants),
        "torch": lambda: torch.mm(a, b, out=expected),
    }, repeat)
    result["max_abs_difference"] = (d - a @ b).abs().max().item()
    return result


def barrier_cost(repeat: int) -> list:
    text = (pathlib.Path(__file__).parent / "kernels" / "barrier_loop.ll").read_text()
    module = llvm.parse_assembly(text, context=llvm.create_context())
    kernel = tm.load(tm.pack([tm.FunctionSource("barrier_loop", module.as_bitcode())])).barrier_loop
    rows = []
    for group in (1024, 256):
        threads = 64 * group
        out = torch.zeros(threads, dtype=torch.int32)
        result = interleaved({
            f"{BARRIERS} barriers": lambda: kernel(out, BARRIERS, threads=threads, group_size=group),
            "0 barriers": lambda: kernel(out, 0, threads=threads, group_size=group),
        }, repeat)
        kernel(out, BARRIERS, threads=threads, group_size=group)
        medians = result["median_ms"]
        per = (medians[f"{BARRIERS} barriers"] - medians["0 barriers"]) * 1e6 / (threads * BARRIERS)
        rows.append({"group_size": group, "threads": threads, "median_ms": medians,
                     "ns_per_thread_per_barrier": per, "all_counted": bool((out == BARRIERS).all())})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", help="also write the full results here")
    options = parser.parse_args()
    lib = tm.load(mlx_metallib_path())
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {options.repeat} repeats (medians)\n")

    results = {"threads": torch.get_num_threads(), "repeat": options.repeat}
    for label, run, target in (("block_softmax_float32 4096x4096 vs torch.softmax", softmax, SOFTMAX_TARGET),
                               (f"{GEMM_NAME} 1024^3 vs torch.mm", gemm, GEMM_TARGET)):
        result = run(lib, options.repeat)
        medians = result["median_ms"]
        ratio = medians["metallib"] / medians["torch"]
        result["ratio"] = ratio
        results[run.__name__] = result
        print(f"{label}\n  metallib {medians['metallib']:9.1f} ms   torch {medians['torch']:7.2f} ms   "
              f"ratio {ratio:6.1f}x   target <= {target:.0f}x: {'met' if ratio <= target else 'MISSED'}   "
              f"max |difference| {result['max_abs_difference']:.2e}")

    rows = barrier_cost(options.repeat)
    results["barrier"] = rows
    print("\nthreadgroup barrier, cost per thread per barrier (64 threadgroups)")
    for row in rows:
        per = row["ns_per_thread_per_barrier"]
        print(f"  group {row['group_size']:5d}: {per:6.1f} ns   target <= {BARRIER_TARGET_NS:.0f} ns: "
              f"{'met' if per <= BARRIER_TARGET_NS else 'MISSED'}   (every thread passed all "
              f"{BARRIERS}: {row['all_counted']})")
    if options.json:
        with open(options.json, "w") as file:
            json.dump(results, file, indent=1)


if __name__ == "__main__":
    main()

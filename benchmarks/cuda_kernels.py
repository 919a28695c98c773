"""The CUDA backend against native torch on the same GPU, in one run.

Usage: python benchmarks/cuda_kernels.py [--repeat N] [--json OUT] [--metallib PATH]

Each case runs an MLX kernel from mlx.metallib on ``cuda`` tensors at the launch shape MLX
uses, and torch's own op on the same data, interleaved call by call (alternating which
goes first), each timed with CUDA events over a batch of calls after a warm-up; medians of
N repeats; and the GPU's own time per call (kernels and copies, from torch's profiler),
host time excluded; results checked against torch's. Reported as the ratio torch time / ours
(1.0: as fast as torch; the issue's targets are >= 0.9 for elementwise, softmax, norms and
scans, >= 0.5 for f16/bf16 GEMM, f32 GEMM without TF32). Also: the lowering time of every
kernel used (AIR -> PTX, median), and the first launch of a kernel in a fresh process with
the disk cache off (lowering + the driver's JIT + launch).

Needs a CUDA GPU; exits with a message where there is none.
"""

import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import time

import torch

import torch_metallib as tm
from _mlx_launch import mlx_row_group, mlx_softmax_group
from cuda_lowering import NAMES as LOWERED, lowering_times

_TILES = {"float32": (32, 32, 16, 2, 2), "float16": (64, 64, 16, 2, 2), "bfloat16": (64, 64, 16, 2, 2)}
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _gpu_ms(runs: dict, repeat: int, number: int) -> dict:
    """Median milliseconds per call of each callable, timed with CUDA events."""
    for run in runs.values():
        run()
    torch.cuda.synchronize()
    samples = {name: [] for name in runs}
    names = list(runs)
    for i in range(repeat):
        for name in (names if i % 2 == 0 else names[::-1]):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(number):
                runs[name]()
            end.record()
            end.synchronize()
            samples[name].append(start.elapsed_time(end) / number)
    return {name: statistics.median(values) for name, values in samples.items()}


def _kernel_ms(run, number: int) -> float:
    """Milliseconds of GPU work per call (kernels and copies the profiler saw), host time excluded."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as profiler:
        for _ in range(number):
            run()
        torch.cuda.synchronize()
    total_us = sum(e.device_time for e in profiler.events() if e.device_type == DeviceType.CUDA)
    return total_us / 1000 / number


def _row(label: str, ours, theirs, check, repeat: int, number: int = 20) -> dict:
    """Both measures: back-to-back calls timed with events (what a caller sees, host work
    included where the GPU waits for it) and the GPU's own time per call (profiler)."""
    times = _gpu_ms({"metallib": ours, "torch": theirs}, repeat, number)
    kernels = {"metallib": _kernel_ms(ours, number), "torch": _kernel_ms(theirs, number)}
    ratio, kernel_ratio = times["torch"] / times["metallib"], kernels["torch"] / kernels["metallib"]
    print(f"{label:58} calls: ours {times['metallib']:8.3f} ms torch {times['torch']:8.3f} ms ({ratio:4.2f}) | "
          f"GPU: ours {kernels['metallib']:8.3f} ms torch {kernels['torch']:8.3f} ms ({kernel_ratio:4.2f}) | "
          f"max|diff| {check():.2e}")
    return {"case": label, "call_ms": times, "gpu_ms": kernels, "torch_over_ours": ratio,
            "gpu_torch_over_ours": kernel_ratio}


def elementwise(lib, repeat: int) -> list:
    n = 1 << 24
    a, b = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    out, want = torch.empty_like(a), torch.empty_like(a)
    rows = []
    for group in (1024, 256):
        # A grid-only kernel: the backend launches it in its own block whatever the call names.
        rows.append(_row(f"vv_Addfloat32 2^24, called with groups of {group}",
                         lambda: lib.vv_Addfloat32(a, b, out, n, threads=n, group_size=group),
                         lambda: torch.add(a, b, out=want), lambda: (out - a - b).abs().max().item(), repeat))
    x = torch.rand(n, device="cuda") * 10 - 5
    for name, per in (("v_Expfloat32float32", 1), ("vn_Expfloat32float32", 2)):
        threads = -(-n // per)
        rows.append(_row(f"{name} 2^24 ({per} per thread), groups of 256",
                         lambda: lib[name](x, out, n, threads=threads, group_size=256),
                         lambda: torch.exp(x, out=want),
                         lambda: ((out - torch.exp(x)).abs() / torch.exp(x).abs()).max().item(), repeat))
    return rows


def softmax(lib, repeat: int) -> list:
    rows = []
    for name, shape in (("block_softmax_float32", (4096, 1024)), ("block_softmax_float32", (1024, 4096)),
                        ("looped_softmax_float32", (256, 32768))):
        x = torch.randn(*shape, device="cuda")
        out = torch.empty_like(x)
        group = mlx_softmax_group(shape[1])
        rows.append(_row(f"{name} {shape[0]}x{shape[1]}, groups of {group}",
                         lambda: lib[name](x, out, shape[1], threads=shape[0] * group, group_size=group),
                         lambda: torch.softmax(x, -1), lambda: (out - torch.softmax(x, -1)).abs().max().item(),
                         repeat))
    return rows


def norms(lib, repeat: int) -> list:
    rows_, size = 4096, 4096
    x, w, b = (torch.randn(rows_, size, device="cuda"), torch.randn(size, device="cuda"),
               torch.randn(size, device="cuda"))
    out = torch.empty_like(x)
    # normalization.cpp: rms reads RMS_N_READS (4) per thread, layer_norm 8.
    rms_group, layer_group = mlx_row_group(size, 4), mlx_row_group(size, 8)
    rms = lambda: torch.nn.functional.rms_norm(x, (size,), w, 1e-5)  # noqa: E731
    layer = lambda: torch.nn.functional.layer_norm(x, (size,), w, b, 1e-5)  # noqa: E731
    return [_row(f"rmsfloat32 {rows_}x{size}, groups of {rms_group}",
                 lambda: lib.rmsfloat32(x, w, out, 1e-5, size, 1, threads=rows_ * rms_group, group_size=rms_group),
                 rms, lambda: (out - rms()).abs().max().item(), repeat),
            _row(f"layer_normfloat32 {rows_}x{size}, groups of {layer_group}",
                 lambda: lib.layer_normfloat32(x, w, b, out, 1e-5, size, 1, 1, threads=rows_ * layer_group,
                                               group_size=layer_group),
                 layer, lambda: (out - layer()).abs().max().item(), repeat)]


def scans(lib, repeat: int) -> list:
    rows_, size = 4096, 4096
    x = torch.randn(rows_, size, device="cuda")
    out = torch.empty_like(x)
    n_reads = 4
    group = min(1024, (size // 2 + n_reads * 32 - 1) // (n_reads * 32) * 32)
    name = "contig_scan_inclusive_sum_float32_float32"
    return [_row(f"{name} {rows_}x{size}", lambda: lib[name](x, out, size, threads=(group, rows_, 1),
                                                             group_size=(group, 1, 1)),
                 lambda: torch.cumsum(x, -1), lambda: (out - torch.cumsum(x, -1)).abs().max().item(), repeat)]


GEMM_SIZES = (1024, 2048, 4096, 8192)


def gemm(lib, repeat: int, sizes=GEMM_SIZES) -> list:
    """steel_gemm_fused (nn) at n^3 for each size and dtype, beside torch.mm (TF32 off):
    float16/bfloat16 products on tensor cores with float sums, float32 exact."""
    rows = []
    for dtype in ("float16", "bfloat16", "float32"):
        for m in sizes:
            bm, bn, bk, wm, wn = _TILES[dtype]
            name = f"steel_gemm_fused_nn_{dtype}_{dtype}_bm{bm}_bn{bn}_bk{bk}_wm{wm}_wn{wn}"
            a = torch.randn(m, m, device="cuda").to(_DTYPES[dtype])
            b = torch.randn(m, m, device="cuda").to(_DTYPES[dtype])
            d = torch.empty(m, m, device="cuda", dtype=_DTYPES[dtype])
            params = struct.pack("<8i3q3i4x", m, m, m, m, m, m, m // bn, m // bm, m * m, m * m, m * m, 0, m // bk, 0)
            constants = {"has_batch": False, "use_out_source": False, "do_axpby": False,
                         "align_M": True, "align_N": True, "align_K": True}
            call = lambda: lib[name](a, b, d, params, threads=(m // bn * 32, m // bm * wn, wm),  # noqa: E731
                                     group_size=(32, wn, wm), constants=constants)
            row = _row(f"{name} {m}^3", call, lambda: torch.mm(a, b),
                       lambda: ((d.float() - (a.float() @ b.float())).abs().max() / m ** 0.5).item(),
                       repeat, 3 if m <= 4096 else 1)
            row["tflops"] = 2 * m ** 3 / (row["gpu_ms"]["metallib"] * 1e-3) / 1e12
            rows.append(row)
    return rows


_FIRST = """
import time, torch, torch_metallib as tm
lib = tm.load({path!r})
a = torch.randn(1 << 20, device="cuda"); out = torch.empty_like(a)
torch.cuda.synchronize()
t = time.perf_counter(); lib.vv_Addfloat32(a, a, out, 1 << 20); torch.cuda.synchronize()
print(time.perf_counter() - t)
"""


def host_overhead(lib, repeat: int) -> dict:
    """Microseconds of host time per call on a tiny problem (the GPU waits for the host)."""
    a = torch.randn(1024, device="cuda")
    out, want = torch.empty_like(a), torch.empty_like(a)
    result = {}
    for name, run in (("metallib", lambda: lib.vv_Addfloat32(a, a, out, 1024)), ("torch", lambda: torch.add(a, a, out=want))):
        samples = []
        for _ in range(repeat):
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(200):
                run()
            samples.append((time.perf_counter() - start) / 200 * 1e6)
        result[name] = statistics.median(samples)
    torch.cuda.synchronize()
    print(f"host time per call (vv_Addfloat32 on 1,024 floats): ours {result['metallib']:.1f} us, "
          f"torch.add {result['torch']:.1f} us")
    return result


def first_launch(path: str, repeat: int) -> dict:
    """A kernel's first call in a fresh process, disk cache off: lowering, driver JIT, launch."""
    environment = dict(os.environ, TORCH_METALLIB_CACHE="0")
    seconds = [float(subprocess.run([sys.executable, "-c", _FIRST.format(path=path)], env=environment, check=True,
                                    capture_output=True, text=True).stdout.split()[-1]) for _ in range(repeat)]
    return {"seconds": seconds, "median_s": statistics.median(seconds)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--metallib", help="mlx.metallib or a subset of it (default: the cached corpus)")
    parser.add_argument("--gemm-only", action="store_true", help="only the GEMM section, at each size")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("benchmarks/cuda_kernels.py needs a CUDA GPU (torch.cuda.is_available() is False)")
    if args.metallib is None:
        from torch_metallib.cache.corpus import mlx_metallib_path
        args.metallib = mlx_metallib_path()
    lib = tm.load(args.metallib)
    torch.backends.cuda.matmul.allow_tf32 = False
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, {args.repeat} repeats (medians)\n")
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": []}
    for section in ((gemm,) if args.gemm_only else (elementwise, softmax, norms, scans, gemm)):
        results["rows"] += section(lib, args.repeat)
    if args.gemm_only:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
        return
    results["host_overhead_us"] = host_overhead(lib, args.repeat)
    results["lowering"] = lowering_times(lib, LOWERED)  # these kernels; cuda_lowering.py: more, fresh processes
    print(f"\nlowering (AIR -> PTX, disk cache not used): median {results['lowering']['median_ms']:.0f} ms, "
          f"max {results['lowering']['max_ms']:.0f} ms over {len(LOWERED)} kernels (target <= 20 ms median)")
    results["first_launch"] = first_launch(args.metallib, 3)
    print(f"first launch in a fresh process (cache off): median {results['first_launch']['median_s'] * 1000:.0f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()

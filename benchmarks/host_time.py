"""Host time per kernel call: MLX's 16-element float add (vv_Addfloat32) called as a
kernel, through the native path (the backend's launcher, bound and launched without
Python) and through the full path (``checked=False`` sends a call there: Python prepares
and runs the plan), beside ``torch.add(a, b, out=c)`` on the same tensors, interleaved in
one run. On CUDA each batch of calls ends with one synchronize, so the time per call is
what the host spends while the GPU keeps up.

    python benchmarks/host_time.py [--device cpu] [--device cuda] [--repeat 15]
"""

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import torch_metallib as tm  # noqa: E402
from _timing import interleaved  # noqa: E402
from torch_metallib.cache.corpus import mlx_metallib_path  # noqa: E402

SIZE = 16


def measure(device: str, repeat: int, number: int) -> dict:
    kernel = tm.load(mlx_metallib_path(download=False)).vv_Addfloat32
    a, b = torch.randn(SIZE, device=device), torch.randn(SIZE, device=device)
    c = torch.empty_like(a)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def batch(call):
        def run():
            for _ in range(number):
                call()
            sync()
        return run

    runs = {"torch.add": batch(lambda: torch.add(a, b, out=c)),
            "kernel (native path)": batch(lambda: kernel(a, b, c)),
            "kernel (full path)": batch(lambda: kernel(a, b, c, checked=False))}
    medians = {name: ms * 1e3 / number for name, ms in interleaved(runs, repeat)["median_ms"].items()}
    kernel(a, b, c)
    assert torch.equal(c, a + b)
    base = medians["torch.add"]
    return {"device": device, "us_per_call": medians, "ratio_to_torch_add": {k: v / base for k, v in medians.items()}}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", action="append", help="cpu, cuda (default: cpu)")
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--number", type=int, default=2000, help="calls per timed batch")
    args = parser.parse_args(argv)
    for device in args.device or ["cpu"]:
        result = measure(device, args.repeat, args.number)
        print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

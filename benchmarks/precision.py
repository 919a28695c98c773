"""Precision of the CPU backend's math functions: the largest error in ulps against
the correctly rounded result (float64 computed, rounded once to the type), over a dense
sample of each function's domain plus its edges, for float and half.

Usage: python benchmarks/precision.py [--samples N] [--markdown]

Kernels are written on the fly (tests/_air_modules.py) and call one intrinsic per thread;
references are torch's float64 functions. Prints one row per function: the domain, the
maximum ulp error for float and for half, and the bound Metal's specification states.
"""

import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

import _air_modules as air  # noqa: E402

# name -> (float64 reference, domain, Metal's bound for float in precise mode, from the
# MSL specification's table of single-precision accuracy, where it lists the function)
FUNCTIONS = {
    "sqrt": (torch.sqrt, (0, 1e4), "correctly rounded"), "rsqrt": (torch.rsqrt, (1e-3, 1e4), ""),
    "exp": (torch.exp, (-80, 80), "<= 1 ulp"), "exp2": (torch.exp2, (-120, 120), "<= 1 ulp"),
    "log": (torch.log, (1e-30, 1e30), "<= 1 ulp"), "log2": (torch.log2, (1e-30, 1e30), "<= 1 ulp"),
    "sin": (torch.sin, (-100, 100), ""), "cos": (torch.cos, (-100, 100), "<= 1 ulp"),
    "tan": (torch.tan, (-1.5, 1.5), ""), "asin": (torch.asin, (-1, 1), "<= 1 ulp"),
    "acos": (torch.acos, (-1, 1), "<= 1 ulp"), "atan": (torch.atan, (-100, 100), "<= 1 ulp"),
    "sinh": (torch.sinh, (-80, 80), ""), "cosh": (torch.cosh, (-80, 80), "<= 1 ulp"),
    "tanh": (torch.tanh, (-20, 20), ""), "asinh": (torch.asinh, (-1e4, 1e4), "<= 1 ulp"),
    "acosh": (torch.acosh, (1, 1e4), "<= 1 ulp"), "atanh": (torch.atanh, (-0.999, 0.999), "<= 1 ulp"),
    "expm1": (torch.expm1, (-20, 20), ""), "log1p": (torch.log1p, (-0.99, 1e4), ""),
    "erf": (torch.erf, (-5, 5), ""),
    "sinpi": (lambda x: torch.sin(math.pi * (x - 2 * torch.round(x / 2))), (-0.49, 0.49), ""),
    "cospi": (lambda x: torch.sin(math.pi * (0.5 - (x - 2 * torch.round(x / 2)).abs())), (-1, 1), "<= 1 ulp"),
    "fract": (lambda x: x - torch.floor(x), (-1e3, 1e3), "correctly rounded"),
}


def max_ulps(op: str, code: str, samples: int) -> float:
    reference, (low, high), _ = FUNCTIONS[op]
    dtype, element = {"f32": (torch.float32, "float"), "f16": (torch.float16, "half")}[code]
    if code == "f16":  # within half's range
        low, high = max(low, -6e4), min(high, 6e4)
    g = torch.Generator().manual_seed(0)
    x = (torch.rand(samples, generator=g, dtype=torch.float64) * (high - low) + low).to(dtype)
    kernel = air.lane_kernel(f"air.{op}.{code}", element, [element])
    out = torch.empty_like(x)
    kernel(x, out, threads=x.numel())
    want = reference(x.double())
    finite = torch.isfinite(want.to(dtype)) & torch.isfinite(out)
    info = torch.finfo(dtype)
    # ulp of the correctly rounded result: its spacing in the result type
    spacing = torch.maximum(want.to(dtype).double().abs(), torch.tensor(info.tiny, dtype=torch.float64)) * info.eps
    spacing = torch.pow(2.0, torch.floor(torch.log2(spacing / info.eps))) * info.eps
    errors = (out.double() - want)[finite].abs() / spacing[finite]
    return float(errors.max()) if errors.numel() else math.nan


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = parser.parse_args(argv)
    rows = []
    for op, (_, (low, high), bound) in FUNCTIONS.items():
        rows.append((op, f"[{low:g}, {high:g}]", max_ulps(op, "f32", args.samples), max_ulps(op, "f16", args.samples),
                     bound or "(not in its table)"))
    if args.markdown:
        print("| function | sample | float: max ulp | half: max ulp | Metal's bound (float) |\n| --- | --- | --- | --- | --- |")
        for op, domain, f32, f16, bound in rows:
            print(f"| `{op}` | {domain} | {f32:.2f} | {f16:.2f} | {bound} |")
    else:
        for row in rows:
            print(f"{row[0]:8} {row[1]:18} float {row[2]:6.2f} ulp  half {row[3]:6.2f} ulp  Metal: {row[4]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

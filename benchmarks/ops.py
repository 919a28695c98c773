"""Per-call overhead of a metallib kernel registered with ``torch_metallib.ops.define``.

Usage: python benchmarks/ops.py [--repeat N] [--number N] [--json OUT]

The operator is MLX's ``v_Sigmoidfloat32float32`` from the reference corpus as
``tm_bench::sigmoid(Tensor x) -> Tensor``, called on a 16-element float32 tensor, where
the call's fixed cost dominates. Measured in one run, interleaved batch by batch
(alternating which goes first), ``--repeat`` batches of ``--number`` calls, GC off,
medians per call, all warm (the first call, which compiles, is excluded):

* ``torch.ops.tm_bench.sigmoid(x)``: the registered op, as model code calls it
  (OpOverloadPacket), and ``.default`` (OpOverload); its CPU kernel is native
  (csrc/ops/metallib_op.cpp): no Python between the dispatcher and the kernel.
* the same op with a backward (``torch.library.register_autograd`` puts a Python kernel
  at the Autograd key, so such ops pay for Python on every call).
* (a) the kernel called directly, ``lib.v_Sigmoidfloat32float32(x, out, n)`` with
  ``out = torch.empty_like(x)``: the Python call path.
* (b) an equivalent ``torch.library.custom_op`` whose Python implementation allocates the
  output and calls the same kernel.
* (c) native torch: ``torch.sigmoid(x)`` (the C++ binding) and
  ``torch.ops.aten.sigmoid(x)`` (the same operator through torch.ops, the path every
  torch.library operator is called through).

Every result is checked against ``torch.sigmoid`` once. Targets (reported, never
failing): the registered op <= 1.5x native torch (c), and >= 3x faster than (b).
"""

import argparse
import json

import torch

import torch_metallib as tm
from _timing import interleaved
from torch_metallib import ops
from torch_metallib.cache.corpus import mlx_metallib_path

KERNEL = "v_Sigmoidfloat32float32"
NATIVE_TARGET = 1.5
CUSTOM_OP_TARGET = 3.0


def define_ops(lib):
    common = dict(dtypes=[torch.float32], bind={"in": "x", "size": ops.numel("x")},
                  outputs={"out": ops.like("x")}, threads=ops.numel("x"))
    plain = ops.define("tm_bench::sigmoid(Tensor x) -> Tensor", lib, "v_Sigmoid{dtype}{dtype}", **common)
    with_backward = ops.define("tm_bench::sigmoid_grad(Tensor x) -> Tensor", lib, "v_Sigmoid{dtype}{dtype}",
                               backward=lambda ctx, grad: grad * ctx.y * (1 - ctx.y),
                               setup_context=lambda ctx, inputs, output: setattr(ctx, "y", output), **common)
    kernel = lib[KERNEL]

    @torch.library.custom_op("tm_bench::sigmoid_python", mutates_args=())
    def sigmoid_python(x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        kernel(x, out, x.numel())
        return out

    return plain, with_backward, sigmoid_python


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=21, help="batches per candidate (default 21)")
    parser.add_argument("--number", type=int, default=2000, help="calls per batch (default 2000)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()

    lib = tm.load(mlx_metallib_path())
    plain, with_backward, sigmoid_python = define_ops(lib)
    kernel = lib[KERNEL]
    x = torch.randn(16, generator=torch.Generator().manual_seed(0))

    def direct():
        out = torch.empty_like(x)
        kernel(x, out, 16)
        return out

    runs = {
        "registered op (torch.ops packet)": lambda: torch.ops.tm_bench.sigmoid(x),
        "registered op (.default overload)": lambda: plain.op(x),
        "registered op with backward": lambda: torch.ops.tm_bench.sigmoid_grad(x),
        "(a) lib.kernel(...)": direct,
        "(b) torch.library.custom_op in Python": lambda: sigmoid_python(x),
        "(c) torch.sigmoid": lambda: torch.sigmoid(x),
        "(c) torch.ops.aten.sigmoid": lambda: torch.ops.aten.sigmoid(x),
    }
    expected = torch.sigmoid(x)
    for name, run in runs.items():
        difference = (run() - expected).abs().max().item()
        if difference > 1e-6:
            raise SystemExit(f"{name}: result differs from torch.sigmoid by {difference}")
    result = interleaved(runs, args.repeat, args.number)
    us = {name: ms * 1000 for name, ms in result["median_ms"].items()}
    op = us["registered op (torch.ops packet)"]
    print(f"per-call time, 16 float32 elements, median of {args.repeat} batches of {args.number} calls "
          f"(torch threads: {torch.get_num_threads()}):")
    for name, value in us.items():
        print(f"  {name:42s} {value:7.2f} us   {value / op:5.2f}x the registered op")
    ratios = {
        "op / torch.sigmoid": op / us["(c) torch.sigmoid"],
        "op / torch.ops.aten.sigmoid": op / us["(c) torch.ops.aten.sigmoid"],
        "custom_op / op": us["(b) torch.library.custom_op in Python"] / op,
        "lib.kernel / op": us["(a) lib.kernel(...)"] / op,
    }
    print("ratios:")
    for name, value in ratios.items():
        print(f"  {name:32s} {value:5.2f}")
    native = ratios["op / torch.ops.aten.sigmoid"]
    print(f"target op <= {NATIVE_TARGET}x native: vs torch.ops.aten.sigmoid {native:.2f}x "
          f"({'met' if native <= NATIVE_TARGET else 'missed'}); vs torch.sigmoid {ratios['op / torch.sigmoid']:.2f}x "
          f"({'met' if ratios['op / torch.sigmoid'] <= NATIVE_TARGET else 'missed'})")
    print(f"target custom_op >= {CUSTOM_OP_TARGET}x op: {ratios['custom_op / op']:.2f}x "
          f"({'met' if ratios['custom_op / op'] >= CUSTOM_OP_TARGET else 'missed'})")
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"us": us, "ratios": ratios, "repeat": args.repeat, "number": args.number,
                       "torch": torch.__version__}, file, indent=2)


if __name__ == "__main__":
    main()

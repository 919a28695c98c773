"""Softmax and logsumexp over the last dimension (softmax.metal, logsumexp.metal): one
threadgroup per row, block kernels for rows of up to 4,096 elements, looped ones above.

Half-precision softmax runs MLX's ``precise`` kernels (float32 accumulation, as
``mx.softmax(..., precise=True)``); logsumexp accumulates in float32 for every dtype.
Backwards are torch expressions of the forward's result: softmax's is y * (g - sum(g * y)),
logsumexp's is g * softmax(x), on this package's softmax.
"""

import torch

from .. import ops
from ._launch import row_launch, row_limits, rows

__all__ = ["define_softmax"]

_SOFTMAX = {torch.float32: "{kind}_softmax_float32", torch.float16: "{kind}_softmax_precise_float16",
            torch.bfloat16: "{kind}_softmax_precise_bfloat16"}


def define_softmax(lib, ns: str) -> dict:
    defined = {}
    for looped in (False, True):
        kind = "looped" if looped else "block"
        suffix = "_looped" if looped else ""

        def softmax_backward(ctx, grad):
            y = ctx.y
            return y * (grad - (grad * y).sum(-1, keepdim=True)), None

        defined[f"softmax{suffix}"] = ops.define(
            f"{ns}::softmax{suffix}(Tensor x) -> Tensor", lib,
            {dtype: name.format(kind=kind) for dtype, name in _SOFTMAX.items()},
            bind={"in": "x", "axis_size": ops.size("x", -1)}, outputs={"out": ops.like("x")},
            require=row_limits("x", looped), **row_launch("x", looped),
            backward=softmax_backward, setup_context=lambda ctx, inputs, output: setattr(ctx, "y", output))

        def logsumexp_setup(ctx, inputs, output):
            (x,) = inputs
            ctx.save_for_backward(x)

        def logsumexp_backward(ctx, grad):
            (x,) = ctx.saved_tensors
            softmax = defined["softmax_looped" if x.shape[-1] > 4096 else "softmax"]
            return grad.unsqueeze(-1) * softmax(x)

        defined[f"logsumexp{suffix}"] = ops.define(
            f"{ns}::logsumexp{suffix}(Tensor x) -> Tensor", lib, f"{kind}_logsumexp_{{dtype}}",
            dtypes=list(_SOFTMAX), bind={"in": "x", "axis_size": ops.size("x", -1)},
            outputs={"out": ops.empty((rows("x"),), "x")},
            require=[ops.dim("x") == 2] + row_limits("x", looped), **row_launch("x", looped),
            backward=logsumexp_backward, setup_context=logsumexp_setup)
    return defined

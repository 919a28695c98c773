"""RMS norm and layer norm over the last dimension, with MLX's backward kernels
(normalization.metal: rms, layer_norm and their vjp_ kernels, block and looped).

Forward: one threadgroup per row. The backward kernels write gx and, per row, the row's
share of the weight's gradient (g * x * r for RMS norm, g * x_hat for layer norm), which
the backward sums over the rows in torch (as MLX's host code does); layer norm's bias
gradient is the sum of g over the rows.
"""

from .. import ops
from ._launch import FLOATS, row_launch, row_limits, rows

__all__ = ["define_norms"]


def _weight_fits(name: str, x: str = "x") -> list:
    return [ops.dim(name) == 1, ops.size(name, 0) == ops.size(x, -1)]


def _rms(lib, ns: str, looped: bool) -> dict:
    suffix = "_looped" if looped else ""
    name = f"rms_norm{suffix}"
    per_group = {} if looped else {"n_rows": rows("x"), "rows_per_group": 1}
    backward_op = ops.define(
        f"{ns}::{name}_backward(Tensor x, Tensor w, Tensor g, float eps) -> (Tensor gx, Tensor gw_rows)",
        lib, f"vjp_rms{suffix}{{dtype}}", dtypes=FLOATS,
        bind={"axis_size": ops.size("x", -1), "w_stride": 1, "gw": "gw_rows", **per_group},
        outputs={"gx": ops.like("x"), "gw_rows": ops.empty((rows("x"), ops.size("x", -1)), "x")},
        constants={"has_w": True}, require=row_limits("x", looped) + _weight_fits("w"),
        **row_launch("x", looped))

    def setup_context(ctx, inputs, output):
        x, w, eps = inputs
        ctx.save_for_backward(x, w)
        ctx.eps = eps

    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        gx, gw_rows = backward_op(x, w, grad.contiguous(), ctx.eps)
        return gx, gw_rows.sum(0), None

    forward = ops.define(
        f"{ns}::{name}(Tensor x, Tensor w, float eps) -> Tensor", lib, f"rms{suffix}{{dtype}}", dtypes=FLOATS,
        bind={"axis_size": ops.size("x", -1), "w_stride": 1}, outputs={"out": ops.like("x")},
        require=row_limits("x", looped) + _weight_fits("w"), **row_launch("x", looped),
        backward=backward, setup_context=setup_context)
    return {name: forward, f"{name}_backward": backward_op}


def _layer_norm(lib, ns: str, looped: bool) -> dict:
    suffix = "_looped" if looped else ""
    name = f"layer_norm{suffix}"
    backward_op = ops.define(
        f"{ns}::{name}_backward(Tensor x, Tensor w, Tensor g, float eps) -> (Tensor gx, Tensor gw_rows)",
        lib, f"vjp_layer_norm{suffix}{{dtype}}", dtypes=FLOATS,
        bind={"axis_size": ops.size("x", -1), "w_stride": 1, "gw": "gw_rows"},
        outputs={"gx": ops.like("x"), "gw_rows": ops.empty((rows("x"), ops.size("x", -1)), "x")},
        constants={"has_w": True}, require=row_limits("x", looped) + _weight_fits("w"),
        **row_launch("x", looped))

    def setup_context(ctx, inputs, output):
        x, w, b, eps = inputs
        ctx.save_for_backward(x, w)
        ctx.eps = eps

    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        grad = grad.contiguous()
        gx, gw_rows = backward_op(x, w, grad, ctx.eps)
        return gx, gw_rows.sum(0), grad.reshape(-1, grad.shape[-1]).sum(0), None

    forward = ops.define(
        f"{ns}::{name}(Tensor x, Tensor w, Tensor b, float eps) -> Tensor", lib, f"layer_norm{suffix}{{dtype}}",
        dtypes=FLOATS, bind={"axis_size": ops.size("x", -1), "w_stride": 1, "b_stride": 1},
        outputs={"out": ops.like("x")},
        require=row_limits("x", looped) + _weight_fits("w") + _weight_fits("b"), **row_launch("x", looped),
        backward=backward, setup_context=setup_context)
    return {name: forward, f"{name}_backward": backward_op}


def define_norms(lib, ns: str) -> dict:
    defined = {}
    for looped in (False, True):
        defined.update(_rms(lib, ns, looped))
        defined.update(_layer_norm(lib, ns, looped))
    return defined

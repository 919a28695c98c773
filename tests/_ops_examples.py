"""The example operators the ops tests exercise, defined once per test session (an
operator cannot be defined twice in a process). They are the examples of docs/guide/operators.md, on the
Apple-built MLX kernels and the project's fixture kernels."""

import torch

from torch_metallib import ops

FLOATS = [torch.float32, torch.float16, torch.bfloat16]
EPS = 1e-5


def norm_group(axis: int, n_reads: int = 4):
    """MLX's threadgroup for one row of `axis` elements, `n_reads` per thread: whole
    SIMD-groups (normalization.cpp, softmax.cpp)."""
    return ops.cdiv(ops.cdiv(axis, n_reads), 32) * 32


def rows(name: str):
    return ops.numel(name) // ops.size(name, -1)


def define_mlx_examples(lib) -> dict:
    """Operators on mlx.metallib kernels, namespace tm_examples."""
    defined = {}
    elementwise = dict(dtypes=FLOATS, bind={"in": "x", "size": ops.numel("x")}, threads=ops.numel("x"))
    # Elementwise, dispatched by dtype; functional, in-place and out= variants.
    defined["sigmoid"] = ops.define("tm_examples::sigmoid(Tensor x) -> Tensor", lib, "v_Sigmoid{dtype}{dtype}",
                                    outputs={"out": ops.like("x")},
                                    backward=lambda ctx, grad: grad * ctx.y * (1 - ctx.y),
                                    setup_context=lambda ctx, inputs, output: setattr(ctx, "y", output),
                                    **elementwise)
    defined["sigmoid_"] = ops.define("tm_examples::sigmoid_(Tensor(a!) x) -> ()", lib, "v_Sigmoid{dtype}{dtype}",
                                     dtypes=FLOATS, bind={"in": "x", "out": "x", "size": ops.numel("x")},
                                     threads=ops.numel("x"))
    defined["sigmoid.out"] = ops.define("tm_examples::sigmoid.out(Tensor x, *, Tensor(a!) out) -> ()", lib,
                                        "v_Sigmoid{dtype}{dtype}", outputs={"out": ops.like("x")}, **elementwise)
    # A cooperative kernel: one threadgroup per row (rows of up to 4096 elements).
    defined["softmax"] = ops.define("tm_examples::softmax(Tensor x) -> Tensor", lib, "block_softmax_{dtype}",
                                    dtypes=FLOATS, bind={"in": "x", "axis_size": ops.size("x", -1)},
                                    outputs={"out": ops.like("x")},
                                    threads=rows("x") * norm_group(ops.size("x", -1)),
                                    group_size=norm_group(ops.size("x", -1)))
    # RMS norm with a backward kernel: vjp_rms writes gx and, per threadgroup of
    # rows_per_group rows, a partial gw row that the backward sums.
    defined["rms_norm_backward"] = ops.define(
        "tm_examples::rms_norm_backward(Tensor x, Tensor w, Tensor g, float eps) -> (Tensor gx, Tensor gw)",
        lib, "vjp_rms{dtype}", dtypes=FLOATS,
        bind={"axis_size": ops.size("x", -1), "w_stride": 1, "n_rows": rows("x"), "rows_per_group": 1},
        outputs={"gx": ops.like("x"), "gw": ops.empty((rows("x"), ops.size("x", -1)), "x")},
        constants={"has_w": True},
        threads=rows("x") * norm_group(ops.size("x", -1)), group_size=norm_group(ops.size("x", -1)))

    def rms_setup(ctx, inputs, output):
        x, w, eps = inputs
        ctx.save_for_backward(x, w)
        ctx.eps = eps

    def rms_backward(ctx, grad):
        x, w = ctx.saved_tensors
        gx, gw_rows = torch.ops.tm_examples.rms_norm_backward(x, w, grad.contiguous(), ctx.eps)
        return gx, gw_rows.sum(0), None

    defined["rms_norm"] = ops.define("tm_examples::rms_norm(Tensor x, Tensor w, float eps) -> Tensor", lib,
                                     "rms{dtype}", dtypes=FLOATS,
                                     bind={"axis_size": ops.size("x", -1), "w_stride": 1},
                                     outputs={"out": ops.like("x")},
                                     threads=rows("x") * norm_group(ops.size("x", -1)),
                                     group_size=norm_group(ops.size("x", -1)),
                                     backward=rms_backward, setup_context=rms_setup)
    return defined


def define_fixture_examples(lib) -> dict:
    """Operators on the project's fixture kernels, namespace tm_fixtures: function
    constants taken from the call (a float argument, and whether an optional tensor is given)."""
    return {
        "scale": ops.define("tm_fixtures::scale(Tensor x, Tensor? bias, float alpha) -> Tensor", lib,
                            "function_constant_scale", dtypes=[torch.float32], bind={"in": "x"},
                            outputs={"out": ops.like("x")},
                            constants={"use_bias": ops.present("bias"), "alpha": "alpha"},
                            threads=ops.numel("x")),
    }


def check_sigmoid_on(device: str, mlx_ops: dict) -> None:
    """The example sigmoid operator on `device`'s tensors (the GPU backends' tests): eager,
    its gradient through the backward kernel, and inside one compiled graph."""
    sigmoid = mlx_ops["sigmoid"]
    x = torch.randn(37, 11, device=device, requires_grad=True)
    y = sigmoid(x)
    assert y.device.type == device
    torch.testing.assert_close(y, torch.sigmoid(x))
    (grad,) = torch.autograd.grad(y.sum(), x)
    torch.testing.assert_close(grad, torch.sigmoid(x) * (1 - torch.sigmoid(x)))
    compiled = torch.compile(lambda t: sigmoid(t) * 2 + 1, fullgraph=True)
    z = torch.randn(64, 3, device=device)
    torch.testing.assert_close(compiled(z), torch.sigmoid(z) * 2 + 1)

def define_sdpa_vector(lib, qualname: str, group: int = 1024, preconditions: bool = True, **options):
    """MLX's single-query attention kernel for head dimension 64 (sdpa_vector_float_64_64)
    as operator `qualname`(q, k, v, scale): q (batch, heads, queries, 64), k and v (batch,
    kv_heads, keys, 64), as MLX's sdpa_vector() launches it (`group`: 1024 threads per query
    head). The kernel reads and writes 64 elements per head whatever the tensors hold, so the
    head dimension is a precondition; without `preconditions`, nothing stops a call with
    another (the checked-execution tests make such calls)."""
    size = ops.size
    if preconditions:
        options["require"] = [size("q", -1) == 64, size("k", -1) == 64, size("v", -1) == 64,
                              size("q", 1) % size("k", 1) == 0]
    return ops.define(
        f"{qualname}(Tensor q, Tensor k, Tensor v, float scale) -> Tensor", lib, "sdpa_vector_float_64_64",
        dtypes=[torch.float32],
        bind={"queries": "q", "keys": "k", "values": "v", "gqa_factor": size("q", 1) // size("k", 1),
              "N": size("k", 2), "k_head_stride": size("k", 2) * size("k", 3), "k_seq_stride": size("k", 3),
              "v_head_stride": size("v", 2) * size("v", 3), "v_seq_stride": size("v", 3)},
        outputs={"out": ops.empty((size("q", 0), size("q", 1), size("q", 2), size("v", 3)), "q")},
        constants=dict(has_mask=False, query_transposed=False, do_causal=False, bool_mask=False,
                       float_mask=False, has_sinks=False),
        threads=(size("q", 0) * size("q", 1) * group, size("q", 2), 1), group_size=(group, 1, 1), **options)

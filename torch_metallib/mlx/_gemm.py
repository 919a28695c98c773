"""Matrix products over MLX's steel GEMM (steel_gemm_fused_{nn}_{T}_{T}_bm32_bn32_bk16_wm2_wn2),
as MLX's host code (matmul.cpp) launches it: the sizes in a GEMMParams struct, one
threadgroup of (32, WN, WM) threads per BM x BN tile of the output, grid (tiles_n * 32,
tiles_m * WN, batch * WM) threads; the function constants align_M / align_N / align_K
say whether the sizes are whole tiles (the kernel then skips its edge checks).

addmm adds beta * C through the kernel's output source (use_out_source, do_axpby and a
GEMMAddMMParams struct); a bias row (C of shape (N,)) has row stride ldc = 0. Batches of
contiguous matrices run as the grid's z extent (has_batch = false: the batch strides
of GEMMParams step through them). Inputs are made contiguous first, so the kernels
always run the nn (neither transposed) form. Backwards are the same operators on the
gradient.

A matrix C has whole 32-row tiles (ceil(M / 32) * 32 rows; rows past M are not used): the
kernel's edge epilogue (apply_epilogue_safe in steel/gemm/mma.h) checks C's columns against
the tile's extent but not its rows, so a last tile of fewer than 32 rows reads C's rows past
M (an Apple GPU reads whatever lies there; on the CPU that may be unmapped memory).
``mlx.addmm`` pads C so.
"""

import torch

from .. import ops

__all__ = ["define_gemm", "TILE"]

BM, BN, BK, WM, WN = 32, 32, 16, 2, 2
TILE = f"bm{BM}_bn{BN}_bk{BK}_wm{WM}_wn{WN}"
_KERNEL = "steel_gemm_fused_nn_{dtype}_{dtype}_" + TILE
_FLOATS = [torch.float32, torch.float16, torch.bfloat16]


def _params(a: str, b: str):
    size = ops.size
    m, k, n = size(a, -2), size(a, -1), size(b, -1)
    return m, n, k, ops.struct(M=m, N=n, K=k, lda=k, ldb=n, ldd=n, tiles_n=ops.cdiv(n, BN), tiles_m=ops.cdiv(m, BM),
                               batch_stride_a=m * k, batch_stride_b=k * n, batch_stride_d=m * n, swizzle_log=0,
                               gemm_k_iterations_aligned=k // BK, batch_ndim=1)


def _launch(m, n, batch):
    return {"threads": (ops.cdiv(n, BN) * 32, ops.cdiv(m, BM) * WN, batch * WM), "group_size": (32, WN, WM)}


def _constants(m, n, k, **more):
    constants = dict(has_batch=False, use_out_source=False, do_axpby=False, align_M=m % BM == 0,
                     align_N=n % BN == 0, align_K=k % BK == 0)
    constants.update(more)
    return constants


def define_gemm(lib, ns: str) -> dict:
    size = ops.size
    defined = {}

    def mm_backward(ctx, grad):
        a, b = ctx.saved_tensors
        mm = defined["bmm" if a.dim() == 3 else "mm"]
        return mm(grad, b.transpose(-1, -2)), mm(a.transpose(-1, -2), grad)

    def save_both(ctx, inputs, output):
        ctx.save_for_backward(*inputs[:2])

    m, n, k, params = _params("a", "b")
    defined["mm"] = ops.define(
        f"{ns}::mm(Tensor a, Tensor b) -> Tensor", lib, _KERNEL, dtypes=_FLOATS,
        bind={"A": "a", "B": "b", "D": "out", "params": params}, outputs={"out": ops.empty((m, n), "a")},
        constants=_constants(m, n, k), **_launch(m, n, 1),
        require=[ops.dim("a") == 2, ops.dim("b") == 2, size("b", 0) == k, m >= 1, n >= 1, k >= 1],
        backward=mm_backward, setup_context=save_both)

    m, n, k, params = _params("a", "b")
    batch = size("a", 0)
    defined["bmm"] = ops.define(
        f"{ns}::bmm(Tensor a, Tensor b) -> Tensor", lib, _KERNEL, dtypes=_FLOATS,
        bind={"A": "a", "B": "b", "D": "out", "params": params}, outputs={"out": ops.empty((batch, m, n), "a")},
        constants=_constants(m, n, k), **_launch(m, n, batch),
        require=[ops.dim("a") == 3, ops.dim("b") == 3, size("b", 0) == batch, size("b", 1) == k, m >= 1, n >= 1,
                 k >= 1],
        backward=mm_backward, setup_context=save_both)

    def addmm_setup(ctx, inputs, output):
        c, a, b, beta, alpha = inputs
        ctx.save_for_backward(a, b)
        ctx.c_shape, ctx.beta, ctx.alpha = c.shape, beta, alpha

    def addmm_backward(ctx, grad):
        a, b = ctx.saved_tensors
        mm = defined["mm"]
        if len(ctx.c_shape) == 2:   # C's padding rows get no gradient
            gc = torch.nn.functional.pad(grad * ctx.beta, (0, 0, 0, ctx.c_shape[0] - grad.shape[0]))
        else:
            gc = (grad * ctx.beta).sum(0)
        return gc, mm(grad, b.t()) * ctx.alpha, mm(a.t(), grad) * ctx.alpha, None, None

    m, n, k, params = _params("a", "b")
    ldc = (ops.dim("c") - 1) * n            # (M, N): N; a bias row (N,): 0, every row reads it
    defined["addmm"] = ops.define(
        f"{ns}::addmm(Tensor c, Tensor a, Tensor b, float beta=1, float alpha=1) -> Tensor", lib, _KERNEL,
        dtypes=_FLOATS, dispatch="a",
        bind={"A": "a", "B": "b", "C": "c", "D": "out", "params": params,
              "addmm_params": ops.struct(ldc=ldc, fdc=1, batch_stride_c=ldc * m, alpha="alpha", beta="beta")},
        outputs={"out": ops.empty((m, n), "a")},
        constants=_constants(m, n, k, use_out_source=True, do_axpby=True), **_launch(m, n, 1),
        require=[ops.dim("a") == 2, ops.dim("b") == 2, size("b", 0) == k, m >= 1, n >= 1, k >= 1,
                 ops.dim("c") >= 1, ops.dim("c") <= 2, size("c", -1) == n,
                 size("c", 0) == ops.dim("c") // 2 * ops.cdiv(m, BM) * BM + (2 - ops.dim("c")) * n],
        backward=addmm_backward, setup_context=addmm_setup)
    return defined

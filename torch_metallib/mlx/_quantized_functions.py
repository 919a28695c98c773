"""quantized_matmul: picks the quantized kernel MLX's host code (quantized.cpp) would run
and calls its operator (one torch operator per call, so torch.compile sees one node)."""

import torch

from ._quantized import BITS, GROUP_SIZES, QMV_ROWS, TILE, VECTOR_LIMIT, qmv_fast_k_step
from ._registry import operators

__all__ = ["quantized_matmul"]


def quantized_matmul(x: torch.Tensor, w_q: torch.Tensor, scales: torch.Tensor, biases: torch.Tensor, *,
                     transpose: bool = True, group_size: int = 64, bits: int = 4) -> torch.Tensor:
    """x @ dequantize(w_q, scales, biases).T (``transpose=True``: w (N, K), as a linear
    layer's weight), or x @ dequantize(...) (w (K, N)), as MLX's ``mx.quantized_matmul`` with
    mode "affine". w_q, scales and biases are :func:`quantize`'s (MLX's) layout: w_q uint32
    (rows, values * bits / 32), scales and biases (rows, values / group_size) in x's dtype.
    x is (..., K), float32, float16 or bfloat16; the result (..., N) has x's dtype. MLX's
    kernels accumulate in float32.

    With ``transpose``, fewer than 6 rows of x run MLX's matrix-vector kernels (qmv_fast
    when N is a multiple of 8 and K of its K step, else qmv), more run qmm_t; without,
    qmm_n. bits: 4 or 8; group_size: 32, 64 or 128.

    Raises:
        ValueError: bits or group_size without a kernel.
        KernelArgumentError: shapes or dtypes the kernel cannot take (the message names the
            precondition).
    """
    if bits not in BITS or group_size not in GROUP_SIZES:
        raise ValueError(f"quantized_matmul: MLX's kernels here take bits in {BITS} and group_size in "
                         f"{GROUP_SIZES}; got bits={bits}, group_size={group_size}")
    k = x.shape[-1]
    rows = x.reshape(-1, k)
    tag = f"gs{group_size}_b{bits}"
    if not transpose:
        name = f"affine_qmm_n_{tag}"
    elif rows.shape[0] < VECTOR_LIMIT:
        n = w_q.shape[0]
        name = f"affine_qmv_fast_{tag}" if n % QMV_ROWS == 0 and k % qmv_fast_k_step(bits) == 0 else f"affine_qmv_{tag}"
    else:
        name = f"affine_qmm_t_aligned_{tag}" if w_q.shape[0] % TILE == 0 else f"affine_qmm_t_{tag}"
    y = operators()[name](rows, w_q, scales, biases)
    return y.reshape(*x.shape[:-1], y.shape[-1])

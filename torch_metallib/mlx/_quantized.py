"""Matrix products with affine-quantized weights (quantized.h: affine_qmv_fast, affine_qmv,
affine_qmm_t, affine_qmm_n), as MLX's host code (quantized.cpp) launches them, in MLX's
layout (w_q uint32 packed along the last dimension, a scale and a bias per group; see
_quantize.py). One operator per kernel, group size and bit width; x is a matrix (M, K).

transpose (x @ w.T, w (N, K)): few rows of x run the matrix-vector kernels: qmv_fast when
N is whole 8-row tiles and K whole blocks of its K step (MLX's rule; this build of the
kernel also finishes other multiples of the group size, checked execution finds no access
outside the tensors), qmv otherwise; grid (M, ceil(N / 8)) threadgroups of (32, 2): two
SIMD-groups of four output rows each. qmv_fast reads whole 8-row tiles (N % 8 == 0). More
rows run qmm_t: 32 x 32 output tiles, threadgroups of (32, 2, 2), grid (ceil(N / 32),
ceil(M / 32)); its ``alN_true`` build leaves out the checks on N (N a multiple of 32).
x @ w (w (K, N), quantized along N) runs qmm_n on the same tiles for any M.

MLX's ``batch_1`` builds (batched w) and the device-tuned kernels (qmv_quad, qmv_wide,
split-K qmm) are not used; the ``pr_0_hgs_0_r_4`` builds of qmv are (four results per
SIMD-group, no global scale). There are no backwards (the weights are not trained).
"""

import torch

from .. import ops

__all__ = ["define_quantized", "BITS", "GROUP_SIZES", "VECTOR_LIMIT", "qmv_fast_k_step"]

BITS = (4, 8)
GROUP_SIZES = (32, 64, 128)
_TYPE_NAMES = {torch.float32: "float", torch.float16: "float16_t", torch.bfloat16: "bfloat16_t"}
QMV_ROWS = 8        # output rows per qmv threadgroup: 2 SIMD-groups x 4 results
TILE = 32           # qmm's BM = BN = BK
VECTOR_LIMIT = 6    # rows of x from which MLX runs qmm_t: 6 to 33 by GPU and size; its smallest


def qmv_fast_k_step(bits: int) -> int:
    """The K step of qmv_fast (values a SIMD-group reads per iteration, no tail):
    32 lanes x 2 words x 32 / bits values (one word for 2 bits)."""
    return 32 * (1 if bits == 2 else 2) * (32 // bits)


def _kernels(family: str, group_size: int, bits: int, suffix: str) -> dict:
    return {dtype: f"affine_{family}_{name}_gs_{group_size}_b_{bits}{suffix}" for dtype, name in _TYPE_NAMES.items()}


def _quantized_rows(w: str, s: str, b: str, rows, values, group_size: int, bits: int) -> list:
    """w_q (rows, values * bits / 32), scales and biases (rows, values / group_size)."""
    size = ops.size
    return [ops.dim(w) == 2, ops.dim(s) == 2, ops.dim(b) == 2, size(w, 0) == rows,
            size(w, 1) * (32 // bits) == values, values % group_size == 0, values >= group_size,
            size(s, 0) == rows, size(s, 1) * group_size == values, size(b, 0) == rows, size(b, 1) == size(s, 1)]


def define_quantized(lib, ns: str) -> dict:
    size = ops.size
    m, k = size("x", 0), size("x", 1)
    defined = {}
    for bits in BITS:
        for gs in GROUP_SIZES:
            tag = f"gs{gs}_b{bits}"
            schema = "(Tensor x, Tensor w, Tensor scales, Tensor biases) -> Tensor"
            n_t = size("w", 0)                       # transposed: w (N, K)
            base_t = [ops.dim("x") == 2, n_t >= 1] + _quantized_rows("w", "scales", "biases", n_t, k, gs, bits)
            qmv = dict(bind={"in_vec_size": k, "out_vec_size": n_t}, outputs={"y": ops.empty((m, n_t), "x")},
                       threads=(m * 32, ops.cdiv(n_t, QMV_ROWS) * 2, 1), group_size=(32, 2, 1))
            defined[f"affine_qmv_fast_{tag}"] = ops.define(
                f"{ns}::affine_qmv_fast_{tag}{schema}", lib,
                _kernels("qmv_fast", gs, bits, "_batch_0_pr_0_hgs_0_r_4"),
                require=base_t + [n_t % QMV_ROWS == 0], **qmv)
            defined[f"affine_qmv_{tag}"] = ops.define(
                f"{ns}::affine_qmv_{tag}{schema}", lib, _kernels("qmv", gs, bits, "_batch_0_pr_0_hgs_0_r_4"),
                require=base_t, **qmv)
            qmm_t = dict(bind={"K": k, "N": n_t, "M": m}, outputs={"y": ops.empty((m, n_t), "x")},
                         threads=(ops.cdiv(n_t, TILE) * 32, ops.cdiv(m, TILE) * 2, 2), group_size=(32, 2, 2))
            for aligned in (False, True):
                name = f"affine_qmm_t_{'aligned_' if aligned else ''}{tag}"
                defined[name] = ops.define(
                    f"{ns}::{name}{schema}", lib, _kernels("qmm_t", gs, bits, f"_alN_{str(aligned).lower()}_batch_0"),
                    require=base_t + ([n_t % TILE == 0] if aligned else []), **qmm_t)
            n_n = size("scales", 1) * gs              # not transposed: w (K, N), quantized along N
            defined[f"affine_qmm_n_{tag}"] = ops.define(
                f"{ns}::affine_qmm_n_{tag}{schema}", lib, _kernels("qmm_n", gs, bits, "_batch_0"),
                bind={"K": k, "N": n_n, "M": m}, outputs={"y": ops.empty((m, n_n), "x")},
                threads=(ops.cdiv(n_n, TILE) * 32, ops.cdiv(m, TILE) * 2, 2), group_size=(32, 2, 2),
                require=[ops.dim("x") == 2, k >= 1] + _quantized_rows("w", "scales", "biases", k, n_n, gs, bits))
    return defined

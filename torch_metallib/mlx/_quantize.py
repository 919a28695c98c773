"""MLX's affine quantization in torch (mlx/ops.cpp ``affine_quantize``, the CPU backend's
``quantize``): the layout MLX's quantized kernels read.

Each group of `group_size` consecutive values along the last dimension gets a scale and a
bias (value = scale * q + bias, q in 0 .. 2**bits - 1). The endpoint of larger magnitude
is represented exactly: scale = (max - min) / (2**bits - 1), at least 1e-7, signed towards
that endpoint (``edge``); q0 = round(edge / scale); when q0 != 0, scale = edge / q0 and
bias = edge, otherwise bias = 0. Everything is computed in float32 (q with the float32
scale, rounding half to even); scales and biases are then stored in the weights' dtype.
The q of one row are packed little end first into uint32 words, 32 / bits per word.
"""

import torch

__all__ = ["quantize", "dequantize", "BITS", "GROUP_SIZES"]

BITS = (2, 4, 8)            # widths that fill a uint32 word exactly
GROUP_SIZES = (32, 64, 128)
_EPS = 1e-7


def _check(what: str, last: int, group_size: int, bits: int) -> None:
    if group_size not in GROUP_SIZES:
        raise ValueError(f"{what}: group_size must be one of {GROUP_SIZES}, got {group_size}")
    if bits not in BITS:
        raise ValueError(f"{what}: bits must be one of {BITS}, got {bits}")
    if last % group_size:
        raise ValueError(f"{what}: the last dimension ({last}) must be a multiple of group_size ({group_size})")


def quantize(w: torch.Tensor, group_size: int = 64, bits: int = 4):
    """(w_q, scales, biases) of floating-point `w` (..., K), as MLX's ``mx.quantize``:
    w_q uint32 (..., K * bits / 32), scales and biases (..., K / group_size) in w's dtype.

    Raises:
        ValueError: group_size not 32, 64 or 128; bits not 2, 4 or 8; K not a multiple of
            group_size.
    """
    k = w.shape[-1]
    _check("quantize", k, group_size, bits)
    n_bins = float((1 << bits) - 1)
    groups = w.reshape(-1, k // group_size, group_size).float()
    w_max, w_min = groups.amax(-1, keepdim=True), groups.amin(-1, keepdim=True)
    side = w_min.abs() > w_max.abs()
    scale = ((w_max - w_min) / n_bins).clamp_min(_EPS)
    scale = torch.where(side, scale, -scale)
    edge = torch.where(side, w_min, w_max)
    q0 = torch.round(edge / scale)
    scale = torch.where(q0 != 0, edge / q0, scale)
    bias = torch.where(q0 == 0, torch.zeros_like(edge), edge)
    q = torch.round((groups - bias) / scale).clamp(0, n_bins).to(torch.int64)
    per_word = 32 // bits
    shifts = torch.arange(0, 32, bits, dtype=torch.int64, device=w.device)
    words = (q.reshape(-1, k // per_word, per_word) << shifts).sum(-1)
    shape = w.shape[:-1]
    return (words.to(torch.uint32).reshape(*shape, k // per_word),
            scale.to(w.dtype).reshape(*shape, k // group_size), bias.to(w.dtype).reshape(*shape, k // group_size))


def dequantize(w_q: torch.Tensor, scales: torch.Tensor, biases: torch.Tensor, group_size: int = 64,
               bits: int = 4) -> torch.Tensor:
    """scale * q + bias, (..., K) in the scales' dtype (computed in float32), the inverse
    layout of :func:`quantize`."""
    per_word = 32 // bits
    k = w_q.shape[-1] * per_word
    _check("dequantize", k, group_size, bits)
    if scales.shape[-1] * group_size != k or biases.shape != scales.shape:
        raise ValueError(f"dequantize: w_q holds {k} values per row, so scales and biases need "
                         f"{k // group_size} per row; got {tuple(scales.shape)} and {tuple(biases.shape)}")
    words = w_q.to(torch.int64) & 0xFFFFFFFF     # int32 words read as unsigned
    q = (words[..., None] >> torch.arange(0, 32, bits, dtype=torch.int64, device=w_q.device)) & ((1 << bits) - 1)
    q = q.reshape(*w_q.shape[:-1], k // group_size, group_size).float()
    w = q * scales.float()[..., None] + biases.float()[..., None]
    return w.reshape(*w_q.shape[:-1], k).to(scales.dtype)

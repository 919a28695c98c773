"""The public functions: each picks the operator MLX's host code would run for its
arguments and calls it (one torch operator per call, so torch.compile sees one node)."""

import math
from typing import Optional, Union

import torch

from ._attention import HEAD_DIMS
from ._gemm import BM as GEMM_TILE_ROWS
from ._launch import LOOPED_LIMIT
from ._registry import operators
from ._steel_attention import STEEL_HEAD_DIMS

__all__ = ["load", "rms_norm", "layer_norm", "rope", "softmax", "logsumexp", "scaled_dot_product_attention",
           "matmul", "addmm"]


def load(path: Optional[str] = None) -> dict:
    """Loads MLX's library (`path`, else the one ``python -m torch_metallib corpus``
    cached) and defines every operator; returns ``{name: MetallibOp}``. The functions below
    do this on first use; call it first to control when, or before ``torch.compile``
    traces a function that uses them.

    Raises:
        FileNotFoundError: no library at `path`, or none cached (the message says how to
            fetch it).
    """
    return operators(path)


def _row_op(name: str, n: int):
    return operators()[name + ("_looped" if n > LOOPED_LIMIT else "")]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """x * rsqrt(mean(x**2, -1) + eps) * weight over the last dimension (MLX's rms /
    rms_looped kernels; backward: vjp_rms). `weight` has x.shape[-1] elements."""
    return _row_op("rms_norm", x.shape[-1])(x, weight, eps)


def layer_norm(x: torch.Tensor, weight: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None,
               eps: float = 1e-5) -> torch.Tensor:
    """torch.nn.functional.layer_norm over the last dimension (MLX's layer_norm kernels;
    backward: vjp_layer_norm). A missing weight is ones, a missing bias zeros."""
    n = x.shape[-1]
    if weight is None:
        weight = torch.ones(n, dtype=x.dtype, device=x.device)
    if bias is None:
        bias = torch.zeros(n, dtype=x.dtype, device=x.device)
    return _row_op("layer_norm", n)(x, weight, bias, eps)


def rope(x: torch.Tensor, offset: Union[int, torch.Tensor] = 0, *, base: float = 10000.0, scale: float = 1.0,
         traditional: bool = False) -> torch.Tensor:
    """Rotary position embedding of x (B, H, T, D) at positions offset + 0 .. T-1 (offset an
    int or an int32 tensor with one per batch), MLX's ``fast.rope`` with dims = D:
    pair i turns by scale * position * base ** (-2i / D). ``traditional`` pairs adjacent
    elements (x[2i], x[2i+1]); otherwise the halves (x[i], x[i + D/2]), as LLaMA's
    Hugging Face port does."""
    batch = x.shape[0]
    if isinstance(offset, torch.Tensor):
        offsets = offset.to(device=x.device, dtype=torch.int32).reshape(-1)
        if offsets.numel() == 1:
            offsets = offsets.expand(batch)
    else:
        offsets = torch.full((batch,), offset, dtype=torch.int32, device=x.device)
    return operators()["rope"](x, offsets, scale, math.log2(base), traditional, True)


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dimension (float32 accumulation for every dtype)."""
    return _row_op("softmax", x.shape[-1])(x)


def logsumexp(x: torch.Tensor) -> torch.Tensor:
    """log(sum(exp(x), -1)), the last dimension reduced."""
    n = x.shape[-1]
    return _row_op("logsumexp", n)(x.reshape(-1, n)).reshape(x.shape[:-1])


def scaled_dot_product_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: Optional[float] = None,
                                 mask: Optional[torch.Tensor] = None, causal: bool = False) -> torch.Tensor:
    """softmax(scale * q k^T + mask) v for q (B, Hq, Tq, D), k (B, Hkv, N, D), v (B, Hkv, N, Dv),
    Hq a multiple of Hkv; scale defaults to D ** -0.5. As MLX picks: up to 8 queries per
    head without a mask, the sdpa_vector kernels (made for decoding); otherwise the steel
    attention kernels (prefill), for (D, Dv) in (64, 64), (72, 72), (80, 80), (96, 64),
    (96, 96), (128, 128), (192, 192), (256, 256). ``mask`` broadcasts to (B, Hq, Tq, N): a
    float mask is added to the scores (in q's dtype, as MLX casts it), a bool mask keeps
    the keys where it is True. ``causal`` masks as MLX does, aligned to the end: query i
    sees keys 0 .. N - Tq + i (so it needs Tq <= N beyond 8 queries); it combines with a
    mask."""
    d, dv = q.shape[-1], v.shape[-1]
    scale = d ** -0.5 if scale is None else scale
    steel = (d, dv) in STEEL_HEAD_DIMS
    if mask is None and (d, dv) in HEAD_DIMS and (q.shape[2] <= 8 or not steel):
        return operators()[f"sdpa_vector_{d}_{dv}"](q, k, v, scale, causal)
    if not steel:
        raise ValueError(f"scaled_dot_product_attention: MLX has no attention kernel for head dimensions "
                         f"(D, Dv) = ({d}, {dv}){' with a mask' if mask is not None else ''}; it has "
                         f"{', '.join(map(str, STEEL_HEAD_DIMS))} for any query count and mask, and "
                         f"{', '.join(map(str, HEAD_DIMS))} without a mask")
    name = f"steel_attention_{d}_{dv}"
    if mask is None:
        return operators()[name](q, k, v, scale, causal)
    mask = _attention_mask(mask, q, k)
    return operators()[name + ("_bool_mask" if mask.dtype == torch.bool else "_mask")](q, k, v, mask, scale, causal)


def _attention_mask(mask: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """`mask` as the steel kernels read it: 4-D, float masks in q's dtype, each of its batch,
    head and query dimensions of size 1 (the kernel then reads it with stride 0) or full,
    the key dimension full. Dimensions broadcast by expand() are narrowed back to size 1,
    so the operator, which passes inputs contiguous, does not materialize them."""
    if mask.dim() > 4:
        raise ValueError(f"scaled_dot_product_attention: the mask broadcasts to (B, Hq, Tq, N); expected at most "
                         f"4 dimensions, got shape {tuple(mask.shape)}")
    if mask.dtype != torch.bool and mask.is_floating_point():
        mask = mask.to(q.dtype)
    mask = mask[(None,) * (4 - mask.dim())]
    for i in range(3):
        if mask.shape[i] > 1 and mask.stride(i) == 0:
            mask = mask.narrow(i, 0, 1)
    if mask.shape[3] == 1:
        mask = mask.expand(-1, -1, -1, k.shape[2])
    return mask


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b for matrices (M, K) @ (K, N), or batches of them (B, M, K) @ (B, K, N), on MLX's
    steel GEMM (float32 accumulation)."""
    return operators()["bmm" if a.dim() == 3 else "mm"](a, b)


def addmm(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta: float = 1.0,
          alpha: float = 1.0) -> torch.Tensor:
    """beta * c + alpha * (a @ b), as torch.addmm, for c of shape (M, N) or a bias row (N,),
    in one steel GEMM kernel (its output source). A matrix c is padded to whole 32-row tiles
    first, since the kernel reads whole tiles of it."""
    if c.dim() == 2:
        c = torch.nn.functional.pad(c, (0, 0, 0, -c.shape[0] % GEMM_TILE_ROWS))
    return operators()["addmm"](c, a, b, beta, alpha)

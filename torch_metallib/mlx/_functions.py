"""The public functions: each picks the operator MLX's host code would run for its
arguments and calls it (one torch operator per call, so torch.compile sees one node)."""

import math
from typing import Optional, Union

import torch

from ._attention import HEAD_DIMS
from ._launch import LOOPED_LIMIT
from ._registry import operators

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
                                 causal: bool = False) -> torch.Tensor:
    """softmax(scale * q k^T) v for q (B, Hq, Tq, D), k (B, Hkv, N, D), v (B, Hkv, N, Dv),
    Hq a multiple of Hkv; scale defaults to D ** -0.5. MLX's sdpa_vector kernels, made for
    decoding (a few queries per head): (D, Dv) one of (64, 64), (96, 64), (96, 96),
    (128, 128), (192, 128), (192, 192), (256, 256), (512, 512). ``causal`` masks as MLX
    does, aligned to the end: query i sees keys 0 .. N - Tq + i."""
    d, dv = q.shape[-1], v.shape[-1]
    if (d, dv) not in HEAD_DIMS:
        raise ValueError(f"scaled_dot_product_attention: MLX has no sdpa_vector kernel for head dimensions "
                         f"(D, Dv) = ({d}, {dv}); it has {', '.join(map(str, HEAD_DIMS))}")
    return operators()[f"sdpa_vector_{d}_{dv}"](q, k, v, d ** -0.5 if scale is None else scale, causal)


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b for matrices (M, K) @ (K, N), or batches of them (B, M, K) @ (B, K, N), on MLX's
    steel GEMM (float32 accumulation)."""
    return operators()["bmm" if a.dim() == 3 else "mm"](a, b)


def addmm(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta: float = 1.0,
          alpha: float = 1.0) -> torch.Tensor:
    """beta * c + alpha * (a @ b), as torch.addmm, for c of shape (M, N) or a bias row (N,),
    in one steel GEMM kernel (its output source)."""
    return operators()["addmm"](c, a, b, beta, alpha)

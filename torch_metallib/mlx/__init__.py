"""Ready-made operators over Apple's MLX kernels (``mlx.metallib``), registered as
``torch.ops.tm_mlx.*`` the first time one is used:

    >>> from torch_metallib import mlx                                     # doctest: +SKIP
    >>> y = mlx.rms_norm(x, w, 1e-5)                                       # doctest: +SKIP

RMS norm and layer norm (with MLX's backward kernels), rotary embedding, softmax,
logsumexp, attention (sdpa_vector for decoding, steel attention for prefill, with masks) and
matrix products (steel GEMM; affine-quantized weights: quantized_matmul, quantize,
dequantize), for float32, float16 and bfloat16 on the CPU backend (and wherever ops.define
registers them). The library is the one
``python -m torch_metallib corpus`` downloads; ``load(path)`` names another copy. The
functions here pick the kernel variant MLX's host code would (block or looped rows, the
attention kernel of the head dimension) and handle its conventions; each operator states
what its kernels support as preconditions. docs/guide/mlx.md has the details and a
LLaMA-style block built from them.
"""

from ._functions import (addmm, layer_norm, load, logsumexp, matmul, rms_norm, rope, scaled_dot_product_attention,
                         softmax)
from ._library import library_path
from ._quantize import dequantize, quantize
from ._quantized_functions import quantized_matmul
from ._registry import NAMESPACE, operators

__all__ = ["load", "operators", "library_path", "NAMESPACE", "rms_norm", "layer_norm", "rope", "softmax",
           "logsumexp", "scaled_dot_product_attention", "matmul", "addmm",
           "quantized_matmul", "quantize", "dequantize"]

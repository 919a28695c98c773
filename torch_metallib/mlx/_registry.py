"""The operators, defined once per process under one namespace when first needed."""

import threading

import torch

from ._attention import define_attention
from ._gemm import define_gemm
from ._library import library
from ._norms import define_norms
from ._quantized import define_quantized
from ._rope import define_rope
from ._softmax import define_softmax
from ._steel_attention import define_steel_attention

__all__ = ["NAMESPACE", "operators"]

NAMESPACE = "tm_mlx"
_lock = threading.Lock()
_defined = {}


def operators(path=None) -> dict:
    """{name: MetallibOp}: every operator of torch_metallib.mlx, defined on first call (on
    the library at `path`, else the cached one).

    Raises:
        RuntimeError: the first call comes while torch.compile traces: defining operators
            is not something a graph can hold (call load() first).
    """
    if _defined:
        if path is not None:
            library(path)  # refuses another file
        return _defined
    if torch.compiler.is_compiling():
        raise RuntimeError("torch_metallib.mlx: the operators are defined on first use, which must not happen "
                           "while torch.compile traces; call torch_metallib.mlx.load() (or any of its functions) "
                           "once before compiling")
    with _lock:
        if not _defined:
            lib = library(path)
            defined = {}
            for define in (define_norms, define_rope, define_softmax, define_attention, define_gemm,
                           define_steel_attention, define_quantized):
                defined.update(define(lib, NAMESPACE))
            _defined.update(defined)
    return _defined

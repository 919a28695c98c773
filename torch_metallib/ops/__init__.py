"""Metallib kernels as torch.library operators: ``torch_metallib.ops.define``.

    >>> from torch_metallib import ops                                        # doctest: +SKIP
    >>> sigmoid = ops.define("mylib::sigmoid(Tensor x) -> Tensor", lib,       # doctest: +SKIP
    ...                      "v_Sigmoid{dtype}{dtype}", dtypes=[torch.float32, torch.float16],
    ...                      bind={"in": "x", "size": ops.numel("x")},
    ...                      outputs={"out": ops.like("x")}, threads=ops.numel("x"))
    >>> torch.ops.mylib.sigmoid(torch.randn(8))                                # doctest: +SKIP

The documentation's "Kernels as operators" page (docs/guide/operators.md) has a complete
example and every option.
"""

from ._define import MetallibOp, define
from ._outputs import Output, empty, like
from ._rules import Rule, arg, cdiv, dim, numel, present, size, stride
from ._structs import Struct, struct

__all__ = ["define", "MetallibOp", "like", "empty", "Output", "Rule", "numel", "size", "stride", "dim", "arg", "present", "cdiv",
           "struct", "Struct"]

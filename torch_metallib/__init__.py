"""Load precompiled Apple Metal libraries (.metallib) and use their kernels from PyTorch.

    >>> import torch_metallib as tm
    >>> lib = tm.load("kernels.metallib")      # or tm.load(metallib_bytes)   # doctest: +SKIP
    >>> lib.function_names                                                   # doctest: +SKIP
"""

import torch  # noqa: F401  (loads libtorch, which the native module links against)

from ._errors import MetallibFormatError, TorchMetallibError
from ._function import FunctionConstant, KernelFunction
from ._library import Library, load
from ._pack import FunctionSource, pack

__all__ = [
    "load",
    "pack",
    "Library",
    "KernelFunction",
    "FunctionConstant",
    "FunctionSource",
    "MetallibFormatError",
    "TorchMetallibError",
]
__version__ = "0.1.0"

"""Load precompiled Apple Metal libraries (.metallib) and use their kernels from PyTorch.

    >>> import torch_metallib as tm
    >>> lib = tm.load("kernels.metallib")      # or tm.load(metallib_bytes)   # doctest: +SKIP
    >>> lib.function_names                                                   # doctest: +SKIP
"""

import torch  # noqa: F401  (loads libtorch, which the native module links against)

from ._air_arguments import Argument, StructField
from ._errors import (
    DispatchError,
    KernelArgumentError,
    KernelExecutionError,
    MetallibFormatError,
    OpDefinitionError,
    ReflectionError,
    TorchMetallibError,
    UnsupportedKernelError,
)
from ._function import KernelFunction
from ._function_constant import FunctionConstant
from ._library import Library, load
from ._pack import FunctionSource, pack
from ._reflection import Reflection, ThreadgroupVariable
from ._schedule import cpu_schedule

__all__ = [
    "load",
    "pack",
    "cpu_schedule",
    "Library",
    "KernelFunction",
    "FunctionConstant",
    "FunctionSource",
    "Argument",
    "StructField",
    "ThreadgroupVariable",
    "Reflection",
    "MetallibFormatError",
    "ReflectionError",
    "KernelArgumentError",
    "DispatchError",
    "UnsupportedKernelError",
    "KernelExecutionError",
    "OpDefinitionError",
    "TorchMetallibError",
]
__version__ = "0.1.0"

"""Load precompiled Apple Metal libraries (.metallib) and use their kernels from PyTorch.

    >>> import torch_metallib as tm
    >>> lib = tm.load("kernels.metallib")      # or tm.load(metallib_bytes)   # doctest: +SKIP
    >>> lib.function_names                                                   # doctest: +SKIP
"""

import torch  # noqa: F401  (loads libtorch, which the native module links against)

from . import backends  # noqa: F401  (registers the backends with the dispatch seam)
from ._version import __version__  # noqa: F401  (written once, in _version.py)
from .backends.cpu.schedule import cpu_schedule
from .container.function_constant import FunctionConstant
from .dispatch.checked_mode import checked
from .container.pack import FunctionSource, pack
from .errors import (
    ArchiveFormatError,
    DispatchError,
    KernelArgumentError,
    KernelExecutionError,
    KernelMemoryError,
    MetallibFormatError,
    OpDefinitionError,
    ReflectionError,
    TorchMetallibError,
    UnsupportedDeviceError,
    UnsupportedKernelError,
)
from .library.function import KernelFunction
from .library.library import Library, load
from .reflection.air_arguments import Argument, StructField
from .reflection.pack_modules import pack_modules
from .reflection.reflect import Reflection, ThreadgroupVariable

__all__ = [
    "load",
    "pack",
    "pack_modules",
    "cpu_schedule",
    "checked",
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
    "UnsupportedDeviceError",
    "KernelExecutionError",
    "KernelMemoryError",
    "OpDefinitionError",
    "ArchiveFormatError",
    "TorchMetallibError",
]

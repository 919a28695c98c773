"""Math on NVIDIA GPUs: libdevice, NVIDIA's bitcode math library (what CUDA's own math
functions and torch's CUDA kernels use).

AIR's math as air/intrinsics.py defines it (for every backend) calls LLVM's math
intrinsics and the C library's functions, which the NVPTX backend cannot select; here each
becomes the libdevice function of the same meaning (``llvm.exp.f32`` -> ``__nv_expf``,
``erff`` -> ``__nv_erff``), and ptx.py links libdevice into the module. The precise AIR
functions the CPU computes in double are computed in float here (lowering.py), with
libdevice's float functions (within 2 ulp, Metal allows 4 for most).

libdevice is found at $TORCH_METALLIB_LIBDEVICE, under $CUDA_HOME or /usr/local/cuda*,
or in the Python packages that ship it (triton, nvidia-cuda-nvcc).
"""

import os
import re
from typing import Optional

from torch_metallib import config
from ...errors import UnsupportedKernelError
from .toolkit import toolkit_files

__all__ = ["use_libdevice", "libdevice_path", "needs_libdevice", "LIBDEVICE_FUNCTIONS"]

# LLVM intrinsic stem -> libdevice stem (float: + "f"); everything NVPTX cannot select.
_INTRINSICS = {name: name for name in ("exp", "exp2", "exp10", "log", "log2", "log10", "sin", "cos", "tan", "asin",
                                       "acos", "atan", "sinh", "cosh", "tanh", "pow", "atan2", "ldexp")}
_LIBM = ("asinh", "acosh", "atanh", "erf", "expm1", "log1p")
# Every libdevice function use_libdevice can name (ptx.py keeps only these of the library).
LIBDEVICE_FUNCTIONS = frozenset(f"__nv_{stem}{suffix}" for stem in list(_INTRINSICS.values()) + list(_LIBM)
                                for suffix in ("", "f"))
_CALLEE = re.compile(r"@llvm\.(\w+)\.(f32|f64)(?:\.i32)?(?=\()")


def use_libdevice(text: str) -> str:
    """`text` with math calls and declarations renamed to libdevice's functions."""
    def intrinsic(match):
        stem = _INTRINSICS.get(match.group(1))
        if stem is None:
            return match.group(0)
        return f"@__nv_{stem}{'f' if match.group(2) == 'f32' else ''}"
    text = _CALLEE.sub(intrinsic, text)
    return re.sub(rf"@((?:{'|'.join(_LIBM)})f?)(?=\()", r"@__nv_\1", text)


def needs_libdevice(text: str) -> bool:
    return "@__nv_" in text


def libdevice_path() -> str:
    """Where libdevice is; UnsupportedKernelError saying how to provide it if nowhere."""
    found = _find()
    if found is None:
        raise UnsupportedKernelError(
            "the CUDA backend needs NVIDIA's libdevice (libdevice.10.bc) for this kernel's math and found none; "
            "install CUDA or the nvidia-cuda-nvcc package, or set TORCH_METALLIB_LIBDEVICE to its path")
    return found


def _find() -> Optional[str]:
    explicit = config.LIBDEVICE.get()
    if explicit:
        return explicit if os.path.exists(explicit) else None
    return next(iter(toolkit_files("nvvm/libdevice/libdevice*.bc")), None)

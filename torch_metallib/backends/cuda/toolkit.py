"""Where NVIDIA's compiler pieces are (libdevice, ptxas): one search for both, over a CUDA
toolkit ($CUDA_HOME, $CUDA_PATH, /usr/local/cuda*) and the Python packages that ship
them (nvidia-cuda-nvcc, triton). Nothing here is needed to run kernels already compiled."""

import glob
import os
from typing import List

from torch_metallib import config

__all__ = ["toolkit_files"]


def _package_roots() -> List[str]:
    roots = []
    for module in ("nvidia.cuda_nvcc", "triton"):
        try:
            package = __import__(module, fromlist=["__path__"])
        except ImportError:
            continue
        roots += list(getattr(package, "__path__", []))
    return roots


def toolkit_files(relative: str) -> List[str]:
    """Existing files matching `relative` (a glob, e.g. "bin/ptxas") under each toolkit root,
    then anywhere inside the packages, in that order of preference."""
    roots = [config.CUDA_HOME.get() or "", config.CUDA_PATH.get() or ""] + sorted(glob.glob("/usr/local/cuda*"))
    found = [path for root in roots if root for path in sorted(glob.glob(os.path.join(root, relative)))]
    for root in _package_roots():
        found += sorted(glob.glob(os.path.join(root, "**", os.path.basename(relative)), recursive=True))
    return found

"""Stage 4: the backends, one folder or module each, registered with the dispatch seam.

``cpu/`` JIT-compiles AIR for the host; ``meta`` validates and computes nothing;
``mps_backend`` encodes into PyTorch's MPS stream (macOS builds only); ``cuda/`` lowers AIR
to PTX for torch's CUDA stream (where torch is built with CUDA). A new backend implements
``dispatch.backend.Backend`` and is registered here.
"""

import torch

from .. import _C
from ..dispatch.backend import register_backend
from .cpu.backend import CpuBackend
from .meta import MetaBackend
from .mps_backend import MpsBackend

register_backend(CpuBackend())
register_backend(MetaBackend())
if torch.backends.cuda.is_built():  # the driver itself is reached on the first launch
    from .cuda.backend import CudaBackend
    register_backend(CudaBackend())
if hasattr(_C, "MetalLibrary"):  # built with csrc/mps (macOS)
    register_backend(MpsBackend(_C))

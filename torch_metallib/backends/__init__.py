"""Stage 4: the backends, one folder or module each, registered with the dispatch seam.

``cpu/`` JIT-compiles AIR for the host; ``meta`` validates and computes nothing. A new
backend implements ``dispatch.backend.Backend`` and is registered here.
"""

from ..dispatch.backend import register_backend
from .cpu.backend import CpuBackend
from .meta import MetaBackend

register_backend(CpuBackend())
register_backend(MetaBackend())

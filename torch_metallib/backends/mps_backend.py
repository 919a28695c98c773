"""The Metal backend: kernels on ``mps`` tensors, encoded into PyTorch's MPS stream.

The binding plan's command list (``_C.Plan.commands``, csrc/dispatch/command_list.h) is the
only input: the Objective-C++ in csrc/mps replays it as setBuffer / setBytes /
setThreadgroupMemoryLength / dispatchThreads on the current stream's compute encoder, with
a pipeline per (function, constant values) built once, its compiled code kept across
processes in a binary archive (mps_archive.py). Each loaded library becomes one
Metal library, made from its bytes in place. Registered for ``mps`` when the native module
has the Metal backend (a macOS build); tests/metal_sim drives this same class on Linux
with a simulated Metal. Checked execution is a CPU-backend feature: calls run unchecked.
"""

import threading
import weakref

from ..dispatch.backend import Backend
from . import mps_archive

__all__ = ["MpsBackend"]


class MpsBackend(Backend):
    device_type = "mps"

    def __init__(self, native):
        self._native = native  # has MetalLibrary: torch_metallib._C on a Mac, the simulation in tests
        self._libraries = weakref.WeakKeyDictionary()  # Library -> its MetalLibrary
        self._lock = threading.Lock()

    def metal_library(self, library):
        """The Metal library of a loaded `library`, made once."""
        with self._lock:
            made = self._libraries.get(library)
            if made is None:
                mps_archive.configure(self._native)
                made = self._libraries[library] = self._native.MetalLibrary(library._view)
            return made

    def prepare(self, function, state, constants: tuple, checked: bool = False):
        # Pipelines are built on first use per constant values, in the native cache.
        return self.metal_library(function.library)

    def run(self, function, prepared, plan) -> None:
        prepared.run(plan)

    def limits(self, function, plan) -> dict:
        """maxTotalThreadsPerThreadgroup, threadExecutionWidth and staticThreadgroupMemoryLength
        of the pipeline for `plan`'s function and constant values."""
        return self.metal_library(function.library).limits(plan)

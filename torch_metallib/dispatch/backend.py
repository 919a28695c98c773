"""The backend seam: what a backend implements, and which backend runs a call.

A call is validated into a binding plan (``_C.Plan``: buffers with byte offsets, inline
bytes, threadgroup lengths, grid and group size, constant values) before any backend is
involved. A backend then does two things with it: `prepare` the function for the plan's
function-constant values (compile, build a pipeline; cached by the backend), and `run` the
plan. The backend is chosen from the device type of the call's tensors.

Backends register themselves (``torch_metallib.backends`` imports them); this module never
imports a backend, so the import graph stays one-way.
"""

import abc
from typing import Dict, Tuple

from .. import _C
from ..errors import UnsupportedDeviceError

__all__ = ["Backend", "register_backend", "backend_for", "available_backends"]


class Backend(abc.ABC):
    """One device type's way of running kernels.

    Attributes:
        device_type: the torch device type whose tensors this backend runs on
            (``"cpu"``, ``"meta"``, later ``"mps"`` and ``"cuda"``).
        checks: whether it can run calls checked (only then is the caller's wish
            looked up for each call: the environment is a few microseconds a call).
    """

    device_type: str = ""
    checks: bool = False

    @abc.abstractmethod
    def prepare(self, function, state, constants: tuple, checked: bool = False):
        """`function` made runnable for these function-constant values.

        Args:
            function: the KernelFunction being called.
            state: its ``dispatch.calls.DispatchState`` (what reflection says about running it);
                a backend may keep its per-function caches there.
            constants: the plan's function-constant values, ``((index, value), ...)``.
            checked: the caller asked for checked execution (dispatch/checked_mode.py); a
                backend that cannot check runs unchecked.

        Returns:
            Whatever `run` needs; backends cache it so repeated calls pay nothing.
        """

    @abc.abstractmethod
    def run(self, function, prepared, plan) -> None:
        """Runs a validated binding plan; `prepared` is what `prepare` returned for it."""

    def launcher(self, function, prepared, plan, checked: bool):
        """A native launcher (``_C.Launcher``) that runs plans like `plan` as `run` just did,
        without Python, or None. Later calls that it accepts never leave native code."""
        return None


_backends: Dict[str, Backend] = {}


def register_backend(backend: Backend) -> None:
    """Makes `backend` run the calls whose tensors are on ``backend.device_type``."""
    _backends[backend.device_type] = backend
    _C.backends_changed()  # the native launchers of the backend it replaces stop running calls


def available_backends() -> Tuple[str, ...]:
    """Device types that have a backend in this build, e.g. ``("cpu", "meta")``."""
    return tuple(sorted(_backends))


def backend_for(device: str, kernel: str) -> Backend:
    """The backend for tensors on `device` (``"cpu"``, ``"cuda:0"``, ...).

    Raises:
        UnsupportedDeviceError: no backend runs kernels on that device type.
    """
    device_type = device.split(":", 1)[0]
    backend = _backends.get(device_type)
    if backend is None:
        hint = (" The Metal backend needs a macOS build of torch_metallib." if device_type == "mps" else "")
        raise UnsupportedDeviceError(
            f"{kernel}: tensors are on {device}; expected a device with a backend "
            f"({', '.join(available_backends())}), got {device_type}.{hint} Move the tensors with "
            f".to('cpu') to run the kernel on the CPU backend", device=device,
            available=available_backends())
    return backend

"""The meta backend: a call on ``meta`` tensors is validated by the binding plan and computes
nothing (meta tensors have no data), so shape-only code and tracing can call kernels."""

from ..dispatch.backend import Backend

__all__ = ["MetaBackend"]


class MetaBackend(Backend):
    device_type = "meta"

    def prepare(self, function, state, constants: tuple, checked: bool = False):
        return None

    def run(self, function, prepared, plan) -> None:
        pass

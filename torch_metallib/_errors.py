"""Exception types. Kept free of native imports so they can be caught anywhere."""

__all__ = ["TorchMetallibError", "MetallibFormatError"]


class TorchMetallibError(Exception):
    """Base class of every error torch_metallib raises on purpose."""


class MetallibFormatError(TorchMetallibError, ValueError):
    """Malformed .metallib bytes.

    Attributes:
        offset: absolute byte offset in the file where the bad field starts.
        field: the field that failed validation, e.g. ``"function 3 'foo' NAME"``.
    """

    def __init__(self, message: str, offset: int = None, field: str = None):
        super().__init__(message)
        self.offset = offset
        self.field = field

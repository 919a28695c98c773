"""Exception types. Kept free of native imports so they can be caught anywhere."""

__all__ = [
    "TorchMetallibError", "MetallibFormatError", "ReflectionError", "KernelArgumentError",
    "DispatchError", "UnsupportedKernelError", "UnsupportedDeviceError", "KernelExecutionError", "KernelMemoryError",
    "OpDefinitionError", "ArchiveFormatError",
]


class TorchMetallibError(Exception):
    """Base class of every error torch_metallib raises on purpose."""


class _BytesFormatError(TorchMetallibError, ValueError):
    """Bytes of a file format that fail validation at a field: what the .metallib and the
    archive errors share (private: catch the public types)."""

    def __init__(self, message: str, offset: int = None, field: str = None):
        super().__init__(message)
        self.offset = offset
        self.field = field


class MetallibFormatError(_BytesFormatError):
    """Malformed .metallib bytes.

    Attributes:
        offset: absolute byte offset in the file where the bad field starts.
        field: the field that failed validation, e.g. ``"function 3 'foo' NAME"``.
    """


class ReflectionError(TorchMetallibError, ValueError):
    """A function's AIR bitcode cannot be reflected: llvmlite cannot parse it, or its
    metadata is not in the shape AIR gives it. Only that function is affected.

    Attributes:
        function: name of the function.
        node: the metadata node at fault, e.g. ``"!18"`` or ``"!air.kernel"``; None when
            the bitcode itself could not be parsed.
    """

    def __init__(self, message: str, function: str = None, node: str = None):
        super().__init__(message)
        self.function = function
        self.node = node


class KernelArgumentError(TorchMetallibError, TypeError):
    """A kernel call's arguments do not match the kernel: wrong count, unknown or missing
    names, a tensor of the wrong dtype or device, a value that cannot be packed, a written
    tensor whose elements overlap (an expanded view). Nothing was written."""


class DispatchError(TorchMetallibError, ValueError):
    """A kernel call is well-typed but cannot be dispatched: bad ``threads``/``group_size``,
    a buffer smaller than declared, a missing or mistyped function constant. Nothing was
    written."""


class UnsupportedKernelError(TorchMetallibError, NotImplementedError):
    """The kernel uses something this backend cannot run yet (e.g. threadgroup barriers
    or SIMD-group functions on the CPU)."""


class UnsupportedDeviceError(UnsupportedKernelError):
    """A call's tensors are on a device no backend of this build runs kernels on (``cuda``,
    or ``mps`` in a build without the Metal backend).

    Attributes:
        device: the tensors' device, e.g. ``"cuda:0"``.
        available: the device types that have a backend, e.g. ``("cpu", "meta")``.
    """

    def __init__(self, message: str, device: str = None, available: tuple = ()):
        super().__init__(message)
        self.device = device
        self.available = tuple(available)


class KernelExecutionError(TorchMetallibError, RuntimeError):
    """A kernel failed while running: e.g. a threadgroup barrier that not every thread of
    the group reaches (on a GPU, a hang)."""


class KernelMemoryError(KernelExecutionError):
    """Checked execution (``torch_metallib.checked()``) found a kernel access outside the
    memory the call bound (a tensor's view, or its storage where the call names it in
    ``storage_bounds``): the message names the kernel, the thread position in the grid,
    read or write, the bytes, the argument with the access's byte offset from its first
    element, and the byte offsets allowed. The
    access went to scratch memory instead; tensors the kernel wrote before it may hold
    partial results."""


class OpDefinitionError(TorchMetallibError, ValueError):
    """``torch_metallib.ops.define`` was given a schema, kernels, bindings or rules that do
    not fit together; nothing was registered."""


class ArchiveFormatError(_BytesFormatError):
    """Bytes given as an ahead-of-time archive (``tm.load(..., archives=)``, ``python -m
    torch_metallib precompile``) that are not a well-formed archive: another file, a
    truncated or damaged one. Nothing of it was used.

    Attributes:
        offset: absolute byte offset in the archive where the bad field starts.
        field: the field that failed validation, e.g. ``"entry 3 payload SHA-256"``.
    """

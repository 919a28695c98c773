"""Library: a loaded .metallib and the entry point `load`."""

import difflib
import hashlib
import uuid as uuid_module
from typing import Iterable, Iterator, Optional, Tuple

from .. import _C
from .function import KernelFunction
from ..cache.archives import open_archives
from ..container.source import open_source
from ..container.tables import (
    FILE_TYPE_STUB_BIT,
    FILE_TYPES,
    PLATFORM_64BIT_BIT,
    PLATFORMS,
    name_of,
)

__all__ = ["Library", "load"]


def load(src, *, verify: bool = False, archives=()) -> "Library":
    """Loads a .metallib from bytes or a file; the equivalent of
    ``torch._C._mps_loadMetallib`` / ``torch.mps.load_metallib`` on any machine.

    Args:
        src: bytes, bytearray, memoryview, mmap (used in place, not copied), or a path
            (``str``/``os.PathLike``, memory-mapped, not read into memory). Do not modify a
            writable buffer while the library is in use.
        verify: also check every function's metadata groups, module wrapper, bitcode
            magic, reflection entry and SHA-256 ``HASH`` now, instead of when each
            function (or its bitcode) is first used. Costs a pass over the whole file
            (~0.15 s for 147 MB). Without it, load reads the function list only.
        archives: ahead-of-time archives (paths or bytes, written by ``python -m
            torch_metallib precompile``) that this library's calls take compiled kernels
            from instead of compiling them: an entry serves only the function, constants
            and form it was built for, by the same toolchain, on a CPU that has the
            instructions it needs; any other call compiles as usual. Each archive is read
            and checked whole here (``TORCH_METALLIB_ARCHIVES`` adds archives for every
            library).

    Returns:
        A :class:`Library`.

    Raises:
        MetallibFormatError: the bytes are not a well-formed .metallib; the message names
            the byte offset, the field, what was expected and what was found.
        ArchiveFormatError: an archive is not a well-formed archive (another file, or a
            damaged or truncated one); the message names the byte offset and field.
        TypeError: `src` is neither a byte buffer nor a path.
        OSError: the path cannot be opened.

    Example:
        >>> import torch_metallib as tm
        >>> lib = tm.load("kernels.metallib")            # doctest: +SKIP
        >>> lib.function_names[:2]                      # doctest: +SKIP
        ('vv_Addfloat32', 'vv_Subtractfloat32')
    """
    opened = open_archives(archives)
    view, description = open_source(src)
    library = Library(_C.Container(view), view, description)
    library._archives = opened
    if verify:
        library.verify()
    return library


class Library:
    """A loaded .metallib: its header fields and its functions by name.

    Functions are available as ``lib["name"]`` (KeyError if missing) and ``lib.name``
    (AttributeError if missing, so ``hasattr`` works); both suggest the closest names.
    Use :func:`load` to create one.
    """

    def __init__(self, container, view: memoryview, description: str):
        self._container = container
        self._view = view
        self._description = description
        self._header = container.header
        self._names = None
        self._functions = {}
        self._archives = ()  # ahead-of-time archives its calls look in (load's archives=)

    # --- header -------------------------------------------------------------------
    @property
    def file_version(self) -> Tuple[int, int, int]:
        """The container format version, e.g. ``(1, 2, 7)``."""
        return tuple(self._header["format_version"])

    @property
    def file_type(self) -> str:
        """``"executable"``, ``"coreimage"``, ``"dynamic"`` or ``"symbol_companion"``
        (with ``" stub"`` appended when the stub bit is set)."""
        code = self._header["file_type"]
        name = name_of(FILE_TYPES, code & ~FILE_TYPE_STUB_BIT)
        return name + (" stub" if code & FILE_TYPE_STUB_BIT else "")

    @property
    def platform(self) -> str:
        """Target platform: ``"macos"``, ``"ios"``, ``"visionos"``, ..."""
        return name_of(PLATFORMS, self._header["platform"] & ~PLATFORM_64BIT_BIT)

    @property
    def platform_version(self) -> Tuple[int, int, int]:
        """Minimum OS version the library targets, e.g. ``(14, 0, 0)``."""
        return tuple(self._header["platform_version"])

    @property
    def group_size_convention(self) -> str:
        """How the file sizes its metadata tag groups: ``"current"`` (the u32 size counts
        its own 4 bytes) or ``"older"`` (it does not; toolchains before RFLT/RLST/UUID).
        `to_bytes` and `subset` keep it; `pack` writes ``"current"``."""
        return "current" if self._header["group_sizes_count_themselves"] else "older"

    @property
    def uuid(self) -> Optional[uuid_module.UUID]:
        """The library's UUID from the header extension, or None if it has none."""
        for tag, _offset, payload in self._container.extension or ():
            if tag == "UUID":
                return uuid_module.UUID(bytes=payload)
        return None

    @property
    def nbytes(self) -> int:
        """Size of the .metallib in bytes."""
        return self._view.nbytes

    @property
    def unknown_tags(self) -> list:
        """Tags this version does not know, kept byte-for-byte: ``(place, tag, offset, size)``."""
        return list(self._container.unknown_tags)

    # --- functions ----------------------------------------------------------------
    @property
    def function_names(self) -> Tuple[str, ...]:
        """Names of all functions, in file order."""
        if self._names is None:
            self._names = self._container.names()
        return self._names

    def __len__(self) -> int:
        return len(self._container)

    def __iter__(self) -> Iterator[str]:
        return iter(self.function_names)

    def __contains__(self, name) -> bool:
        return isinstance(name, str) and self._find(name) >= 0

    def __getitem__(self, name: str) -> KernelFunction:
        function = self._get(name)
        if function is None:
            raise KeyError(self._missing_message(name))
        return function

    def __getattr__(self, name: str) -> KernelFunction:
        if name.startswith("_"):
            raise AttributeError(name)
        function = self._get(name)
        if function is None:
            raise AttributeError(self._missing_message(name))
        return function

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(self.function_names))

    def _find(self, name: str) -> int:
        return self._container.index_of(name.encode("utf-8", "surrogateescape"))

    def _get(self, name) -> Optional[KernelFunction]:
        if not isinstance(name, str):
            raise TypeError(f"function names are str; got {type(name).__name__}")
        function = self._functions.get(name)
        if function is None:
            index = self._find(name)
            if index < 0:
                return None
            function = KernelFunction(self, index, self._container.function(index))
            # setdefault: threads that race here all get the same object (and reflection)
            function = self._functions.setdefault(name, function)
        return function

    def _missing_message(self, name: str, listing: str = "See lib.function_names for all names.") -> str:
        close = difflib.get_close_matches(name, self.function_names, n=3, cutoff=0.6)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        return (
            f"no function {name!r} in this library ({len(self)} functions from "
            f"{self._description}).{hint} {listing}"
        )

    # --- writing ------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        """Serializes the library; an unmodified library gives back exactly its input bytes."""
        return self._container.to_bytes()

    def subset(self, names: Iterable[str]) -> bytes:
        """The bytes of a smaller valid library holding only `names`, in the order given.

        Everything else (header, reflection entries, embedded sections) is carried over;
        the UUID is re-derived from the selected functions.

        Raises:
            KeyError: a name is not in this library (the message suggests close names).
            ValueError: a name is listed twice, or no names were given.
        """
        if isinstance(names, str):
            names = [names]
        names = list(names)
        if not names:
            raise ValueError("subset: expected at least one function name, got none")
        seen = set()
        indices = []
        for name in names:
            if name in seen:
                raise ValueError(f"subset: function {name!r} is listed twice")
            seen.add(name)
            index = self._find(name) if isinstance(name, str) else -1
            if index < 0:
                raise KeyError(self._missing_message(str(name)))
            indices.append(index)
        return self._container.subset(indices)

    def verify(self) -> None:
        """Checks every metadata group, module wrapper, bitcode magic, reflection entry and
        SHA-256 ``HASH``.

        Raises:
            MetallibFormatError: naming the first function and byte offset that is wrong.
        """
        self._container.verify()  # wrappers, bitcode magic, reflection groups
        view = self._view
        for index, (offset, size, expected) in enumerate(self._container.module_hashes()):
            if len(expected) == 32 and hashlib.sha256(view[offset : offset + size]).digest() != expected:
                self[self.function_names[index]]._check_hash()  # raises, naming the function

    def __repr__(self) -> str:
        version = ".".join(map(str, self.platform_version))
        return (
            f"<torch_metallib.Library {len(self)} functions, {self.platform} {version}, "
            f"format {'.'.join(map(str, self.file_version))}, {self.nbytes:,} bytes>"
        )

"""KernelFunction: one function of a loaded library, a thin view over the native container."""

from dataclasses import dataclass
from typing import Optional, Tuple

from ._tables import DATA_TYPES, FUNCTION_TYPES, name_of

__all__ = ["FunctionConstant", "KernelFunction"]


@dataclass(frozen=True)
class FunctionConstant:
    """A Metal function constant declared by a function (the ``CNST`` metadata tag).

    Attributes:
        name: the constant's name in the Metal source.
        type: its MTLDataType name, e.g. ``"bool"``, ``"int"``, ``"float"``.
        index: the ``[[function_constant(index)]]`` it is bound to.
        required: whether a value must be supplied when the pipeline is built.
    """

    name: str
    type: str
    index: int
    required: bool = True


class KernelFunction:
    """One function of a :class:`~torch_metallib.Library`.

    Obtained from ``lib["name"]`` or ``lib.name``; keeps its library (and so the file's
    bytes) alive. Every attribute is read from the container without copying.
    """

    __slots__ = ("_library", "_index", "_record", "_bitcode")

    def __init__(self, library, index: int, record: dict):
        self._library = library
        self._index = index
        self._record = record
        self._bitcode = None

    @property
    def library(self):
        """The :class:`~torch_metallib.Library` this function belongs to."""
        return self._library

    @property
    def name(self) -> str:
        return self._record["name"]

    @property
    def type(self) -> str:
        """``"kernel"``, ``"vertex"``, ``"fragment"``, ``"visible"``, ``"intersection"``, ..."""
        return name_of(FUNCTION_TYPES, self._record["type"])

    @property
    def hash(self) -> str:
        """SHA-256 of the function's module bytes (``HASH`` tag), 64 lowercase hex digits."""
        return self._record["hash"].hex()

    @property
    def air_version(self) -> Optional[Tuple[int, int]]:
        """AIR version of the bitcode, e.g. ``(2, 6)``; None without a ``VERS`` tag."""
        versions = self._record["versions"]
        return None if versions is None else tuple(versions[:2])

    @property
    def language_version(self) -> Optional[Tuple[int, int]]:
        """Metal Shading Language version, e.g. ``(3, 1)``; None without a ``VERS`` tag."""
        versions = self._record["versions"]
        return None if versions is None else tuple(versions[2:])

    @property
    def function_constants(self) -> list:
        """The function constants declared in the ``CNST`` tag, as FunctionConstant records."""
        return [
            FunctionConstant(name, name_of(DATA_TYPES, type_code), index, required)
            for name, type_code, index, required in self._record["constants"]
        ]

    @property
    def module_size(self) -> int:
        """Bytes of the function's module: Darwin wrapper + bitcode + padding (``MDSZ``)."""
        return self._record["module_size"]

    @property
    def module(self) -> memoryview:
        """The module bytes the ``HASH`` covers (wrapper + bitcode + padding), zero-copy."""
        offset = self._record["module_offset"]
        return self._library._view[offset : offset + self._record["module_size"]]

    @property
    def bitcode(self) -> memoryview:
        """The raw LLVM bitcode (without the Darwin wrapper): a read-only, zero-copy view.

        Raises:
            MetallibFormatError: the module's wrapper or bitcode magic is malformed.
        """
        if self._bitcode is None:
            offset, size = self._library._container.bitcode_range(self._index)
            self._bitcode = self._library._view[offset : offset + size]
        return self._bitcode

    @property
    def tags(self) -> list:
        """Raw ``(tag, file offset, payload)`` tuples of the function-list group."""
        return list(self._record["tags"])

    def __repr__(self) -> str:
        air = ".".join(map(str, self.air_version)) if self.air_version else "?"
        return (
            f"<KernelFunction {self.name!r} type={self.type} air={air} "
            f"hash={self.hash[:12]} module={self.module_size} bytes>"
        )

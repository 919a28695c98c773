"""Writing new .metallib files from LLVM bitcode."""

from dataclasses import dataclass, field
from typing import Iterable, Sequence, Tuple

from .. import _C
from .function_constant import FunctionConstant
from .tables import DATA_TYPES, FILE_TYPES, FUNCTION_TYPES, PLATFORM_64BIT_BIT, PLATFORMS, code_of

__all__ = ["FunctionSource", "pack"]


@dataclass
class FunctionSource:
    """One function to pack into a new library.

    Attributes:
        name: the function's name (unique within the library).
        bitcode: LLVM bitcode of an AIR module, raw (``'BC' 0xC0DE``) or in the Darwin
            wrapper LLVM writes for Apple triples (llvmlite's ``module.as_bitcode()``);
            an object with ``as_bitcode()`` is accepted too.
        type: ``"kernel"`` (default), ``"vertex"``, ``"fragment"``, ``"visible"``, ...
        function_constants: FunctionConstant records written to the ``CNST`` tag.
        air_version: ``(major, minor)`` written to ``VERS``.
        language_version: Metal Shading Language ``(major, minor)`` written to ``VERS``.
    """

    name: str
    bitcode: bytes
    type: str = "kernel"
    function_constants: Sequence[FunctionConstant] = field(default_factory=tuple)
    air_version: Tuple[int, int] = (2, 6)
    language_version: Tuple[int, int] = (3, 1)


def pack(
    functions: Iterable[FunctionSource],
    *,
    platform: str = "macos",
    platform_version: Tuple[int, int, int] = (14, 0, 0),
    file_version: Tuple[int, int, int] = (1, 2, 7),
    file_type: str = "executable",
) -> bytes:
    """Builds a .metallib holding `functions`, in order. `pack_modules` derives the names,
    types, versions and constants from AIR modules instead, as Apple's ``metallib`` does.

    Each module gets Apple's 20-byte Darwin wrapper and 16-byte padding, its ``HASH`` is
    the SHA-256 of the module bytes, and the library's UUID is derived from the content,
    so the same input always gives the same bytes.

    Example:
        >>> import llvmlite.binding as llvm, torch_metallib as tm            # doctest: +SKIP
        >>> module = llvm.parse_assembly(open("vector_add_float.ll").read())  # doctest: +SKIP
        >>> data = tm.pack([tm.FunctionSource("vector_add_float", module.as_bitcode())])  # doctest: +SKIP
        >>> tm.load(data).function_names                                     # doctest: +SKIP
        ('vector_add_float',)

    Raises:
        ValueError: an unknown type/platform name, a bad version, duplicate names or
            constant indices, or bytes that are not LLVM bitcode.
    """
    header = {
        "format_version": _version(file_version, 3, "file_version", 0x7FFF),
        "macos_target": platform == "macos",
        "file_type": code_of(FILE_TYPES, file_type, "file type"),
        "platform": code_of(PLATFORMS, platform, "platform") | PLATFORM_64BIT_BIT,
        "platform_version": _platform_version(platform_version),
    }
    specs = [_spec(function) for function in functions]
    return _C.pack(header, specs)


def _spec(function: FunctionSource) -> dict:
    if not isinstance(function, FunctionSource):
        raise TypeError(f"pack: expected FunctionSource records; got {type(function).__name__}")
    name = function.name
    if not isinstance(name, str) or not name or "\0" in name or len(name.encode()) > 0xFFFE:
        raise ValueError(f"pack: function name must be 1 to 65534 bytes of UTF-8 without NUL; "
                         f"got {name!r}")
    bitcode = function.bitcode
    if hasattr(bitcode, "as_bitcode"):
        bitcode = bitcode.as_bitcode()
    constants = []
    names, indices = set(), set()
    for constant in function.function_constants:
        where = f"pack: function {function.name!r} constant {constant.name!r}"
        if constant.name in names or constant.index in indices:
            raise ValueError(f"{where}: name and index must be unique within the function")
        if not 0 <= constant.index <= 0xFFFF:
            raise ValueError(f"{where}: index must be 0..65535; got {constant.index}")
        names.add(constant.name)
        indices.add(constant.index)
        type_code = code_of(DATA_TYPES, constant.type, "function-constant type")
        constants.append((constant.name, type_code, constant.index, bool(constant.required)))
    return {
        "name": function.name,
        "type": code_of(FUNCTION_TYPES, function.type, "function type"),
        "bitcode": bytes(bitcode),
        "versions": _version(function.air_version, 2, "air_version", 0xFFFF)
        + _version(function.language_version, 2, "language_version", 0xFFFF),
        "constants": constants,
    }


def _version(value, length: int, what: str, limit: int) -> tuple:
    value = tuple(value)
    if len(value) != length or not all(isinstance(v, int) and 0 <= v <= limit for v in value):
        raise ValueError(f"pack: {what} must be {length} integers in 0..{limit}; got {value!r}")
    return value


def _platform_version(value) -> tuple:
    major, minor, patch = _version(value, 3, "platform_version", 0xFFFF)
    if minor > 0xFF or patch > 0xFF:
        raise ValueError(f"pack: platform_version minor and patch must be 0..255; got {value!r}")
    return (major, minor, patch)

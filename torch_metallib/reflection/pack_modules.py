"""`pack_modules`: a .metallib from AIR modules alone, deriving what Apple's ``metallib`` tool
derives (module_source.py per module; the header here)."""

from typing import Iterable, Optional, Sequence, Tuple

from ..container.pack import pack
from ..errors import ReflectionError
from .module_source import ModuleSource, read_modules

__all__ = ["pack_modules", "library_header", "file_version_for"]

# Release pairs (an OS version -> the macOS release of the same year) for the file-format
# rule below; only macOS is checked against Apple-built files.
_MACOS_OFFSET = {"ios": 3, "ios_simulator": 3, "maccatalyst": 3, "tvos": 3, "tvos_simulator": 3,
                 "watchos": -4, "watchos_simulator": -4, "visionos": -13, "visionos_simulator": -13}


def pack_modules(modules: Iterable, *, platform: Optional[str] = None,
                 platform_version: Optional[Tuple[int, int, int]] = None,
                 file_version: Optional[Tuple[int, int, int]] = None, file_type: str = "executable") -> bytes:
    """Builds a .metallib from AIR modules, in order: one function per entry function.

    Each module is a path (``.air``/``.bc`` bitcode, raw or in Apple's wrapper, or ``.ll``
    text), bitcode bytes or an llvmlite module. From each it derives what Apple's tool does:
    the function's name and type (``!air.kernel``, ``!air.vertex``, ``!air.fragment``,
    ``!air.visible``), ``VERS`` (``!air.version``, ``!air.language_version``) and ``CNST``
    (``!air.function_constants``); the header's platform and version come from the modules'
    target triples. A module with one entry function is packed byte for byte, so its ``HASH``
    is Apple's for the same module; one with several is cut into a module per function, as
    Apple's tool does (each keeps what its function uses, and the module's function constants).
    The keyword arguments override the derived header fields.

    Example:
        >>> data = tm.pack_modules(["add.air", "scale.ll"])          # doctest: +SKIP
        >>> tm.load(data).function_names                               # doctest: +SKIP
        ('add_float', 'scale_float')

    Raises:
        ReflectionError: a module cannot be parsed or lacks what a library entry needs (the
            message names the module and what was expected), or the modules target different
            platforms.
        ValueError: duplicate function names, or a bad override (as `pack`).
    """
    sources = [source for module in modules for source in read_modules(module)]
    header = library_header(sources, platform=platform, platform_version=platform_version,
                            file_version=file_version)
    return pack([source.function for source in sources], file_type=file_type, **header)


def library_header(sources: Sequence[ModuleSource], *, platform: Optional[str] = None,
                   platform_version: Optional[Tuple[int, int, int]] = None,
                   file_version: Optional[Tuple[int, int, int]] = None) -> dict:
    """`pack`'s header keywords for `sources`: their common platform, the highest deployment
    target among them, and the file-format version Apple's tool writes for that target."""
    if platform is None:
        platforms = sorted({source.platform for source in sources})
        if len(platforms) > 1:
            found = ", ".join(f"{s.function.name}: {s.triple}" for s in sources)
            raise ReflectionError(f"pack: the modules target {len(platforms)} platforms ({found}); expected "
                                  f"one. Pass platform= to choose")
        platform = platforms[0] if platforms else "macos"
    if platform_version is None:
        platform_version = max((source.platform_version for source in sources), default=(14, 0, 0))
    if file_version is None:
        file_version = file_version_for(platform, platform_version)
    return {"platform": platform, "platform_version": tuple(platform_version), "file_version": file_version}


def file_version_for(platform: str, version: Tuple[int, int, int]) -> Tuple[int, int, int]:
    """The file format Apple's tool writes for a deployment target. From Apple-built macOS
    libraries: 1.2.6 for macOS 12, 1.2.7 for 13 to 15.0, 1.2.8 for 15.5, 1.2.9 for 26 (one
    library at 15.5 and none between 15.0 and 15.5: the boundary there is a guess)."""
    major, minor = version[0], version[1] if len(version) > 1 else 0
    if platform not in ("macos", "driverkit", "bridgeos", "unknown") and major < 26:
        major -= _MACOS_OFFSET.get(platform, 0)
    if major >= 26:
        return (1, 2, 9)
    if (major, minor) >= (15, 5):
        return (1, 2, 8)
    if major >= 13:
        return (1, 2, 7)
    return (1, 2, 6) if major == 12 else (1, 2, 5)

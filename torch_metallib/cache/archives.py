"""Which ahead-of-time archives (archive.py) a function's calls look in: its library's
(``tm.load(..., archives=)``), then ``TORCH_METALLIB_ARCHIVES``'s; and the one warning
that each archive gets for each reason it is passed over (another toolchain, a CPU
without the instructions it was built for), after which the JIT compiles as usual.
"""

import threading
from typing import Tuple

from .. import config
from ..diagnostics import get_logger
from ..errors import ArchiveFormatError
from .archive import Archive, read_archive

__all__ = ["open_archives", "archives_for", "record_payloads", "warn_once"]

_lock = threading.RLock()  # reentrant: opening the environment's archives may warn
_environment: Tuple[tuple, Tuple[Archive, ...]] = ((), ())  # (the variable's paths, their archives)
_warned = set()


def open_archives(sources) -> Tuple[Archive, ...]:
    """`sources` (paths or bytes; one or a list; None: none) read and checked; raises
    ArchiveFormatError or OSError."""
    if sources is None:
        return ()
    if isinstance(sources, (str, bytes, bytearray, memoryview)) or not hasattr(sources, "__iter__"):
        sources = [sources]
    return tuple(read_archive(source) for source in sources)


def archives_for(function) -> Tuple[Archive, ...]:
    """The archives `function`'s library was loaded with, then the environment's."""
    return getattr(function.library, "_archives", ()) + _from_environment()


def record_payloads(function, target: str, toolchain: str):
    """The payloads of `function`'s records under `target` (entries without constants, the
    function's type as their form: call records, operator summaries) made by `toolchain`, in
    the order its archives are looked in."""
    for archive in archives_for(function):
        found = archive.lookup(target, function.hash, "", function.type)
        if found is not None and found[0].target.toolchain == toolchain:
            yield found[1]


def _from_environment() -> Tuple[Archive, ...]:
    global _environment
    paths = config.ARCHIVES.get()
    if _environment[0] == paths:
        return _environment[1]
    with _lock:
        if _environment[0] != paths:
            opened = []
            for path in paths:
                try:
                    opened.append(read_archive(path))
                except (ArchiveFormatError, OSError) as error:  # not passed by the caller: never fail a call on it
                    warn_once(("environment", path), f"TORCH_METALLIB_ARCHIVES: skipping {path}: {error}")
            _environment = (paths, tuple(opened))
    return _environment[1]


def warn_once(key, message: str) -> None:
    """Logs `message` as a warning the first time `key` is seen in this process."""
    with _lock:
        if key in _warned:
            return
        _warned.add(key)
    get_logger().warning("%s", message)

"""Where the Metal backend keeps compiled pipelines across processes: one MTLBinaryArchive
per GPU and macOS build, ``<cache>/metal/<device>-<os build>.binarchive`` (csrc/mps/
pipeline_archive.mm consults it before compiling a pipeline and adds what it compiles).

It is written once, when the process exits (and when the folder changes), not after each
pipeline: writing serializes the whole archive, so a program that builds N pipelines at
start-up would write it N times. A process that dies without running exit handlers loses
only this session's additions; the next one compiles them again. Off with
TORCH_METALLIB_METAL_ARCHIVE=0 or TORCH_METALLIB_CACHE=0.
"""

import atexit
import ctypes
import platform
import sys
from typing import Optional

from .. import config
from ..cache.disk_cache import cache_directory

__all__ = ["archive_folder", "os_build", "configure"]

_saved_at_exit = set()  # native modules whose archive an exit handler writes


def archive_folder() -> Optional[str]:
    """The archive's folder, or None when archiving is off."""
    if not config.METAL_ARCHIVE.get():
        return None
    return cache_directory("metal")


def os_build() -> str:
    """The OS build ("24A335" on macOS: compiled GPU code is valid for this build only);
    elsewhere (the simulated Metal) the kernel release."""
    if sys.platform == "darwin":
        size = ctypes.c_size_t(64)
        text = ctypes.create_string_buffer(64)
        if ctypes.CDLL(None).sysctlbyname(b"kern.osversion", text, ctypes.byref(size), None, 0) == 0:
            return text.value.decode(errors="replace")
    return platform.release()


def configure(native) -> None:
    """Points `native`'s archive at the folder the configuration gives now (read at each
    library made, like every knob), and writes it at exit."""
    folder = archive_folder()
    native.configure_pipeline_archive(folder or "", os_build() if folder else "")
    if id(native) not in _saved_at_exit:
        _saved_at_exit.add(id(native))
        atexit.register(native.save_pipeline_archive)

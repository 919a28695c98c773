"""What torch_metallib tells about its work: the ``torch_metallib`` logger and IR dumps
(docs/configuration.md).

The logger reports compiles (kernel, backend, seconds) at INFO and disk-cache hits and
misses at DEBUG. It is silent by default (a NullHandler, no level set): configure it with
:mod:`logging` like any library's, or set ``TORCH_METALLIB_LOG=info`` (or ``debug``) for a
stderr handler. ``TORCH_METALLIB_DUMP_IR=<folder>`` writes every kernel compiled in the
process at each lowering stage to ``<folder>/<kernel>-<key>/<stage>.ll`` (``kernel.ptx``
for CUDA's PTX).
"""

import contextlib
import contextvars
import logging
import os
import re
import sys
import threading
import warnings
from typing import Callable, Optional, Union

from . import config

__all__ = ["logger", "get_logger", "dumping", "dumps", "dump_stage"]

logger = logging.getLogger("torch_metallib")
logger.addHandler(logging.NullHandler())

_lock = threading.Lock()
_handler: Optional[logging.Handler] = None  # the stderr handler TORCH_METALLIB_LOG installed
_applied: Optional[str] = None  # the level it was installed for


def get_logger() -> logging.Logger:
    """The ``torch_metallib`` logger, with a stderr handler while ``TORCH_METALLIB_LOG``
    names a level (the variable is read on each call: setting it later takes effect)."""
    global _handler, _applied
    level = config.LOG.get()
    if level != _applied:
        with _lock:
            if level == _applied:  # another thread applied it meanwhile
                return logger
            if _handler is not None:
                logger.removeHandler(_handler)
                logger.setLevel(logging.NOTSET)
                _handler = None
            if level is not None:
                _handler = logging.StreamHandler(sys.stderr)
                _handler.setFormatter(logging.Formatter("torch_metallib %(levelname)s: %(message)s"))
                logger.addHandler(_handler)
                logger.setLevel(level.upper())
            _applied = level
    return logger


_folder: contextvars.ContextVar = contextvars.ContextVar("torch_metallib_dump_folder", default=None)
_dump_warned = set()


@contextlib.contextmanager
def dumping(kernel: str, key: str):
    """While the block compiles `kernel` (`key`: its cache key's hex digest), dump_stage
    writes under ``$TORCH_METALLIB_DUMP_IR/<kernel>-<key[:16]>``, emptied first (the stages
    of an earlier compile, or of an attempt the backend gave up, do not stay); without the
    variable it writes nothing."""
    root = config.DUMP_IR.get()
    folder = os.path.join(root, f"{re.sub(r'[^A-Za-z0-9_.-]', '_', kernel)}-{key[:16]}") if root else None
    if folder is not None and os.path.isdir(folder):
        for name in os.listdir(folder):
            if name.endswith((".ll", ".ptx")):
                try:
                    os.remove(os.path.join(folder, name))
                except OSError:
                    pass
    token = _folder.set(folder)
    try:
        yield
    finally:
        _folder.reset(token)


def dumps() -> bool:
    """Whether a kernel compiled now is dumped (``TORCH_METALLIB_DUMP_IR`` is set)."""
    return config.DUMP_IR.get() is not None


def dump_stage(stage: str, text: Union[str, Callable[[], str]], suffix: str = ".ll") -> None:
    """Writes `text` (or what calling it returns: only made when dumping) as ``<stage><suffix>``
    in the folder of the kernel being compiled (see dumping); a later stage of the same name
    replaces it (a retry's). A folder that cannot be written costs one warning."""
    folder = _folder.get()
    if folder is None:
        return
    path = os.path.join(folder, stage + suffix)
    try:
        os.makedirs(folder, exist_ok=True)
        with open(path, "w", encoding="utf-8") as file:
            file.write(text() if callable(text) else text)
    except OSError as error:
        if folder not in _dump_warned:
            _dump_warned.add(folder)
            warnings.warn(f"TORCH_METALLIB_DUMP_IR: cannot write {path} ({error.strerror or error})",
                          RuntimeWarning, stacklevel=2)
        return
    get_logger().debug("dumped %s", path)

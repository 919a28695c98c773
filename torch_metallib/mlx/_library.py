"""Where MLX's library is and loading it: once per process, on first use.

The file is the one ``python -m torch_metallib corpus`` downloads (Apple-built
``mlx.metallib`` from the ``mlx-metal`` wheel), found where that command keeps it
(``$TORCH_METALLIB_CORPUS_DIR``, else the user cache); nothing is downloaded here.
"""

import os
import threading

from ..cache.corpus import MLX_METAL_VERSION, mlx_metallib_path
from ..library.library import load as load_library

__all__ = ["library", "library_path"]

_lock = threading.Lock()
_loaded = {}  # "library" -> Library, "path" -> its path


def library_path() -> str:
    """The path of the cached ``mlx.metallib``.

    Raises:
        FileNotFoundError: it is not there; the message says how to fetch it.
    """
    try:
        return mlx_metallib_path(download=False)
    except FileNotFoundError as error:
        raise FileNotFoundError(
            f"torch_metallib.mlx needs MLX {MLX_METAL_VERSION}'s mlx.metallib: {error}. "
            f"`python -m torch_metallib corpus` downloads it (147 MB, once), or pass a path: "
            f"torch_metallib.mlx.load('path/to/mlx.metallib')") from None


def library(path=None):
    """The loaded MLX library: `path`, else the cached one. Loaded once; a second call with
    another path is refused (the operators are registered over the first)."""
    with _lock:
        if "library" in _loaded:
            if path is not None and os.path.realpath(path) != _loaded["path"]:
                raise ValueError(f"torch_metallib.mlx already uses {_loaded['path']}; the operators are defined "
                                 f"once per process, so {path} cannot replace it")
            return _loaded["library"]
        path = os.path.realpath(path if path is not None else library_path())
        _loaded["library"] = load_library(path)
        _loaded["path"] = path
        return _loaded["library"]

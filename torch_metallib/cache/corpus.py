"""The reference corpus: Apple-built ``mlx.metallib`` from the ``mlx-metal`` macOS wheel.

17,248 kernels compiled by Apple's toolchain (format 1.2.7, macOS 14, AIR 2.6 / MSL 3.1).
Fetched once with pip from PyPI into a cache directory; no Mac needed.
"""

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile

from .. import config
from .disk_cache import user_cache_root

__all__ = ["MLX_METAL_VERSION", "mlx_metallib_path", "corpus_dir", "download_macos_wheel"]

MLX_METAL_VERSION = "0.32.4"
_MEMBER = "mlx/lib/mlx.metallib"
_SIZE = 146_876_416
_SHA256 = "d70ab213d4cfa9f2673e4db2c2a4474c86ad9cc7674564bec4dd4ac9409da675"


def corpus_dir() -> str:
    """``$TORCH_METALLIB_CORPUS_DIR``, else ``<user cache>/torch_metallib/corpus``."""
    explicit = config.CORPUS_DIR.get()
    if explicit:
        return explicit
    return os.path.join(user_cache_root(), "corpus")


def download_macos_wheel(requirement: str, folder: str) -> str:
    """Path of the macOS arm64 wheel of `requirement` (``name==version``), downloaded by pip
    into `folder`.

    Raises:
        RuntimeError: pip could not fetch it.
    """
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--platform", "macosx_14_0_arm64", "--python-version", "3.11", requirement, "-d", folder, "--quiet",
    ]
    result = subprocess.run(command, capture_output=True, text=True)
    wheels = [name for name in os.listdir(folder) if name.endswith(".whl")]
    if result.returncode != 0 or not wheels:
        raise RuntimeError(
            f"corpus: `{' '.join(command)}` failed (exit {result.returncode}):\n{result.stderr.strip()}")
    return os.path.join(folder, wheels[0])


def mlx_metallib_path(download: bool = True) -> str:
    """Path of the cached ``mlx.metallib``, downloading it first if needed.

    Raises:
        FileNotFoundError: not cached and `download` is False.
        RuntimeError: pip could not fetch the wheel, or its content is not the expected file.
    """
    path = os.path.join(corpus_dir(), f"mlx-metal-{MLX_METAL_VERSION}", "mlx.metallib")
    if os.path.exists(path) and os.path.getsize(path) == _SIZE:
        return path
    if not download:
        raise FileNotFoundError(
            f"{path} is missing; run `python -m torch_metallib corpus` to download it")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tempfile.TemporaryDirectory(dir=os.path.dirname(path)) as scratch:
        wheel_path = download_macos_wheel(f"mlx-metal=={MLX_METAL_VERSION}", scratch)
        extracted = os.path.join(scratch, "mlx.metallib")
        digest = hashlib.sha256()
        with zipfile.ZipFile(wheel_path) as wheel, \
                wheel.open(_MEMBER) as member, open(extracted, "wb") as out:
            for chunk in iter(lambda: member.read(1 << 20), b""):
                digest.update(chunk)
                out.write(chunk)
        if digest.hexdigest() != _SHA256:
            raise RuntimeError(
                f"corpus: {_MEMBER} in {os.path.basename(wheel_path)} has SHA-256 {digest.hexdigest()}; "
                f"expected {_SHA256}")
        os.replace(extracted, path)  # atomic: concurrent fetchers never see a partial file
    return path

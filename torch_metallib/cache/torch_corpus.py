"""PyTorch's own Metal kernels: the two metallibs inside torch's macOS arm64 wheel.

``torch/lib/libtorch_cpu.dylib`` of ``torch==2.13.0`` (``macosx_14_0_arm64``) embeds two
libraries of 12,998 kernels each: one built for macOS 14 (AIR 2.6, file format 1.2.7), one
for macOS 26 (AIR 2.8, file format 1.2.9). Their Metal source is public (PyTorch's
``aten/src/ATen/native/mps/kernels``), which makes them a conformance suite. Fetched once
with pip from PyPI into the corpus cache; no Mac needed.
"""

import hashlib
import os
import struct
import tempfile
import zipfile

from .corpus import corpus_dir, download_macos_wheel

__all__ = ["TORCH_WHEEL_VERSION", "TORCH_LIBRARIES", "torch_metallib_paths"]

TORCH_WHEEL_VERSION = "2.13.0"
_MEMBER = "torch/lib/libtorch_cpu.dylib"
# name -> (offset of the library inside the dylib, size, SHA-256)
TORCH_LIBRARIES = {
    "macos14": (0x5FFB2AC, 81_953_195, "b0d7271446781fdedcb823feca7fc08f14b11f454891cc5999715fbcd6261ff5"),
    "macos26": (0xAE23457, 81_928_443, "fb09a19e0bbc40c98993783e5890ec1e5906ba036dc54281a89b9aa2039d9ab1"),
}


def _path(name: str) -> str:
    return os.path.join(corpus_dir(), f"torch-{TORCH_WHEEL_VERSION}", f"{name}.metallib")


def torch_metallib_paths(download: bool = True) -> dict:
    """``{"macos14": path, "macos26": path}`` of the cached libraries, fetching them first
    if needed.

    Raises:
        FileNotFoundError: not cached and `download` is False.
        RuntimeError: pip could not fetch the wheel, or its content is not the expected files.
    """
    paths = {name: _path(name) for name in TORCH_LIBRARIES}
    if all(os.path.exists(p) and os.path.getsize(p) == TORCH_LIBRARIES[n][1] for n, p in paths.items()):
        return paths
    if not download:
        raise FileNotFoundError(
            f"{os.path.dirname(paths['macos14'])} is incomplete; run "
            "`python -m torch_metallib corpus --torch` to download it")
    folder = os.path.dirname(paths["macos14"])
    os.makedirs(folder, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as scratch:
        wheel_path = download_macos_wheel(f"torch=={TORCH_WHEEL_VERSION}", scratch)
        with zipfile.ZipFile(wheel_path) as wheel:
            dylib = wheel.read(_MEMBER)
        for name, (offset, size, sha256) in TORCH_LIBRARIES.items():
            blob = dylib[offset:offset + size]
            if blob[:4] != b"MTLB" or struct.unpack_from("<Q", blob, 16)[0] != size \
                    or hashlib.sha256(blob).hexdigest() != sha256:
                raise RuntimeError(
                    f"torch corpus: {_MEMBER} in {os.path.basename(wheel_path)} has no {size}-byte library with "
                    f"SHA-256 {sha256} at offset {offset:#x}")
            extracted = os.path.join(scratch, name)
            with open(extracted, "wb") as out:
                out.write(blob)
            os.replace(extracted, paths[name])  # atomic: concurrent fetchers never see a partial file
    return paths

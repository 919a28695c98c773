"""The Mojo kernels of tests/mojo/kernels.mojo, as compiled into tests/fixtures/mojo/
(tools/build_mojo_kernels.py), packed into one library."""

import pathlib
import re

import torch_metallib as tm

FOLDER = pathlib.Path(__file__).parent / "fixtures" / "mojo"
KERNELS = ("vector_add", "block_sum", "simd_sum_atomic", "softplus_f16", "transpose_tiled")


def mojo_modules(folder: pathlib.Path = FOLDER) -> list:
    return sorted(folder.glob("*.air"))


def mojo_library(folder: pathlib.Path = FOLDER) -> tm.Library:
    """The modules in `folder` packed into one library as `xcrun metallib` would: names,
    types, versions and platform from the modules themselves."""
    return tm.load(tm.pack_modules(mojo_modules(folder)))


def mojo_kernels() -> dict:
    """Kernel name -> KernelFunction. Mojo's symbols are kernels_<name>_<parameter types>_<hash>."""
    library = mojo_library()
    found = {re.match(r"kernels_(\w+?)_Point", name).group(1): library[name] for name in library.function_names}
    assert sorted(found) == sorted(KERNELS)
    return found

"""The Mojo kernels of tests/mojo/kernels.mojo, as compiled into tests/fixtures/mojo/
(tools/build_mojo_kernels.py), packed into one library."""

import pathlib
import re

import llvmlite.binding as llvm

import torch_metallib as tm

FOLDER = pathlib.Path(__file__).parent / "fixtures" / "mojo"
KERNELS = ("vector_add", "block_sum", "simd_sum_atomic", "softplus_f16", "transpose_tiled")


def mojo_library(folder: pathlib.Path = FOLDER) -> tm.Library:
    """The modules in `folder` packed into one library, each under its kernel's symbol."""
    sources = []
    for path in sorted(folder.glob("*.air")):
        bitcode = path.read_bytes()
        module = llvm.parse_bitcode(bitcode, context=llvm.create_context())
        symbol = next(f.name for f in module.functions if not f.is_declaration)
        sources.append(tm.FunctionSource(symbol, bitcode))
    return tm.load(tm.pack(sources))


def mojo_kernels() -> dict:
    """Kernel name -> KernelFunction. Mojo's symbols are kernels_<name>_<parameter types>_<hash>."""
    library = mojo_library()
    found = {re.match(r"kernels_(\w+?)_Point", name).group(1): library[name] for name in library.function_names}
    assert sorted(found) == sorted(KERNELS)
    return found

"""Build torch_metallib's native module torch_metallib._C.

The project's metadata (name, version, dependencies, entry points) is in pyproject.toml;
the version is written once, in torch_metallib/_version.py. This file only declares the
C++ extension, which pyproject.toml cannot express. Install into an environment that
already has torch (the extension is built against it):

    pip install --no-build-isolation -e .
    python -m build --wheel --no-isolation      # a wheel (docs/install.md)

`.ci/setup` builds the extension with `python setup.py build_ext --inplace` instead (its
ninja files stay in build/, so a rebuild compiles only what changed, and a wheel built
afterwards reuses the objects) and then registers the package with
TORCH_METALLIB_PREBUILT=1, which leaves the extension out of pip's build.
"""
import glob
import os
import sys

from setuptools import setup
import torch
from torch.utils.cpp_extension import BuildExtension, CppExtension

HERE = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join("torch_metallib", "csrc")


def native_sources():
    """Every .cpp under csrc/; Objective-C++ (csrc/mps/*.mm) only where Metal exists."""
    sources = glob.glob(os.path.join(CSRC, "**", "*.cpp"), recursive=True)
    if sys.platform == "darwin":
        sources += glob.glob(os.path.join(CSRC, "mps", "*.mm"))
    return sorted(sources)


def torch_requirement() -> str:
    """The torch release this build compiles against, to its minor version: the extension
    links torch's C++ ABI, so what it builds works with that minor release only
    (docs/install.md). Installing a wheel then brings (or keeps) a torch it works with."""
    major, minor = torch.__version__.split(".")[:2]
    return f"torch=={major}.{minor}.*"


def macos_openmp():
    """(compile, link) flags for OpenMP on macOS, from torch's own runtime: torch's macOS
    wheels ship ``include/omp.h`` and ``lib/libomp.dylib`` (Apple's clang has no OpenMP of
    its own). Without them at::parallel_for runs the CPU backend's threadgroups on one
    thread. The extension finds the libomp torch has already loaded: beside torch in an
    installed wheel (``@loader_path/../torch/lib``), else the build's torch."""
    torch_dir = os.path.dirname(torch.__file__)
    if not (os.path.exists(os.path.join(torch_dir, "include", "omp.h"))
            and os.path.exists(os.path.join(torch_dir, "lib", "libomp.dylib"))):
        print("torch_metallib: this torch ships no libomp; the CPU backend will run on one thread", file=sys.stderr)
        return [], []
    lib = os.path.join(torch_dir, "lib")
    return (["-Xpreprocessor", "-fopenmp"],
            [f"-L{lib}", "-lomp", "-Wl,-rpath,@loader_path/../torch/lib", f"-Wl,-rpath,{lib}"])


extra_compile_args = ["-std=c++20", "-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"]
extra_link_args = []
if sys.platform.startswith("linux"):
    # at::parallel_for is inlined from torch's headers as an OpenMP region: without
    # -fopenmp it silently runs on one thread.
    extra_compile_args.append("-fopenmp")
    extra_link_args.append("-fopenmp")
if sys.platform == "darwin":
    # csrc/mps is manual reference counting (it also builds against GCC's Objective-C runtime).
    extra_compile_args.append("-fno-objc-arc")
    extra_link_args += ["-framework", "Metal", "-framework", "Foundation"]
    openmp_compile, openmp_link = macos_openmp()
    extra_compile_args += openmp_compile
    extra_link_args += openmp_link

setup(
    # The dependencies (dynamic in pyproject.toml): torch at this build's minor release, and
    # llvmlite, the CPU backend's JIT.
    install_requires=[torch_requirement(), "llvmlite>=0.50"],
    ext_modules=[] if os.environ.get("TORCH_METALLIB_PREBUILT") == "1" else [
        CppExtension(
            name="torch_metallib._C",
            sources=native_sources(),
            include_dirs=[os.path.join(HERE, CSRC)],
            extra_compile_args=extra_compile_args,
            extra_link_args=extra_link_args,
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
    zip_safe=False,
)

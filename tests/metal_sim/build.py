"""Builds the simulated Metal module (tests/metal_sim/build/metal_sim_native*.so): the Metal
backend's Objective-C++ (torch_metallib/csrc/mps, all but torch_mps_stream.mm) compiled
with clang and GCC's Objective-C runtime against the fake Metal headers in include/, plus
the simulation. Rebuilt only when a source or the flags change. Needs clang-14,
libobjc-12-dev and libblocksruntime-dev (.ci/setup installs them).

    python tests/metal_sim/build.py            # build (or reuse) and print the module's path
    python tests/metal_sim/build.py --check    # also -fsyntax-only every csrc/mps file
"""

import concurrent.futures
import fcntl
import hashlib
import os
import pathlib
import subprocess
import sys
import sysconfig

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CSRC = ROOT / "torch_metallib" / "csrc"
BUILD = HERE / "build"
GCC_OBJC = "/usr/lib/gcc/x86_64-linux-gnu/12"
CLANG = "clang++-14"
# The product's Objective-C++ that runs in the simulation; torch_mps_stream.mm needs a
# real MPS build of torch and is only syntax-checked (against torch's MPSStream.h).
PRODUCT = ["metal_library.mm", "command_encoder.mm", "pipeline_archive.mm", "mps_bindings.mm"]
SIMULATION = ["sim_foundation.mm", "sim_metal.mm", "sim_stream.mm", "sim_module.mm", "objc_personality.cpp"]


def _torch_flags():
    import torch
    from torch.utils import cpp_extension

    includes = cpp_extension.include_paths() + [sysconfig.get_paths()["include"], str(CSRC), str(HERE / "include")]
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return ([f"-I{path}" for path in includes] +
            [f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-DTORCH_API_INCLUDE_EXTENSION_H", "-DTORCH_EXTENSION_NAME=metal_sim_native"])


def _objc_flags(source: pathlib.Path):
    language = ["-x", "objective-c++", "-fobjc-runtime=gcc", "-fblocks"] if source.suffix == ".mm" else []
    return language + ["-std=c++20", "-fPIC", "-O1", "-g0", "-Wall", "-Wno-unused-parameter", "-Wno-unused-function",
                       f"-idirafter{GCC_OBJC}/include"]


def _compile(source: pathlib.Path, output: pathlib.Path, flags):
    command = [CLANG, *_objc_flags(source), *flags, "-c", str(source), "-o", str(output)]
    run = subprocess.run(command, capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"compiling {source.name} failed:\n{run.stderr[-6000:]}")


def sources():
    return [CSRC / "mps" / name for name in PRODUCT] + [HERE / name for name in SIMULATION]


def module_path() -> pathlib.Path:
    return BUILD / ("metal_sim_native" + sysconfig.get_config_var("EXT_SUFFIX"))


def build() -> pathlib.Path:
    """The module's path, built if any input changed."""
    flags = _torch_flags()
    inputs = sources() + sorted((HERE / "include").rglob("*.h")) + [HERE / "recorder.h"] + \
        sorted((CSRC / "mps").glob("*.h")) + [CSRC / "dispatch" / "command_list.h", CSRC / "dispatch" / "binding_plan.h"]
    digest = hashlib.sha256(" ".join(flags).encode())
    for path in inputs:
        digest.update(path.read_bytes())
    BUILD.mkdir(exist_ok=True)
    # pytest-xdist's workers each build on first use: one builds, the others wait, then reuse it.
    with open(BUILD / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build(flags, digest.hexdigest())


def _build(flags, digest: str) -> pathlib.Path:
    stamp, target = BUILD / "stamp", module_path()
    if target.exists() and stamp.exists() and stamp.read_text() == digest:
        return target
    objects = [BUILD / (source.name + ".o") for source in sources()]
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        list(pool.map(lambda pair: _compile(*pair, flags), zip(sources(), objects)))
    import torch
    torch_lib = pathlib.Path(torch.__file__).parent / "lib"
    link = [CLANG, "-shared", *map(str, objects), "-o", str(target), f"-L{GCC_OBJC}", "-lobjc", "-lBlocksRuntime",
            f"-L{torch_lib}", "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python", f"-Wl,-rpath,{torch_lib}"]
    run = subprocess.run(link, capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"linking metal_sim_native failed:\n{run.stderr[-6000:]}")
    stamp.write_text(digest)
    return target


def syntax_check():
    """-fsyntax-only of every csrc/mps file: the simulated ones against the fake Metal, and
    torch_mps_stream.mm against torch's own ATen/mps headers as well."""
    flags = _torch_flags()
    for source in sorted((CSRC / "mps").glob("*.mm")):
        command = [CLANG, *_objc_flags(source), *flags, "-fsyntax-only", str(source)]
        run = subprocess.run(command, capture_output=True, text=True)
        if run.returncode != 0:
            raise RuntimeError(f"{source.name} does not compile:\n{run.stderr[-6000:]}")
        print(f"ok  {source.relative_to(ROOT)}")


if __name__ == "__main__":
    print(build())
    if "--check" in sys.argv:
        syntax_check()

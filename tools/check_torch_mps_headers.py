"""Syntax-checks torch_metallib/csrc/mps/torch_mps_stream.mm against the MPS headers of
several torch releases, on Linux, without a Mac.

For each torch minor version it downloads the newest macOS arm64 cp311 wheel of that
release once (into the cache folder), extracts only torch/include/** and torch/version.py,
and runs clang++-14 -fsyntax-only on torch_mps_stream.mm with the same Objective-C++ flags
as tests/metal_sim/build.py's syntax_check, but with that wheel's include paths, the fake
Apple headers in tests/metal_sim/include and the Python include dir. Prints one line per
version: ok (and any warnings), or the first error lines; exits 1 if any version has an
error. Needs clang-14 and libobjc-12-dev (.ci/setup).

    python tools/check_torch_mps_headers.py                      # 2.4 ... 2.15
    python tools/check_torch_mps_headers.py --versions 2.4 2.15 --cache /tmp/wheels

A cached wheel is reused as is: delete it to pick up a newer patch release.
"""

import argparse
import importlib.util
import os
import pathlib
import subprocess
import sys
import sysconfig
import time
import zipfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
SOURCE = ROOT / "torch_metallib" / "csrc" / "mps" / "torch_mps_stream.mm"
VERSIONS = ["2.4", "2.5", "2.6", "2.7", "2.8", "2.9", "2.10", "2.11", "2.12", "2.13", "2.14", "2.15"]
PLATFORMS = ["macosx_14_0_arm64", "macosx_11_0_arm64"]


def _load_build_module():
    """tests/metal_sim/build.py, for its compiler and Objective-C++ flags."""
    spec = importlib.util.spec_from_file_location("metal_sim_build", ROOT / "tests" / "metal_sim" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cached_wheel(version: str, cache: pathlib.Path):
    """The newest cached macOS arm64 cp311 wheel of torch `version` (e.g. "2.4"), or None."""
    wheels = [path for path in cache.glob(f"torch-{version}.*-cp311-*macosx_*_arm64.whl")
              if path.name.split("-")[1].split(".")[:2] == version.split(".")]
    def patch(path):
        return int(path.name.split("-")[1].split(".")[2].split("+")[0])
    return max(wheels, key=patch, default=None)


def download_wheel(version: str, cache: pathlib.Path) -> pathlib.Path:
    """The newest macOS arm64 cp311 wheel of torch `version`, downloaded once into `cache`."""
    wheel = cached_wheel(version, cache)
    if wheel:
        return wheel
    # The local pip config may cap torch: no constraints for this one command.
    environment = dict(os.environ, PIP_CONSTRAINT="/dev/null")
    errors = []
    for platform in PLATFORMS:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--platform", platform,
                   "--python-version", "3.11", f"torch=={version}.*", "-d", str(cache), "--quiet"]
        run = subprocess.run(command, capture_output=True, text=True, env=environment)
        wheel = cached_wheel(version, cache)
        if run.returncode == 0 and wheel:
            return wheel
        errors.append(run.stderr.strip().splitlines()[-1:] or ["no wheel"])
    raise RuntimeError(f"no macOS arm64 cp311 wheel of torch {version}: {errors}")


def extract_headers(wheel: pathlib.Path, cache: pathlib.Path) -> pathlib.Path:
    """torch/include/** and torch/version.py of `wheel`, extracted once; the folder holding torch/."""
    target = cache / wheel.name.removesuffix(".whl")
    done = target / "extracted"
    if not done.exists():
        with zipfile.ZipFile(wheel) as archive:
            names = [name for name in archive.namelist()
                     if name.startswith("torch/include/") or name == "torch/version.py"]
            archive.extractall(target, names)
        done.touch()
    return target


def torch_version(extracted: pathlib.Path) -> str:
    """__version__ from the wheel's torch/version.py."""
    for line in (extracted / "torch" / "version.py").read_text().splitlines():
        if line.startswith("__version__"):
            return line.split("=", 1)[1].strip().strip("'\"")
    return "?"


def syntax_check(extracted: pathlib.Path, build) -> str:
    """clang++ -fsyntax-only on torch_mps_stream.mm: "ok" (then any warnings), or the first error lines."""
    include = extracted / "torch" / "include"
    includes = [include, include / "torch" / "csrc" / "api" / "include", sysconfig.get_paths()["include"],
                build.CSRC, build.HERE / "include"]
    command = [build.CLANG, *build._objc_flags(SOURCE), *[f"-I{path}" for path in includes],
               "-D_GLIBCXX_USE_CXX11_ABI=1", "-DTORCH_API_INCLUDE_EXTENSION_H",
               "-DTORCH_EXTENSION_NAME=metal_sim_native", "-fsyntax-only", str(SOURCE)]
    run = subprocess.run(command, capture_output=True, text=True)
    if run.returncode == 0:
        warnings = [line.replace(str(extracted) + "/", "") for line in run.stderr.splitlines() if "warning:" in line]
        return "\n".join(["ok"] + warnings[:5])
    errors = [line.replace(str(extracted) + "/", "") for line in run.stderr.splitlines() if "error:" in line]
    return "\n".join(errors[:5]) or run.stderr[-2000:]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--versions", nargs="+", default=VERSIONS, help="torch minor versions, e.g. 2.4 2.15")
    parser.add_argument("--cache", type=pathlib.Path, default=pathlib.Path.home() / ".cache/torch_metallib/torch-wheels",
                        help="where wheels and their headers are kept")
    args = parser.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    build = _load_build_module()
    started, failed = time.monotonic(), False
    print(f"{'torch':<8} {'version':<10} {'wheel':<48} result")
    for version in args.versions:
        try:
            wheel = download_wheel(version, args.cache)
            extracted = extract_headers(wheel, args.cache)
            exact, result = torch_version(extracted), syntax_check(extracted, build)
        except RuntimeError as error:
            wheel, exact, result = pathlib.Path("-"), "-", str(error)
        failed |= not result.startswith("ok")
        first, *rest = result.splitlines() or [""]
        print(f"{version:<8} {exact:<10} {wheel.name:<48} {first}")
        for line in rest:
            print(" " * 69 + line)
    print(f"{time.monotonic() - started:.0f} s")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

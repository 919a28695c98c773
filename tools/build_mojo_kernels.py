"""Regenerates tests/fixtures/mojo/*.air from tests/mojo/kernels.mojo with Mojo's compiler.

    python tools/build_mojo_kernels.py [--mojo PATH]

Needs Mojo with MAX's GPU package (``pip install mojo max-core``; the fixtures were made with
mojo 1.2.0 and max-core 26.7.0 on Linux). ``mojo build --emit air --target-accelerator
apple-m1`` writes one ``<output>_<symbol>.air`` per kernel that ``main`` compiles with
``ctx.compile_function[kernel]()``, where ``<symbol>`` is the kernel's function name in its
module; this script saves each as ``<kernel>.air`` (the part of the symbol before its first
``_Pointer``/``_Point`` type suffix, e.g. ``vector_add.air``). Not run by the tests or CI: the
tests read the committed modules.
"""

import argparse
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
SOURCE = ROOT / "tests" / "mojo" / "kernels.mojo"
OUT = ROOT / "tests" / "fixtures" / "mojo"


def kernel_name(air_file: pathlib.Path) -> str:
    """The Mojo kernel's name from an emitted file ``kernels_kernels_<name>_Point..._<hash>.air``."""
    found = re.match(r"kernels_kernels_(\w+?)_Point", air_file.name)
    if found is None:
        raise SystemExit(f"unexpected output file name {air_file.name}; expected kernels_kernels_<name>_Point...air")
    return found.group(1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mojo", default=shutil.which("mojo") or "mojo", help="the mojo executable")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        subprocess.run([args.mojo, "build", "--emit", "air", "--target-accelerator", "apple-m1", str(SOURCE),
                        "-o", str(pathlib.Path(work) / "kernels")], check=True)
        made = sorted(pathlib.Path(work).glob("*.air"))
        if not made:
            raise SystemExit("mojo wrote no .air files")
        OUT.mkdir(parents=True, exist_ok=True)
        for old in OUT.glob("*.air"):
            old.unlink()
        for air_file in made:
            target = OUT / f"{kernel_name(air_file)}.air"
            shutil.copyfile(air_file, target)
            print(f"{target.relative_to(ROOT)}: {target.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Runs `python -m torch_metallib lint`'s rules over the Apple-built libraries (MLX, both of
torch's, the public corpus) and prints a count per rule; any finding there is a rule to
correct, since Apple's files load on a Mac.

    python tools/lint_corpus.py [--every N] [FILE.metallib ...]

--every N lints every Nth function of each library (default 1: all of them).
"""

import argparse
import collections
import glob
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch_metallib as tm  # noqa: E402
from torch_metallib.lint.run import lint_bitcode  # noqa: E402

_CACHE = os.path.expanduser("~/.cache/torch_metallib")


def apple_built() -> list:
    return ([os.path.join(_CACHE, "corpus/mlx-metal-0.32.4/mlx.metallib")]
            + sorted(glob.glob(os.path.join(_CACHE, "corpus/torch-2.13.0/*.metallib")))
            + sorted(glob.glob(os.path.join(_CACHE, "public-corpus/*.metallib"))))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*")
    parser.add_argument("--every", type=int, default=1)
    args = parser.parse_args(argv)
    files = [f for f in (args.files or apple_built()) if os.path.exists(f)]
    counts, examples, functions = collections.Counter(), {}, 0
    start = time.perf_counter()
    for path in files:
        library = tm.load(path)
        names = library.function_names[::args.every]
        for name in names:
            for finding in lint_bitcode(bytes(getattr(library, name).bitcode), f"{os.path.basename(path)}:{name}"):
                counts[finding.rule] += 1
                examples.setdefault(finding.rule, f"{finding.where}: {finding.message}")
        functions += len(names)
        print(f"{os.path.basename(path)}: {len(names)} functions", flush=True)
    seconds = time.perf_counter() - start
    print(f"{functions} functions of {len(files)} libraries in {seconds:.1f} s "
          f"({functions / max(seconds, 1e-9):.0f}/s); findings: {sum(counts.values())}")
    for rule, count in sorted(counts.items()):
        print(f"  {rule}: {count}, e.g. {examples[rule][:300]}")
    return 1 if counts else 0


if __name__ == "__main__":
    sys.exit(main())

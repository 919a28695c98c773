"""Mutation fuzzing of ahead-of-time archives (torch_metallib/cache/archive.py), each case
in a forked worker, with tools/fuzz_metallib.py's mutations and runner.

    python tools/fuzz_archive.py --cases 100000 --jobs 2 --out findings/ SEED.tmar...

Each case mutates one seed archive and must then either be refused with
ArchiveFormatError, or load and answer every lookup, also through ``tm.load(...,
archives=)``, its cubins checked as the CUDA backend checks them before the driver. A
crash, a hang or any other exception is a finding, reported with its case and written to
--out as a reproducer.
"""

import argparse
import os
import pathlib
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fuzz_metallib  # noqa: E402  (the mutations and the forked runner)

import torch_metallib as tm  # noqa: E402
from torch_metallib.backends.cuda.archived import cubin_problem  # noqa: E402
from torch_metallib.cache.archive import read_archive  # noqa: E402

_library = []  # bytes of a small valid metallib, for tm.load(..., archives=)


def exercise(data: bytes) -> str:
    """"rejected" (ArchiveFormatError) or "loaded"; anything else raised is a finding."""
    try:
        archive = read_archive(data)
    except tm.ArchiveFormatError:
        return "rejected"
    repr(archive)
    for key, entry in archive.entries.items():
        found = archive.lookup(*key)
        assert found is not None and len(found[1]) == entry.size, key
        if entry.form.startswith("cubin"):  # what the CUDA backend checks before the driver sees it
            problem = cubin_problem(found[1])
            assert problem is None or isinstance(problem, str), key
    if _library:
        tm.load(_library[0], archives=[data])
    return "loaded"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("inputs", nargs="+", help="valid archives to mutate")
    parser.add_argument("--library", help="a .metallib to load with each mutated archive")
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--cases", type=int, default=10000)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", default="fuzz-findings", help="folder for reproducer files")
    parser.add_argument("--case-timeout", type=float, default=30.0)
    args = parser.parse_args(argv)
    inputs = [pathlib.Path(path).read_bytes() for path in args.inputs]
    for data in inputs:
        read_archive(data)  # seeds must be valid
    if args.library:
        _library.append(pathlib.Path(args.library).read_bytes())
    report = fuzz_metallib.fuzz(inputs, args.seed, args.cases, min(args.jobs, args.cases), False, args.out,
                                args.case_timeout, 0, use=exercise)
    for finding in (report.crashes + report.hangs + report.foreign)[:50]:
        print(finding)
    print(report.summary())
    return 1 if report.crashes or report.hangs or report.foreign else 0


if __name__ == "__main__":
    sys.exit(main())

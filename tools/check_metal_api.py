"""Checks, without a Mac, that every Metal and Foundation method, enum constant, C function
and struct the Metal backend's Objective-C++ (torch_metallib/csrc/mps) uses is Apple's,
with Apple's types, by PyObjC's record of Apple's SDK (pyobjc-framework-Metal and -Cocoa,
MIT; fetched once with pip into the corpus cache; docs/metal_api.md says how it works).

    python tools/check_metal_api.py            # a table of every method checked; exit 1 on a finding
    python tools/check_metal_api.py --json F   # also the table as JSON

What is compared: the method each send in csrc/mps resolves to in the simulated headers
(tests/metal_sim/include; the types the code was compiled with), and everything the
simulated Metal.h declares, against Apple's protocol tables (exact encodings) or PyObjC's
metadata (types as far as recorded); Metal.h's enum values, C functions and structs.
Needs clang-14 and libobjc-12-dev (.ci/setup), as tests/metal_sim does.
"""

import argparse
import concurrent.futures
import importlib.util
import json
import pathlib
import sys
import time
from dataclasses import asdict
from typing import List, Optional

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tools"), str(ROOT)]  # metal_api; torch_metallib (the corpus cache) in a checkout

from metal_api import compare, declarations, pyobjc, uses  # noqa: E402

INCLUDE = ROOT / "tests" / "metal_sim" / "include"
SOURCES = sorted((ROOT / "torch_metallib" / "csrc" / "mps").glob("*.mm"))


def _build_module():
    """tests/metal_sim/build.py, for its compiler and flags."""
    spec = importlib.util.spec_from_file_location("metal_sim_build", ROOT / "tests" / "metal_sim" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _allowed_outside(line: str) -> bool:
    return line.startswith("using ") or (line.startswith("namespace ") and "=" in line)


def check(sources: Optional[List[pathlib.Path]] = None, include: pathlib.Path = INCLUDE,
          record: Optional[pyobjc.ApiRecord] = None) -> compare.Report:
    """The report for `sources` (None: every csrc/mps/*.mm) compiled against `include`."""
    build = _build_module()
    sources = SOURCES if sources is None else sources
    flags = build._objc_flags(pathlib.Path("x.mm")) + [
        flag for flag in build._torch_flags() if flag != f"-I{build.HERE / 'include'}"] + [f"-I{include}"]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        found = list(pool.map(lambda source: uses.read_uses(source, build.CLANG, flags), sources))
    declared = declarations.read_declarations(include, build.CLANG, build._objc_flags(pathlib.Path("x.mm")))
    report = compare.compare([use for each in found for use in each], declared, record or pyobjc.load(),
                             str(include / "Metal" / "Metal.h"))
    for source in sources:
        for line in uses.outside_namespace(source.read_text()):
            if not _allowed_outside(line):
                report.findings.append(f"{source.name}: code outside namespace torch_metallib is not checked: {line}")
    return report


def print_report(report: compare.Report) -> None:
    print(f"{'method':<70} {'ours':<12} {'Apple':<12} {'by':<15} used at")
    for item in report.checks:
        used = ", ".join(item.used_at[:3]) + (" ..." if len(item.used_at) > 3 else "") or "(declared in Metal.h)"
        print(f"{item.method:<70} {item.ours:<12} {item.apple or '-':<12} {item.source:<15} {used}")
    print("; ".join(f"{name}: {count}" for name, count in report.counts.items()))
    for finding in report.findings:
        print(f"FINDING: {finding}")
    print("ok: csrc/mps uses Apple's Metal and Foundation API as PyObjC records it" if report.ok else
          f"{len(report.findings)} finding(s)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", metavar="FILE", help="also write the checks and findings as JSON")
    args = parser.parse_args(argv)
    started = time.monotonic()
    report = check()
    print_report(report)
    print(f"{time.monotonic() - started:.0f} s")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(
            {"checks": [asdict(c) for c in report.checks], "findings": report.findings, "counts": report.counts},
            indent=2))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())

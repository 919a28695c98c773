"""``python -m tools.torch_conformance``: PyTorch's Metal kernels against torch, per family."""

import argparse
import collections
import json
import os
import random
import re
import sys

from .families import OUTCOMES, family
from .workers import run_kernels

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def table(outcomes) -> str:
    """Markdown: one row per family, then totals."""
    counts = collections.defaultdict(collections.Counter)
    for o in outcomes:
        counts[family(o["kernel"])][o["outcome"]] += 1
    header = "| family | kernels | " + " | ".join(OUTCOMES) + " |"
    rows = [header, "|" + " --- |" * (len(OUTCOMES) + 2)]
    total = collections.Counter()
    for name in sorted(counts):
        c = counts[name]
        total.update(c)
        rows.append(f"| {name} | {sum(c.values())} | " + " | ".join(str(c[k]) for k in OUTCOMES) + " |")
    rows.append(f"| **total** | {sum(total.values())} | " + " | ".join(str(total[k]) for k in OUTCOMES) + " |")
    attempted = sum(total.values()) - total["not attempted"] - total["harness error"]
    rows.append("")
    rows.append(f"attempted: {attempted} of {sum(total.values())} "
                f"({100.0 * attempted / max(1, sum(total.values())):.1f}%)")
    return "\n".join(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.torch_conformance", description=__doc__)
    parser.add_argument("--library", choices=["macos14", "macos26"], default="macos14",
                        help="which of torch's two metallibs (default: macos14)")
    parser.add_argument("--path", help="a .metallib to use instead (a subset of one, made with Library.subset)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--filter", default="", help="only kernels whose name matches this regex")
    parser.add_argument("--sample", type=int, default=0, help="a seeded random sample of this many kernels")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per kernel before it counts as a hang")
    parser.add_argument("--time-limit", type=float, default=0,
                        help="start no kernel after this many seconds (the rest: not attempted)")
    parser.add_argument("--json", help="write every outcome here")
    parser.add_argument("--update", action="store_true",
                        help="with --json: replace only this run's kernels in that file's outcomes, "
                             "and print the table of the whole file")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)

    import torch_metallib as tm
    from torch_metallib.cache.torch_corpus import torch_metallib_paths

    path = args.path or torch_metallib_paths()[args.library]
    names = [n for n in tm.load(path).function_names if re.search(args.filter, n)]
    if args.sample and args.sample < len(names):
        names = sorted(random.Random(0).sample(names, args.sample), key=names.index)

    def progress(outcome):
        if not args.quiet and outcome["outcome"] not in ("correct", "not attempted"):
            print(f"{outcome['outcome']:>13} {outcome['kernel']}: {outcome['detail'][:300]}", file=sys.stderr)

    outcomes = run_kernels(path, names, args.device, args.workers, args.timeout, ROOT, progress, args.time_limit)
    order = {name: i for i, name in enumerate(names)}
    outcomes.sort(key=lambda o: order[o["kernel"]])
    if args.update and args.json and os.path.exists(args.json):
        with open(args.json) as previous:
            kept = [o for o in json.load(previous)["outcomes"] if o["kernel"] not in order]
        outcomes = kept + outcomes
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"library": args.path or args.library, "device": args.device, "outcomes": outcomes}, out, indent=0)
    print(table(outcomes))
    return 0


if __name__ == "__main__":
    sys.exit(main())

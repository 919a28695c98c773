"""``python -m tools.torch_conformance.report [LABEL=]RUN.json ...``: one markdown table of several
runs (a library on a device each), a row per family, then the totals and the share attempted."""

import collections
import json
import sys

from .families import OUTCOMES, family

_SHORT = {"correct": "ok", "wrong": "wrong", "refused": "refused", "crash": "crash", "hang": "hang",
          "not attempted": "n/a", "harness error": "harness"}


def _cell(counter: collections.Counter) -> str:
    """'ok/total', followed by any other outcome that occurred."""
    total = sum(counter.values())
    if not total:
        return ""
    extra = [f"{counter[o]} {_SHORT[o]}" for o in OUTCOMES[1:] if counter[o]]
    return f"{counter['correct']}/{total}" + (f" ({', '.join(extra)})" if extra else "")


def combined_table(runs) -> str:
    """runs: [(label, outcomes)] -> markdown."""
    per_run = []
    for _, outcomes in runs:
        counts = collections.defaultdict(collections.Counter)
        for o in outcomes:
            counts[family(o["kernel"])][o["outcome"]] += 1
        per_run.append(counts)
    families = sorted(set().union(*per_run))
    lines = ["| family | " + " | ".join(label for label, _ in runs) + " |",
             "| --- |" + " --- |" * len(runs)]
    for name in families:
        lines.append(f"| {name} | " + " | ".join(_cell(counts.get(name, collections.Counter()))
                                                 for counts in per_run) + " |")
    totals = [sum(counts.values(), collections.Counter()) for counts in per_run]
    lines.append("| **total** | " + " | ".join(f"**{_cell(t)}**" for t in totals) + " |")
    shares = []
    for t in totals:
        attempted = sum(t.values()) - t["not attempted"] - t["harness error"]
        shares.append(f"{attempted:,} of {sum(t.values()):,} ({100.0 * attempted / max(1, sum(t.values())):.1f}%)")
    lines.append("| attempted | " + " | ".join(shares) + " |")
    return "\n".join(lines)


def main(paths) -> int:
    runs = []
    for argument in paths:
        label, _, path = argument.rpartition("=")
        with open(path) as file:
            record = json.load(file)
        runs.append((label or f"{record['library']} ({record['device']})", record["outcomes"]))
    print(combined_table(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

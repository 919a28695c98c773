"""Timing shared by the benchmarks: every candidate is measured in the same run as its
baseline, alternating which goes first, with the garbage collector off (as in timeit), and
reported as medians; fresh-process benchmarks run their children and report through the
same helpers."""

import gc
import json
import re
import statistics
import subprocess
import sys
import time

__all__ = ["interleaved", "fresh_process", "medians", "report"]


def interleaved(runs: dict, repeat: int, number: int = 1) -> dict:
    """Median milliseconds per call of each callable in `runs`: `repeat` rounds, each
    timing a batch of `number` calls of every callable in turn (order reversed every
    other round), after one untimed warm-up call of each; also the minimum of each."""
    for run in runs.values():
        run()
    samples = {name: [] for name in runs}
    names = list(runs)
    gc.disable()
    try:
        for i in range(repeat):
            for name in (names if i % 2 == 0 else names[::-1]):
                run = runs[name]
                start = time.perf_counter_ns()
                for _ in range(number):
                    run()
                samples[name].append((time.perf_counter_ns() - start) / 1e6 / number)
    finally:
        gc.enable()
    return {"median_ms": {name: statistics.median(values) for name, values in samples.items()},
            "min_ms": {name: min(values) for name, values in samples.items()},
            "samples_ms": samples}


def fresh_process(code: str, source: str, env: dict, *argv: str) -> dict:
    """The JSON the last line of ``python -c source argv...`` prints, run in checkout `code`
    (``python -c`` puts the working folder first on sys.path, so it imports that checkout)."""
    result = subprocess.run([sys.executable, "-c", source, *argv], capture_output=True, text=True, env=env,
                            timeout=600, cwd=code)
    if result.returncode != 0:
        raise SystemExit(result.stderr[-3000:])
    return json.loads(result.stdout.strip().splitlines()[-1])


def medians(samples: list, keys, scale: float = 1e3) -> dict:
    """The median of each of `keys` over `samples` (dicts, one per process), times `scale`
    (seconds to milliseconds by default)."""
    return {key: statistics.median(sample[key] for sample in samples) * scale for key in keys}


def report(title: str, columns: list, figures: dict, line, json_path=None) -> None:
    """Print `figures` (a tuple of names -> that entry's figures) as a table under `title`
    (if any): one column per (heading, format spec) in `columns`, numeric ones right-aligned,
    one line per entry holding ``line(names, figures)``; and write `figures` to `json_path`
    if given, keyed by the names joined with " | "."""
    header = " ".join(f"{heading:{'>' if spec[-1] in 'df' else '<'}{re.match(r'[0-9]*', spec).group()}}"
                      for heading, spec in columns)
    print("\n" + "\n".join(filter(None, (title, header))))
    for names, entry in figures.items():
        print(" ".join(f"{value:{spec}}" for value, (_, spec) in zip(line(names, entry), columns)))
    if json_path:
        with open(json_path, "w") as file:
            json.dump({" | ".join(names): entry for names, entry in figures.items()}, file, indent=1)

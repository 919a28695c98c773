"""Interleaved timing shared by the benchmarks: every candidate is measured in the same
run as its baseline, alternating which goes first, with the garbage collector off (as in
timeit), and reported as medians."""

import gc
import statistics
import time

__all__ = ["interleaved"]


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

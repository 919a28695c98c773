"""How fast torch_metallib loads a large Apple-built .metallib, and how little memory it uses.

Usage: python benchmarks/load.py [--repeat N] [--json OUT]

The workload is the reference corpus ``mlx.metallib`` (146,876,416 bytes, 17,248 kernels,
downloaded once into a cache). Loading it is what every user of a big kernel library pays
on import, so it is measured against the figure a user would otherwise get: a plain
pure-Python parse of the same function list.

Timed (each: warm-ups discarded, then N repeats; median, p10 and p90 in ms):

* ``load(data)`` from ``bytes`` already in memory (the file is read once, before timing);
* ``load(path)``, which memory-maps the file;
* ``lib.function_names`` and ``lib["vv_Addfloat32"]``, each the first access on a fresh
  library (the costs that are deferred past ``load``);
* the baseline: ``parse_function_list`` below, reading the header and walking every
  function-list group into a dict of name -> fields. It checks nothing and skips the
  metadata sections, so it does less work than ``load``; the speed-up is conservative.

Every repeat builds a fresh Library; the previous one is deleted outside the timed region,
so destruction is not timed. As in ``timeit``, the garbage collector is off while a call is
timed.

Memory: in fresh subprocesses, the growth of VmRSS across ``load(path)`` plus reading
``function_names`` and one kernel's ``bitcode`` (the mapping should stay mostly untouched),
and for contrast the same for ``load(open(path, 'rb').read())``. MB means 10**6 bytes.

Targets (reported as met/missed; the script never fails on them): load <= 3 ms median,
>= 15x faster than the baseline, < 10 MB RSS growth when loading from a path.
"""

import argparse
import gc
import json
import operator
import statistics
import struct
import subprocess
import sys
import time

import torch_metallib
from torch_metallib.cli.corpus import mlx_metallib_path

WARMUP = 3
RSS_RUNS = 5
KERNEL = "vv_Addfloat32"
MB = 10**6

LOAD_TARGET_MS = 3.0
SPEEDUP_TARGET = 15.0
RSS_TARGET_MB = 10.0

# --- the pure-Python baseline -----------------------------------------------------------

# Magic, format version (3 x u16), file type, platform, platform version (u16, u8, u8),
# file size, then (offset, size) of the function list, public metadata, private metadata
# and modules: 88 bytes.
HEADER = struct.Struct("<4sHHHBBHBB9Q")
TAG = struct.Struct("<4sH")  # tag code and u16 payload length
U32 = struct.Struct("<I")
U64 = struct.Struct("<Q")
OFFSETS = struct.Struct("<3Q")
VERSIONS = struct.Struct("<4H")


def parse_function_list(data: bytes) -> dict:
    """Name -> {type, hash, offsets, module_size, versions} for every function in `data`."""
    header = HEADER.unpack_from(data, 0)
    magic, list_offset = header[0], header[10]
    if magic != b"MTLB":
        raise ValueError(f"not a .metallib: magic {magic!r}")
    (count,) = U32.unpack_from(data, list_offset)
    functions = {}
    group = list_offset + 4
    for _ in range(count):
        (group_size,) = U32.unpack_from(data, group)
        fields = {}
        at = group + 4
        # ENDT has no length; the two bytes read after it are ignored.
        code, length = TAG.unpack_from(data, at)
        while code != b"ENDT":
            payload = at + 6
            if code == b"NAME":
                name = data[payload : payload + length - 1].decode()
            elif code == b"TYPE":
                fields["type"] = data[payload]
            elif code == b"HASH":
                fields["hash"] = data[payload : payload + 32]
            elif code == b"OFFT":
                fields["offsets"] = OFFSETS.unpack_from(data, payload)
            elif code == b"MDSZ":
                fields["module_size"] = U64.unpack_from(data, payload)[0]
            elif code == b"VERS":
                fields["versions"] = VERSIONS.unpack_from(data, payload)
            at = payload + length
            code, length = TAG.unpack_from(data, at)
        functions[name] = fields
        group += group_size
    return functions


def check_baseline(data: bytes, lib) -> None:
    """The baseline finds the same functions, in the same order, with the same fields."""
    parsed = parse_function_list(data)
    assert tuple(parsed) == lib.function_names, "baseline and load disagree on the names"
    kernel, fields = lib[KERNEL], parsed[KERNEL]
    assert fields["hash"].hex() == kernel.hash
    assert fields["module_size"] == kernel.module_size
    assert fields["versions"] == kernel.air_version + kernel.language_version


# --- timing ---------------------------------------------------------------------------


def timed(function, *args):
    """``(elapsed ms, result)`` of one call, with the garbage collector off."""
    gc.disable()
    try:
        start = time.perf_counter_ns()
        result = function(*args)
        elapsed = time.perf_counter_ns() - start
    finally:
        gc.enable()
    return elapsed / 1e6, result


def sample(trial, repeat: int) -> list:
    """`repeat` results of `trial()` (elapsed ms) after `WARMUP` discarded ones."""
    for _ in range(WARMUP):
        trial()
    return [trial() for _ in range(repeat)]


def summary(values: list) -> dict:
    deciles = statistics.quantiles(values, n=10, method="inclusive")
    return {"median": statistics.median(values), "p10": deciles[0], "p90": deciles[-1],
            "samples": values}


def load_trial(src):
    def trial():
        elapsed, lib = timed(torch_metallib.load, src)
        del lib
        return elapsed
    return trial


def first_access_trial(path, access, *args):
    """Times `access(lib, *args)` on a library freshly loaded (untimed) from `path`."""
    def trial():
        lib = torch_metallib.load(path)
        elapsed, _ = timed(access, lib, *args)
        del lib
        return elapsed
    return trial


def baseline_trial(data):
    def trial():
        elapsed, functions = timed(parse_function_list, data)
        del functions
        return elapsed
    return trial


def time_everything(path: str, data: bytes, repeat: int) -> dict:
    trials = {
        "load(bytes)": load_trial(data),
        "load(path)": load_trial(path),
        "lib.function_names (first)": first_access_trial(
            path, operator.attrgetter("function_names")),
        f'lib["{KERNEL}"] (first)': first_access_trial(path, operator.getitem, KERNEL),
        "python baseline parse": baseline_trial(data),
    }
    return {label: summary(sample(trial, repeat)) for label, trial in trials.items()}


# --- memory ---------------------------------------------------------------------------

RSS_PROBE = """
import sys
import torch_metallib

def rss():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024

path, source, kernel = sys.argv[1:]
before = rss()
lib = torch_metallib.load(path if source == "path" else open(path, "rb").read())
lib.function_names
lib[kernel].bitcode
print(rss() - before)
"""


def rss_growth_mb(path: str, source: str) -> list:
    """VmRSS growth (MB) of a load from `source` ("path" or "bytes"), in fresh processes."""
    runs = []
    for _ in range(RSS_RUNS):
        result = subprocess.run([sys.executable, "-c", RSS_PROBE, path, source, KERNEL],
                                capture_output=True, text=True, check=True)
        runs.append(int(result.stdout) / MB)
    return runs


def measure_memory(path: str) -> dict:
    return {
        source: {"median": statistics.median(runs), "runs": runs}
        for source, runs in (("path", rss_growth_mb(path, "path")),
                             ("bytes", rss_growth_mb(path, "bytes")))
    }


# --- report ---------------------------------------------------------------------------


def verdict(met: bool) -> str:
    return "met" if met else "missed"


def evaluate(timings: dict, memory: dict) -> tuple:
    """The speed-up ratios and each target's value and verdict."""
    baseline = timings["python baseline parse"]["median"]
    ratios = {source: baseline / timings[f"load({source})"]["median"]
              for source in ("bytes", "path")}
    targets = {}
    for source in ("bytes", "path"):
        median = timings[f"load({source})"]["median"]
        targets[f"load({source}) median <= {LOAD_TARGET_MS:g} ms"] = {
            "value": median, "met": median <= LOAD_TARGET_MS}
        targets[f"baseline / load({source}) >= {SPEEDUP_TARGET:g}x"] = {
            "value": ratios[source], "met": ratios[source] >= SPEEDUP_TARGET}
    growth = memory["path"]["median"]
    targets[f"RSS growth from a path < {RSS_TARGET_MB:g} MB"] = {
        "value": growth, "met": growth < RSS_TARGET_MB}
    return ratios, targets


def print_report(header: dict, timings: dict, memory: dict, ratios: dict,
                 targets: dict) -> None:
    print(f"{header['file']}: {header['bytes']:,} bytes, {header['functions']:,} functions")
    print(f"{header['repeat']} repeats after {WARMUP} warm-ups, in ms\n")
    print(f"{'':34} {'median':>9} {'p10':>9} {'p90':>9}")
    for label, stats in timings.items():
        print(f"{label:34} {stats['median']:9.3f} {stats['p10']:9.3f} {stats['p90']:9.3f}")
    print()
    for source, ratio in ratios.items():
        print(f"{'baseline / load(' + source + ')':34} {ratio:8.1f}x")
    print()
    print(f"RSS growth, median of {RSS_RUNS} fresh processes "
          f"(load, function_names, one kernel's bitcode):")
    for source, call in (("path", "load(path)"), ("bytes", "load(open(path).read())")):
        runs = ", ".join(f"{run:.1f}" for run in memory[source]["runs"])
        print(f"  {call:32} {memory[source]['median']:8.1f} MB   ({runs})")
    print("\ntargets:")
    for name, target in targets.items():
        print(f"  {name:34} {target['value']:8.2f}   {verdict(target['met'])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=30, help="timed repeats (default 30)")
    parser.add_argument("--json", metavar="OUT", help="also write all numbers to OUT")
    args = parser.parse_args()
    if args.repeat < 2:
        parser.error("--repeat must be at least 2 (for the percentiles)")

    path = mlx_metallib_path()
    with open(path, "rb") as file:
        data = file.read()
    lib = torch_metallib.load(data)
    check_baseline(data, lib)
    header = {"file": path, "bytes": len(data), "functions": len(lib), "repeat": args.repeat,
              "warmup": WARMUP}
    del lib

    timings = time_everything(path, data, args.repeat)
    memory = measure_memory(path)
    ratios, targets = evaluate(timings, memory)
    print_report(header, timings, memory, ratios, targets)
    if args.json:
        with open(args.json, "w") as out:
            json.dump({**header, "timings_ms": timings, "speedup_over_baseline": ratios,
                       "rss_growth_mb": memory, "targets": targets}, out, indent=2)


if __name__ == "__main__":
    main()

"""PyTorch's own Metal kernels (the two libraries in torch 2.13's macOS wheel) against torch's
CPU ops: a slice of every elementwise op, every reduction shape and every scan scheme, in
both libraries, through the conformance runner's child processes (tools/torch_conformance). The whole run is
`python -m tools.torch_conformance`; docs/conformance.md has its tables."""

import os
import re
import sys

import pytest

import torch_metallib as tm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from tools.torch_conformance import elementwise, reductions, scans  # noqa: E402
from tools.torch_conformance.workers import run_kernels  # noqa: E402

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture(scope="module")
def torch_libraries():
    from torch_metallib.cli.torch_corpus import torch_metallib_paths
    try:
        return torch_metallib_paths()
    except Exception as error:  # noqa: BLE001 - any fetch failure
        if IN_CI:
            pytest.fail(f"torch's metallibs are required in CI and could not be fetched: {error}")
        pytest.skip(f"torch's metallibs unavailable: {error}")


def conformance_slice(names):
    """Every variant of add, mul_alpha-style and sin kernels (all dtypes), one float kernel of
    every other elementwise op, every complex sin (Metal's sincos), and every sum-shaped
    reduction with a 64-bit accumulator plus one of each other reduction, and every 64-bit
    scan (long, int_long) plus the first kernel of each other scan scheme."""
    chosen, seen_ops, seen_reductions, seen_scans = [], set(), set(), set()
    for name in names:
        parsed = elementwise.parse(name)
        if parsed is not None:
            if parsed.op in ("add", "add_alpha", "sin", "relu", "eq", "div_floor") or \
                    (parsed.op not in seen_ops and parsed.dtypes[-1].is_floating_point):
                chosen.append(name)
                seen_ops.add(parsed.op)
            continue
        reduction = reductions.parse(name)
        if reduction is not None:
            op, shape, _, to = reduction
            if re.search(r"_long$", name) or (op, shape) not in seen_reductions:
                chosen.append(name)
                seen_reductions.add((op, shape))
            continue
        scan = scans.parse(name)
        if scan is not None:
            if name.endswith("_long") or (scan.op, scan.scheme) not in seen_scans:
                chosen.append(name)
                seen_scans.add((scan.op, scan.scheme))
    return chosen


@pytest.mark.parametrize("library", ["macos14", "macos26"])
def test_torch_kernels_match_torch(torch_libraries, library):
    path = torch_libraries[library]
    names = conformance_slice(tm.load(path).function_names)
    assert len(names) > 500
    outcomes = run_kernels(path, names, "cpu", workers=2, timeout=120, root=ROOT)
    assert len(outcomes) == len(names)
    bad = [f"{o['outcome']}: {o['kernel']}: {o['detail'][:300]}" for o in outcomes
           if o["outcome"] not in ("correct",)]
    assert not bad, f"{len(bad)} of {len(names)} kernels:\n" + "\n".join(bad[:40])


def test_64_bit_threadgroup_sums(torch_libraries):
    """PyTorch's 64-bit simd_sum shuffles with simd_shuffle_and_fill_down over a partly
    active SIMD-group (8 partial sums of a 256-thread threadgroup); lanes that did not take
    part must read as zero, as on Apple GPUs, not as another call's leftover values."""
    library = tm.load(torch_libraries["macos14"])
    for name in ("sum_reduction_int_long", "sum_reduction_bool_long", "max_reduction_long_long",
                 "min_reduction_long_long"):
        assert reductions.check(library[name], "cpu") == ("correct", ""), name

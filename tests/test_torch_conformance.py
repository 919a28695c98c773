"""PyTorch's own Metal kernels (the two libraries in torch 2.13's macOS wheel) against torch's
CPU ops: a slice of every elementwise op and every reduction shape, in both libraries,
through the conformance runner's child processes (tools/torch_conformance). The whole run is
`python -m tools.torch_conformance`; docs/conformance.md has its tables."""

import os
import re
import sys

import pytest
import torch

import torch_metallib as tm
from _parallel import cores

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from tools.torch_conformance import elementwise, families, reductions, scans  # noqa: E402
from tools.torch_conformance.workers import run_kernels  # noqa: E402

HARNESSES = families.HARNESSES


def conformance_slice(names):
    """Every variant of add, sin (complex sin: Metal's sincos) and div_floor in every dtype,
    one float kernel of every other elementwise op, every reduction, scan and
    scatter_amin/amax with a 64-bit result, and the first kernel of every other family a
    harness calls."""
    chosen, seen = [], set()
    for name in names:
        parsed = elementwise.parse(name)
        if parsed is not None:
            if parsed.op in ("add", "sin", "div_floor") or \
                    (parsed.op not in seen and parsed.dtypes[-1].is_floating_point):
                chosen.append(name)
                seen.add(parsed.op)
            continue
        harnessed = any(h.parse(name) for h in HARNESSES)
        family = families.family(name)
        # 64-bit results: sums over partial SIMD-groups, atomic min/max declared void.
        wide = ((reductions.parse(name) or scans.parse(name)) and name.endswith("_long")) \
            or re.match(r"scatter_am(in|ax)_.*_long_long$", name)
        if harnessed and (family not in seen or wide):
            chosen.append(name)
            seen.add(family)
    return chosen


@pytest.mark.slow
@pytest.mark.parametrize("library", ["macos14", "macos26"])
def test_torch_kernels_match_torch(torch_libraries, library):
    path = torch_libraries[library]
    names = conformance_slice(tm.load(path).function_names)
    assert len(names) > 400
    outcomes = run_kernels(path, names, "cpu", workers=cores(), timeout=120, root=ROOT)
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


def test_bfloat_pointers_in_an_argument_buffer(torch_libraries):
    """PyTorch's multi-tensor AMP unscale takes an argument buffer of 32 data pointers; Apple's
    compiler marks the bfloat one's member `air.indirect_buffer`, the float and half ones'
    `air.buffer`: all three are plain device pointers, bound alike."""
    from tools.torch_conformance import amp
    library = tm.load(torch_libraries["macos14"])
    for dtype in ("float", "half", "bfloat"):
        name = f"ampNonFiniteCheckAndUnscale_{dtype}"
        assert amp.check(library[name], "cpu") == ("correct", ""), name


# Kernels the CUDA backend once got wrong or refused: a prefix sum after a loop lanes leave at
# different trips (radix_scan, radix_count_scan), a sort launched with 1,024 threads, products
# accumulated by compare-and-swap (either sign of zero), half gradients added atomically.
CUDA_REGRESSIONS = ["radix_scan", "radix_count_scan_float_8bit_mb4", "radix_count_scan_char_4bit_mb4",
                    "radix_scatter_float_8bit", "sort_block_float_tptg1024", "sort_block_half_tptg1024_stable",
                    "scatter_prod_dense_float_int", "index_reduce_prod_float_long",
                    "grid_sampler_2d_backward_bicubic_input_border_i32_half"]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA backend needs an NVIDIA GPU")
def test_torch_kernels_match_torch_on_cuda(torch_libraries):
    path = torch_libraries["macos14"]
    outcomes = run_kernels(path, CUDA_REGRESSIONS, "cuda", workers=cores(), timeout=300, root=ROOT)
    bad = [f"{o['outcome']}: {o['kernel']}: {o['detail'][:300]}" for o in outcomes if o["outcome"] != "correct"]
    assert len(outcomes) == len(CUDA_REGRESSIONS) and not bad, "\n".join(bad)

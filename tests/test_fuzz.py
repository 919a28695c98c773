"""A slice of tools/fuzz_metallib.py in CI: mutated metallibs from several toolchains never
crash, hang or raise anything but the project's errors.

The fuzzer runs as a child process (it forks its own workers), so a crash is a reported
finding, never a dead test run. TORCH_METALLIB_FUZZ_CASES / _SEED change the slice.
"""

import os
import pathlib
import subprocess
import sys

import pytest

import torch_metallib as tm
from _parallel import cores
from _public_corpus import subset_files

ROOT = pathlib.Path(__file__).resolve().parent.parent
FUZZ_CASES = int(os.environ.get("TORCH_METALLIB_FUZZ_CASES", "20000"))
FUZZ_SEED = int(os.environ.get("TORCH_METALLIB_FUZZ_SEED", "1337"))
# Kernels of different families and sizes (elementwise, arange, copy, softmax, norm, GEMM,
# GEMV, convolution, attention, quantized, FFT, sort, scan, reduction): ~300 KB; names
# missing from a corpus version are skipped.
APPLE_KERNELS = (
    "vv_Addfloat32", "arangefloat32", "gg1_copybool_bool_", "block_softmax_float32", "rmsfloat32",
    "steel_gemm_fused_nn_float32_float32_bm64_bn64_bk16_wm2_wn2",
    "gemv_float32_bm1_bn8_sm1_sn32_tm4_tn4_nc0_axpby0",
    "implicit_gemm_conv_2d_general_float32_bm64_bn64_bk16_wm2_wn2",
    "steel_attention_float16_bq32_bk16_bd256_bv256_wm4_wn2_maskbool_",
    "sdpa_vector_float_64_64", "affine_qmv_float_gs_128_b_1_batch_1_pr_0_hgs_0_r_4",
    "bluestein_fft_mem_4096_float2_float2", "rader_fft_mem_512_float2_float2",
    "c_block_sort_uint8_uint8_bn32_tn4", "contig_scan_inclusive_sum_bool__int32", "all_reduce_andbool_",
)
# Seeds from other toolchains (older group sizes, AIR 2.4 typed pointers, vertex/fragment).
PUBLIC_SEEDS = ("gpt4all-2.7.0", "metal-linalg-2.19.0-_core@1c55a8", "psychmetal", "metalq")


def seed_files(mlx_lib, fixture_metallib, directory: pathlib.Path):
    names = [name for name in APPLE_KERNELS if name in mlx_lib]
    assert len(names) >= 10, names
    seeds = {"apple-mlx": mlx_lib.subset(names), "fixtures": fixture_metallib}
    for path in subset_files():
        if path.name.startswith(PUBLIC_SEEDS):
            seeds[path.stem] = path.read_bytes()
    assert len(seeds) == 2 + len(PUBLIC_SEEDS), sorted(seeds)
    paths = []
    for label, data in seeds.items():
        tm.load(data, verify=True)
        paths.append(directory / f"{label}.metallib")
        paths[-1].write_bytes(data)
    return paths


def run_fuzzer(*args, timeout=900):
    return subprocess.run([sys.executable, str(ROOT / "tools" / "fuzz_metallib.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_mutated_metallibs_never_crash_hang_or_raise_foreign_errors(mlx_lib, fixture_metallib, tmp_path):
    seeds = seed_files(mlx_lib, fixture_metallib, tmp_path)
    findings = tmp_path / "findings"
    result = run_fuzzer("--seed", FUZZ_SEED, "--cases", FUZZ_CASES, "--jobs", cores(), "--out", findings, *seeds)
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    assert result.returncode == 0, f"{result.stdout[-6000:]}\n{result.stderr[-6000:]}\nreproducers in {findings}"
    assert summary.startswith(f"cases {FUZZ_CASES} ") and "crashes 0 hangs 0 foreign 0" in summary, summary
    counts = dict(zip(summary.split()[::2], summary.split()[1::2]))
    # Most mutations must be caught, and some must still load: the slice exercises both sides.
    assert int(counts["rejected"]) > FUZZ_CASES // 4 and int(counts.get("verified", 0)) > 0, summary
    print(f"fuzz: {summary}")


def test_the_runner_reports_a_crash_with_a_reproducer(fixture_metallib, tmp_path):
    """A worker killed by a signal is a finding with its case and bytes, and the run goes on."""
    code = f"""
import os, signal, sys
sys.path.insert(0, {str(ROOT / 'tools')!r})
import fuzz_metallib as fuzz
real = fuzz.exercise
def exercise(data):
    if fuzz._worker_case == 3:
        os.kill(os.getpid(), signal.SIGSEGV)
    return real(data)
original_make_case = fuzz.make_case
def make_case(seed, index, inputs, layouts=None):
    fuzz._worker_case = index
    return original_make_case(seed, index, inputs, layouts)
fuzz.exercise, fuzz.make_case = exercise, make_case
sys.exit(fuzz.main(sys.argv[1:]))
"""
    seed = tmp_path / "seed.metallib"
    seed.write_bytes(fixture_metallib)
    result = subprocess.run([sys.executable, "-c", code, "--cases", "8", "--jobs", "1", "--out",
                             str(tmp_path / "out"), str(seed)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "crash seed 1337 case 3" in result.stdout
    assert result.stdout.strip().splitlines()[-1].startswith("cases 8 ")
    reproducer = tmp_path / "out" / "crash-seed1337-case3.metallib"
    assert reproducer.exists() and reproducer.with_suffix(".txt").exists()



def test_bitcode_that_makes_llvm_abort_raises_instead(tmp_path):
    """A module byte flipped and its HASH recomputed (as a crafted file would) makes LLVM's
    bitcode reader abort ("LLVM ERROR: out of memory"); the guard turns it into a
    ReflectionError and the process lives on. Run in a child: a failing guard kills it."""
    path = next(p for p in subset_files() if p.name == "metal-linalg-2.19.0-_core@1c55a8.metallib")
    code = f"""
import sys
sys.path.insert(0, {str(ROOT / 'tools')!r})
import fuzz_metallib as fuzz
import torch_metallib as tm
data = bytearray(open({str(path)!r}, "rb").read())
layout = fuzz.module_layout(bytes(data))
data[12718] ^= 1 << 5
assert fuzz.rehash(data, layout) == 1
lib = tm.load(bytes(data), verify=True)  # every HASH matches
try:
    lib.sbj_gram_subproblem.reflection
except tm.ReflectionError as error:
    print("raised:", error)
print("alive, other functions:", [lib[n].reflection.function for n in lib.function_names if n != "sbj_gram_subproblem"])
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "raised: sbj_gram_subproblem: LLVM" in result.stdout and "stopped with SIGABRT" in result.stdout
    assert "the process continues" in result.stdout
    assert "alive, other functions: ['sbj_pack'" in result.stdout

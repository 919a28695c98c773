"""Concurrent calls compute what a single thread does: 8 threads call a mix of kernels
(elementwise, cooperative softmax and GEMM, function constants, threadgroup memory) for
TORCH_METALLIB_STRESS_SECONDS (10 by default), every result checked; and 4 processes
compile into one fresh cache directory at once.

Kernels with threadgroup variables are loaded once per worker; concurrent calls used to
run two threadgroups on the same copy (each call's parallel region numbers its workers
from 0), and about half of the softmax results were wrong.
"""

import os
import subprocess
import sys
import threading
import time

import pytest
import torch

import torch_metallib as tm
from _mlx_matmul import _run_steel_gemm

SECONDS = float(os.environ.get("TORCH_METALLIB_STRESS_SECONDS", "10"))
THREADS = 8


def softmax(lib, g):
    rows, size = int(torch.randint(1, 6, (1,), generator=g)), 1024
    x = torch.randn(rows, size, generator=g)
    out = torch.empty_like(x)
    lib.block_softmax_float32(x, out, size, threads=rows * 256, group_size=256)
    torch.testing.assert_close(out, torch.softmax(x, -1), rtol=1e-5, atol=1e-6)


def add(lib, g):
    n = int(torch.randint(1, 100_000, (1,), generator=g))
    a, b, c = torch.randn(n, generator=g), torch.randn(n, generator=g), torch.empty(n)
    lib.vv_Addfloat32(a, b, c)
    assert torch.equal(c, a + b)


def gemm(lib, g):
    _run_steel_gemm(lib, "nn", "float32", (32, 32, 16, 2, 2), (64, 96, 48), seed=int(torch.randint(0, 1000, (1,), generator=g)))


def constants(fixtures, g):
    alpha = float(torch.randint(1, 5, (1,), generator=g))
    x, y = torch.randn(1000, generator=g), torch.empty(1000)
    fixtures.function_constant_scale(x, y, constants={"use_bias": False, "alpha": alpha})
    assert torch.equal(y, alpha * x)


def group_sums(fixtures, g):
    groups, group = int(torch.randint(1, 9, (1,), generator=g)), 64
    x, out = torch.randn(groups * group, generator=g), torch.empty(groups)
    fixtures.threadgroup_sum_float(x, out, threads=x.numel(), group_size=group, threadgroup_memory={0: group * 4})
    torch.testing.assert_close(out, x.view(groups, group).sum(1), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_concurrent_calls_give_single_thread_results(mlx_lib, fixture_metallib):
    fixtures = tm.load(fixture_metallib)
    work = [(softmax, mlx_lib), (add, mlx_lib), (gemm, mlx_lib), (constants, fixtures), (group_sums, fixtures)]
    for run, lib in work:  # compile everything first: the stress is on running, not compiling
        run(lib, torch.Generator().manual_seed(0))
    calls, failures = [0] * THREADS, []

    def worker(index):
        g = torch.Generator().manual_seed(index)
        deadline = time.monotonic() + SECONDS
        while time.monotonic() < deadline and not failures:
            run, lib = work[int(torch.randint(0, len(work), (1,), generator=g))]
            try:
                run(lib, g)
            except Exception as error:  # noqa: BLE001 - reported below
                failures.append(f"thread {index}, {run.__name__}: {type(error).__name__}: {error}")
            calls[index] += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, f"{len(failures)} wrong results in {sum(calls)} calls; first: {failures[0][:2000]}"
    assert min(calls) > 0
    print(f"{sum(calls)} calls by {THREADS} threads in {SECONDS:.0f} s, all correct")


@pytest.mark.slow
def test_processes_share_a_fresh_cache_directory(tmp_path, mlx_path):
    code = f"""
import torch, torch_metallib as tm
lib = tm.load({mlx_path!r})
x = torch.randn(2, 1024); out = torch.empty_like(x)
lib.block_softmax_float32(x, out, 1024, threads=512, group_size=256)
torch.testing.assert_close(out, torch.softmax(x, -1), rtol=1e-5, atol=1e-6)
a = torch.randn(1000); c = torch.empty(1000)
lib.v_Expfloat32float32(a, c)
torch.testing.assert_close(c, a.exp())
print("ok")
"""
    env = dict(os.environ, TORCH_METALLIB_CACHE_DIR=str(tmp_path / "cache"))
    children = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for _ in range(4)]
    results = [child.communicate(timeout=600) + (child.returncode,) for child in children]
    for out, err, code_ in results:
        assert code_ == 0 and out.strip() == "ok", err[-3000:]
    # A fifth process finds every entry the others wrote and uses it.
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]
    assert len(list((tmp_path / "cache").rglob("*"))) >= 4

"""Cooperative kernels on the CPU: threadgroup barriers, SIMD-group functions and threadgroup
memory, run as coroutines (csrc/cpu/cooperative.cpp), against torch."""

import re

import pytest
import torch

import torch_metallib as tm
from _cooperative import (DTYPES, RADIX_SCAN_SIZES, check_layer_norm, check_layer_norm_looped, check_logsumexp,
                          check_radix_scan, check_rms_norm, check_softmax,
                          check_threadgroup_sum_with_threadgroup_memory, layer_norm_looped_kernel, radix_scan_kernel)
from conftest import fixture_bitcode
from torch_metallib.backends.cpu.jit import lowered_ir


# --- the project's fixtures ----------------------------------------------------------------

@pytest.mark.parametrize("group", [32, 64, 128, 256])
def test_threadgroup_sum_with_threadgroup_memory(fixtures, group):
    check_threadgroup_sum_with_threadgroup_memory(fixtures, group)


def test_divergent_barrier_passes_finished_threads_as_apple_gpus_do():
    # Kept apart from the packed fixture set (tests/fixtures/cooperative/): it is wrong on purpose.
    fixtures = tm.load(tm.pack([tm.FunctionSource(
        "divergent_barrier", fixture_bitcode("cooperative/divergent_barrier"))]))
    for limit in (64, 10, 0):  # all, some or none of the threads reach the barrier
        out = torch.full((65,), -1.0)
        fixtures.divergent_barrier(out, limit, threads=64, group_size=64)
        assert torch.equal(out[:64], torch.arange(64.0)) and out[64] == -1.0


@pytest.mark.parametrize("mode", ["sequential", "permuted"])
def test_divergent_barrier_is_a_deadlock_in_the_debug_schedules(mode):
    """Metal leaves a barrier that some threads skip undefined: the debug schedules wait
    for every thread, so the skipped barrier is reported (never a hang)."""
    fixtures = tm.load(tm.pack([tm.FunctionSource(
        "divergent_barrier", fixture_bitcode("cooperative/divergent_barrier"))]))
    out = torch.zeros(64)
    with tm.cpu_schedule(mode):
        fixtures.divergent_barrier(out, 64, threads=64, group_size=64)  # all reach it: fine
        assert torch.equal(out, torch.arange(64.0))
        with pytest.raises(tm.KernelExecutionError) as error:
            fixtures.divergent_barrier(out, 10, threads=64, group_size=64)
    message = str(error.value)
    assert message.startswith("divergent_barrier: deadlock in threadgroup (0, 0, 0): ")
    assert "10 of 64 threads wait at a threadgroup barrier that 54 threads finished" in message
    assert "Apple GPUs and the parallel schedule let finished threads pass" in message
    assert isinstance(error.value, RuntimeError) and isinstance(error.value, tm.TorchMetallibError)


# --- MLX kernels ----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", ["block", "looped"])
def test_softmax(mlx_lib, variant, dtype):
    check_softmax(mlx_lib, variant, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", ["block", "looped"])
def test_logsumexp(mlx_lib, variant, dtype):
    check_logsumexp(mlx_lib, variant, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("looped", [False, True])
def test_rms_norm(mlx_lib, looped, dtype):
    check_rms_norm(mlx_lib, looped, dtype)


@pytest.mark.parametrize("looped", [False, True])
def test_layer_norm(mlx_lib, looped):
    check_layer_norm(mlx_lib, looped)


# --- PyTorch's layer_norm_looped: one lane test on both sides of a barrier ---------------------

@pytest.mark.parametrize("rows, size, group", [(3, 1000, 256), (2, 37, 64), (4, 4096, 1024), (1, 5, 32)])
def test_layer_norm_looped_as_lane_loops(rows, size, group):
    """Rows shorter and longer than the threadgroup, one SIMD-group and 32 of them."""
    kernel = layer_norm_looped_kernel()
    check_layer_norm_looped(kernel, rows, size, group)
    assert kernel.cpu_scheme == "lanes"


def test_layer_norm_looped_as_coroutines_and_without_weight_or_bias():
    kernel = layer_norm_looped_kernel()
    check_layer_norm_looped(kernel, 2, 300, 128, checked=True)
    assert kernel.cpu_scheme == "coroutines"
    check_layer_norm_looped(kernel, 2, 300, 128, affine=False)


# --- PyTorch's radix_scan: a prefix sum after a loop whose trip count differs per lane -----------

@pytest.mark.parametrize("n_entries", RADIX_SCAN_SIZES)
def test_radix_scan_prefix_sum_after_a_divergent_loop(n_entries):
    check_radix_scan(radix_scan_kernel(), 2, n_entries)


@pytest.mark.parametrize("lanes", [True, False])
def test_waits_and_what_reaches_them_are_convergent(fixtures, lanes):
    """The barrier's and simd_sum's definitions, the thread entry and the runtime's waits
    (or the lane loops' markers) are convergent in the host IR, so LLVM copies none of
    them into branches (air/convergence.py); a kernel that never waits keeps a
    plain launcher."""
    text = lowered_ir(layer_norm_looped_kernel(), {}, "t", True, lanes=lanes)
    entry = "__tm_lanes_t" if lanes else "__tm_thread_t"
    waits = ["tm.lanes.barrier", "tm.lanes.deposit"] if lanes else ["tm_rt_barrier", "tm_rt_simd_exchange"]
    for name in ["air.wg.barrier", "air.simd_sum.f32", entry] + waits:
        line = re.search(rf"^(?:define|declare) [^\n]*@{re.escape(name)}\([^\n]*$", text, re.M).group(0)
        assert re.search(r"\)[^()]*\bconvergent\b[^()]*$", line), line
    plain = lowered_ir(fixtures["vector_add_float"], {}, "t", False)
    assert "convergent" not in re.search(r"^define void @__tm_launch_t\([^\n]*$", plain, re.M).group(0)

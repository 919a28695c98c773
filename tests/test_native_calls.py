"""Calls that stay native: after a kernel's first call on the CPU, later calls are bound and
run by the backend's launcher without returning to Python (``_C.call``). They must give
what the full path gives, and every switch the full path reads per call (checked
execution, debug schedules, function-constant values, thread counts) must still reach it."""

import pytest
import torch

import torch_metallib as tm

ALPHAS = (2.0, -0.5, 3.0)


def _launchers(kernel):
    return kernel._dispatch_state().launchers


def _checked_keys(kernel):
    return [key for key in kernel._dispatch_state().prepared if isinstance(key, tuple) and key[3]]


@pytest.fixture()
def add(mlx_path):
    """MLX's float add, on a library of its own (no launcher from another test)."""
    return tm.load(mlx_path).vv_Addfloat32


def test_repeated_calls_run_natively_and_match_torch(add):
    for n in (16, 1000, 70000, 3):
        a, b, c = torch.randn(n), torch.randn(n), torch.full((n,), float("nan"))
        add(a, b, c)
        assert torch.equal(c, a + b), n
    assert len(_launchers(add)) == 1  # made by the first call, used by the three after it
    assert _launchers(add).last_cpu_scheme == "threads"
    assert add.cpu_scheme == "threads"


def test_refusals_come_from_the_native_path_too(add):
    a = torch.ones(8)
    add(a, a, torch.empty(8))
    with pytest.raises(tm.KernelArgumentError, match="expected a tensor of torch.float32, got torch.float64"):
        add(a, a, torch.empty(8, dtype=torch.float64))
    with pytest.raises(tm.KernelArgumentError, match="no argument named 'nope'"):
        add(a, a, torch.empty(8), nope=1)


def test_a_checked_block_reaches_the_full_path(add):
    a, c = torch.ones(8), torch.empty(8)
    add(a, a, c)
    assert not _checked_keys(add)
    with tm.checked():
        add(a, a, c)
    assert _checked_keys(add), "the call inside checked() ran the unchecked launcher"
    assert torch.equal(c, a + a)


def test_the_checked_environment_variable_reaches_the_full_path(add, monkeypatch):
    a, c = torch.ones(8), torch.empty(8)
    add(a, a, c)
    monkeypatch.setenv("TORCH_METALLIB_CHECKED", "1")
    add(a, a, c)
    assert _checked_keys(add), "a call with TORCH_METALLIB_CHECKED=1 ran the unchecked launcher"


def test_a_debug_schedule_reaches_the_full_path(add):
    a, c = torch.ones(8), torch.empty(8)
    add(a, a, c)
    with tm.cpu_schedule("permuted", seed=5):
        add(a, a, c)
        assert add.cpu_scheme == "coroutines"  # permuted runs make every thread a coroutine
    add(a, a, c)
    assert add.cpu_scheme == "threads"


def test_each_constant_value_has_its_launcher(fixtures_lib):
    kernel = fixtures_lib.function_constant_scale
    x = torch.arange(64, dtype=torch.float32)
    for _ in range(2):
        for alpha in ALPHAS:
            out = torch.empty(64)
            kernel(x, out, constants={"use_bias": False, "alpha": alpha})
            assert torch.equal(out, alpha * x + 0.0), alpha
    assert len(_launchers(kernel)) == len(ALPHAS)


# --- CUDA: the same launches as the Python path, from the command list -----------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")


@cuda
@pytest.mark.cuda
def test_cuda_calls_run_natively_and_match_torch(add):
    for n, group in ((16, None), (1000, None), (1000, 96), (70000, None), (3, None)):
        a, b = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
        c = torch.full((n,), float("nan"), device="cuda")
        add(a, b, c, group_size=group)
        assert torch.equal(c, a + b), (n, group)
    assert _launchers(add).last_ran_natively
    assert len(_launchers(add)) == 1


@cuda
@pytest.mark.cuda
def test_cuda_threadgroup_memory_and_edge_groups_natively(fixtures_lib):
    kernel = fixtures_lib.threadgroup_sum_float
    for group in (32, 64, 32, 64):  # each group size again: the second time through a launcher
        groups = 37
        x = torch.randint(-1000, 1000, (groups * group,)).float().cuda()
        out = torch.full((groups + 1,), -7.0, device="cuda")
        kernel(x, out, threads=groups * group, group_size=group, threadgroup_memory={0: group * 4})
        assert torch.equal(out[:groups].cpu(), x.view(groups, group).sum(1).cpu()), group
        assert out[groups].item() == -7.0
    assert _launchers(kernel).last_ran_natively


@cuda
@pytest.mark.cuda
def test_cuda_calls_on_another_stream(add):
    a = torch.randn(4096, device="cuda")
    c = torch.empty_like(a)
    add(a, a, c)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(3):
            add(a, a, c)
    stream.synchronize()
    assert torch.equal(c, a + a)
    assert _launchers(add).last_ran_natively


@cuda
@pytest.mark.cuda
def test_cuda_values_reach_each_native_call(fixtures_lib):
    """Each call's values (constant float&) are copied to the device once per content and
    stream; a copy made for one call must never serve another's values."""
    kernel = fixtures_lib.scale_shift_float
    x = torch.arange(300, dtype=torch.float32, device="cuda")
    out = torch.empty_like(x)
    side = torch.cuda.Stream()
    for round_ in range(3):
        for scale, shift in ((2.0, 1.0), (0.5, -3.0), (2.0, 1.0), (-1.0, 0.25)):
            with torch.cuda.stream(side if round_ == 1 else torch.cuda.current_stream()):
                kernel(x, out, scale, shift)
                assert torch.equal(out, x * scale + shift), (round_, scale, shift)
    assert _launchers(kernel).last_ran_natively
    assert len(_launchers(kernel)) == 1


def test_a_backend_registered_later_gets_the_calls(add):
    """Launchers belong to the backend that made them: one registered for their device
    afterwards (the simulated Metal does this in tests) must see every call."""
    from torch_metallib.dispatch import backend as seam

    cpu = seam.backend_for("cpu", "")
    a, c = torch.ones(8), torch.empty(8)
    add(a, a, c)

    class Counting(seam.Backend):
        device_type = "cpu"
        runs = 0

        def prepare(self, function, state, constants, checked=False):
            return cpu.prepare(function, state, constants, checked)

        def run(self, function, prepared, plan):
            Counting.runs += 1
            cpu.run(function, prepared, plan)

    seam.register_backend(Counting())
    try:
        add(a, a, c)
        add(a, a, c)
    finally:
        seam.register_backend(cpu)
    assert Counting.runs == 2
    assert torch.equal(c, a + a)

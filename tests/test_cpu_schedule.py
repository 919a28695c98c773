"""The CPU backend's schedules (torch_metallib.cpu_schedule): the default parallel one, the
deterministic sequential debug mode and the permuted mode that exposes missing barriers."""

import os
import subprocess
import sys

import pytest
import torch

import torch_metallib as tm
from conftest import fixture_bitcode

GROUP, GROUPS = 64, 6


@pytest.fixture(scope="module")
def missing_barrier():
    return tm.load(tm.pack([tm.FunctionSource(
        "missing_barrier", fixture_bitcode("cooperative/missing_barrier"))])).missing_barrier


def _neighbours(x: torch.Tensor) -> torch.Tensor:
    """What missing_barrier means to compute: each thread's left neighbour in its group
    (thread 0 its own value)."""
    groups = x.view(GROUPS, GROUP)
    return torch.cat([groups[:, :1], groups[:, :-1]], 1).reshape(-1)


def _run(kernel, x: torch.Tensor) -> torch.Tensor:
    out = torch.full((x.numel() + 1,), -5.0)
    kernel(x, out, threads=x.numel(), group_size=GROUP, threadgroup_memory={0: GROUP * 4})
    assert out[-1] == -5.0
    return out[:-1]


@pytest.fixture(scope="module")
def values():
    return torch.arange(1.0, GROUPS * GROUP + 1)


@pytest.mark.parametrize("mode", ["parallel", "sequential"])
def test_index_order_hides_the_missing_barrier(missing_barrier, values, mode):
    with tm.cpu_schedule(mode):
        assert torch.equal(_run(missing_barrier, values), _neighbours(values))


def test_permuted_order_exposes_the_missing_barrier_and_replays_by_seed(missing_barrier, values):
    expected = _neighbours(values)
    runs = {}
    for seed in (1, 2, 3):
        with tm.cpu_schedule("permuted", seed=seed):
            runs[seed] = _run(missing_barrier, values)
            assert torch.equal(_run(missing_barrier, values), runs[seed]), "same seed, same result"
        wrong = (runs[seed] != expected).sum().item()
        # A neighbour that runs later has not stored yet: about half the threads read a stale 0.
        assert GROUPS * GROUP // 4 < wrong < 3 * GROUPS * GROUP // 4
        assert set(runs[seed][runs[seed] != expected].tolist()) == {0.0}
    assert not torch.equal(runs[1], runs[2]) and not torch.equal(runs[2], runs[3])


@pytest.mark.parametrize("seed", [0, 7, 2**64 - 1])
def test_permuted_order_keeps_barriers(seed):
    """The tree reduction of threadgroup_sum_float needs every barrier: with them it is
    exact in any order."""
    lib = tm.load(tm.pack([tm.FunctionSource("threadgroup_sum_float", fixture_bitcode("threadgroup_sum_float"))]))
    x = torch.randint(-1000, 1000, (GROUPS * GROUP,), generator=torch.Generator().manual_seed(seed % 97)).float()
    out = torch.zeros(GROUPS)
    with tm.cpu_schedule("permuted", seed=seed):
        lib.threadgroup_sum_float(x, out, threads=x.numel(), group_size=GROUP, threadgroup_memory={0: GROUP * 4})
    assert torch.equal(out, x.view(GROUPS, GROUP).sum(1))


@pytest.mark.parametrize("mode", ["sequential", "permuted"])
def test_debug_modes_run_mlx_kernels_correctly(mlx_lib, mode):
    """A plain kernel (in permuted mode run as coroutines) and a cooperative one."""
    a, b = torch.randn(3000), torch.randn(3000)
    c = torch.empty(3000)
    x = torch.randn(3, 4096)
    out = torch.empty_like(x)
    with tm.cpu_schedule(mode, seed=11):
        mlx_lib.vv_Addfloat32(a, b, c, 3000)
        mlx_lib.block_softmax_float32(x, out, 4096, threads=3 * 1024, group_size=1024)
    assert torch.equal(c, a + b)
    assert (out.double() - torch.softmax(x.double(), -1)).abs().max() <= 2e-6


def test_schedule_is_scoped_and_nests():
    from torch_metallib.backends.cpu.schedule import current_schedule

    outer = current_schedule()
    with tm.cpu_schedule("permuted", seed=5):
        with tm.cpu_schedule("sequential"):
            assert current_schedule() == ("sequential", 0)
        assert current_schedule() == ("permuted", 5)
    assert current_schedule() == outer


@pytest.mark.parametrize("mode, seed, message", [
    ("random", 0, "unknown CPU schedule 'random'; expected one of parallel, sequential, permuted"),
    ("permuted", -1, "seed must be an int in [0, 2**64), got -1"),
    ("permuted", 1.5, "seed must be an int in [0, 2**64), got 1.5"),
])
def test_bad_schedules_are_refused(mode, seed, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
                       .replace("*", r"\*")):
        with tm.cpu_schedule(mode, seed):
            pass


_CHILD = """
import sys, torch, torch_metallib as tm
from conftest import fixture_bitcode
lib = tm.load(tm.pack([tm.FunctionSource("missing_barrier", fixture_bitcode("cooperative/missing_barrier"))]))
x = torch.arange(1.0, 6 * 64 + 1)
out = torch.zeros(x.numel())
try:
    lib.missing_barrier(x, out, threads=x.numel(), group_size=64, threadgroup_memory={0: 256})
except ValueError as error:
    print("ValueError:", error)
    sys.exit(0)
print(",".join(str(int(v)) for v in out.tolist()))
"""


def _child(setting: str) -> str:
    env = dict(os.environ, TORCH_METALLIB_CPU_SCHEDULE=setting)
    result = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, check=True,
                            cwd=os.path.dirname(__file__))
    return result.stdout.strip()


@pytest.mark.slow
def test_environment_variable_sets_the_default(missing_barrier, values):
    with tm.cpu_schedule("permuted", seed=9):
        here = _run(missing_barrier, values)
    assert _child("permuted:9") == ",".join(str(int(v)) for v in here.tolist())
    assert _child("sequential") == ",".join(str(int(v)) for v in _neighbours(values).tolist())
    assert _child("permuted:x") == ("ValueError: TORCH_METALLIB_CPU_SCHEDULE='permuted:x': the seed after ':' "
                                    "must be a decimal integer")
    assert _child("fast").startswith("ValueError: TORCH_METALLIB_CPU_SCHEDULE='fast': unknown CPU schedule 'fast'")

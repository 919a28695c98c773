"""Checked execution: every device, constant and threadgroup access bounds-checked.

Each call that would read or write outside the memory it bound (on the CPU: a crash or
silent corruption) runs in a child process and must raise KernelMemoryError naming the
kernel, the thread, the argument, the byte offset and the extent, with the child alive.
Calls that stay inside their memory give the same results checked as unchecked."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import torch_metallib as tm
from _mlx_matmul import _run_steel_gemm

SETUP = """
import sys, torch, torch_metallib as tm
sys.path.insert(0, {tests!r})
lib = tm.load({mlx!r})
a, b = torch.randn(64), torch.randn(64)
"""

CASES = {
    "output smaller than the grid": (
        "lib.vv_Addfloat32(a, b, torch.zeros(16), threads=64)",
        ["vv_Addfloat32: thread (", "writes 4 bytes at byte offset 64 of argument 2 'c' (buffer(2), device float*)",
         "expected byte offsets 0 to 64 (the 64 bytes its view spans), got 64 to 68"]),
    "threads far beyond the data": (
        "lib.vv_Addfloat32(torch.ones(16), torch.ones(16), torch.zeros(16), threads=10**6)",
        ["reads 4 bytes at byte offset 64 of argument 0 'a'", "expected byte offsets 0 to 64"]),
    "expanded (stride-0) input": (  # an expanded output is refused before running (test_checked_views.py)
        "lib.vv_Addfloat32(torch.zeros(1).expand(64), b, torch.zeros(64), threads=64)",
        ["reads 4 bytes at byte offset 4 of argument 0 'a'", "expected byte offsets 0 to 4 (the 4 bytes"]),
    "source stride of 1e9": (
        "x, y, z = torch.randn(8, 8), torch.randn(8, 8), torch.empty(8, 8)\n"
        "lib.g2_Addfloat32(x, y, z, [10**9, 1], y.stride(), threads=(8, 8))",
        ["reads 4 bytes at byte offset 4000000000 of argument 0 'a'", "expected byte offsets 0 to 256"]),
    "threadgroup memory smaller than the kernel indexes": (
        "import pack_fixtures\n"
        "fx = tm.load(tm.pack(pack_fixtures.sources()))\n"
        "fx.threadgroup_sum_float(torch.ones(64), torch.zeros(1), threads=64, group_size=64, "
        "threadgroup_memory={0: 16})",
        ["threadgroup_sum_float: thread (", "bytes at byte offset", "of argument 2 'scratch'",
         "(its 16 bytes of threadgroup memory)"]),
}


def run_child(code: str, mlx_path: str, env=None) -> subprocess.CompletedProcess:
    tests = os.path.join(os.path.dirname(__file__), "fixtures")
    script = SETUP.format(tests=tests, mlx=mlx_path) + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


@pytest.mark.parametrize("case", list(CASES))
def test_out_of_bounds_access_raises_instead_of_crashing(mlx_path, case):
    call, fragments = CASES[case]
    code = f"""
try:
    {call.replace(chr(10), chr(10) + '    ')}
except tm.KernelMemoryError as error:
    print("RAISED", error)
else:
    print("NOT RAISED")
"""
    result = run_child(code, mlx_path, {"TORCH_METALLIB_CHECKED": "1"})
    assert result.returncode == 0, f"child died ({result.returncode}): {result.stderr[-2000:]}"
    assert result.stdout.startswith("RAISED"), result.stdout + result.stderr[-2000:]
    for fragment in fragments:
        assert fragment in result.stdout, result.stdout


def test_the_same_call_unchecked_is_not_caught(mlx_path):
    """The check is what raises: unchecked, a write past a tensor goes unnoticed (into
    memory the kernel does not own; a larger storage keeps it harmless here)."""
    code = """
big = torch.zeros(1024)
out = big[:16]
lib.vv_Addfloat32(a, b, out, threads=64, checked=False)
print("WROTE PAST", bool((big[16:64] != 0).any()))
"""
    result = run_child(code, mlx_path, {"TORCH_METALLIB_CHECKED": "1"})
    assert "WROTE PAST True" in result.stdout, result.stdout + result.stderr[-2000:]


def _within(shape, views: bool, generator=None) -> torch.Tensor:
    """A tensor of `shape`, or (views) the same as a slice in the middle of a larger one."""
    if not views:
        return torch.randn(shape, generator=generator)
    rows = shape[0] if len(shape) > 1 else 1
    big = torch.randn((rows + 3,) + tuple(shape[1:]) if len(shape) > 1 else (shape[0] + 37,), generator=generator)
    return big[2:2 + rows] if len(shape) > 1 else big[17:17 + shape[0]]


@pytest.mark.parametrize("views", [False, True], ids=["tensors", "slices"])
def test_in_bounds_calls_give_unchecked_results(mlx_lib, views):
    g = torch.Generator().manual_seed(0)
    a, b = _within((1000,), views, g), _within((1000,), views, g)
    checked, plain = _within((1000,), views), _within((1000,), views)
    mlx_lib.vv_Addfloat32(a, b, checked, checked=True)
    mlx_lib.vv_Addfloat32(a, b, plain)
    assert torch.equal(checked, plain) and torch.equal(plain, a + b)
    x = _within((6, 1000), views, g)
    y_checked, y_plain = _within((6, 1000), views), _within((6, 1000), views)
    with tm.checked():
        mlx_lib.block_softmax_float32(x, y_checked, 1000, threads=(6 * 256, 1, 1), group_size=(256, 1, 1))
    mlx_lib.block_softmax_float32(x, y_plain, 1000, threads=(6 * 256, 1, 1), group_size=(256, 1, 1))
    assert torch.equal(y_checked, y_plain)


def test_steel_gemm_runs_checked(mlx_lib):
    """A cooperative kernel with threadgroup tiles, SIMD-group matrices and a struct argument."""
    with tm.checked():
        _run_steel_gemm(mlx_lib, "nt", "float32", (32, 32, 16, 2, 2), (40, 36, 40))


def test_call_argument_wins_over_context_and_environment(mlx_lib, monkeypatch):
    from torch_metallib.dispatch.checked_mode import checked_requested
    monkeypatch.setenv("TORCH_METALLIB_CHECKED", "1")
    assert checked_requested(None)
    with tm.checked(False):
        assert not checked_requested(None)
        assert checked_requested(True)
    monkeypatch.setenv("TORCH_METALLIB_CHECKED", "0")
    assert not checked_requested(None)
    with tm.checked():
        assert checked_requested(None) and not checked_requested(False)


def _divergent_barriers_kernel():
    """Threads below 16 wait at one threadgroup barrier, the others at another."""
    import _air_modules as air

    body = ["%low = icmp ult i32 %gid, 16", "%at = getelementptr float, ptr addrspace(1) %out, i64 %gid64",
            "br i1 %low, label %first, label %second",
            "first:", "store float 1.0, ptr addrspace(1) %at", "call void @air.wg.barrier(i32 2, i32 1) #2",
            "br label %join",
            "second:", "store float 2.0, ptr addrspace(1) %at", "call void @air.wg.barrier(i32 2, i32 1) #2",
            "br label %join", "join:"]
    text = air.module_text("divergent_barriers", body, [("out", "float", "air.read_write")],
                           ["declare void @air.wg.barrier(i32, i32) #1"], collective=True)
    return air.library("divergent_barriers", text)["divergent_barriers"]


def test_divergent_barriers_are_reported_in_checked_execution():
    kernel = _divergent_barriers_kernel()
    out = torch.zeros(32)
    kernel(out, threads=32, group_size=32)  # unchecked: undefined in Metal; runs as Apple GPUs do
    assert torch.equal(out, torch.tensor([1.0] * 16 + [2.0] * 16))
    with pytest.raises(tm.KernelExecutionError) as error:
        kernel(out, threads=32, group_size=32, checked=True)
    message = str(error.value)
    assert message.startswith("divergent_barriers: divergent threadgroup barriers: thread (16, 0, 0) waits at "
                              "the kernel's barrier #2 while thread (0, 0, 0) of the same threadgroup waits at "
                              "barrier #1"), message
    assert "move the barrier out of the branch" in message

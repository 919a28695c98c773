"""Checked execution of operators made by ops.define: a torch_metallib.checked() block,
TORCH_METALLIB_CHECKED=1 and ops.define(..., checked=True) each make an operator's kernel
run checked, so an access outside the memory a call bound raises KernelMemoryError naming
the operator and the kernel, and corrupts nothing. Calls that could corrupt the heap
unchecked run only in child processes."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import torch_metallib as tm
from torch_metallib import ops
from _ops_examples import define_sdpa_vector

NS = "tm_checked_ops"
SENTINEL = 7.0


def _add_into(lib, name: str, **options):
    """c = a + b over a's elements, however few c has: a define whose grid can pass its output."""
    return ops.define(f"{NS}::{name}(Tensor a, Tensor b, Tensor(a!) c) -> ()", lib, "vv_Add{dtype}",
                      dtypes=[torch.float32], threads=ops.numel("a"), **options)


def _sdpa_64(lib, name: str, group: int = 1024, **options):
    """MLX's sdpa_vector_float_64_64 bound as torch_metallib.mlx binds it, without its
    preconditions: nothing stops a call with another head dimension (or, with `group`,
    threadgroups of another size than the 1,024 threads MLX launches)."""
    return define_sdpa_vector(lib, f"{NS}::{name}", group, preconditions=False, **options)


@pytest.fixture(scope="module")
def operators(mlx_path):
    lib = tm.load(mlx_path)
    return {"add": _add_into(lib, "add_into"), "add_checked": _add_into(lib, "add_into_checked", checked=True),
            "sdpa": _sdpa_64(lib, "sdpa_64")}


def _short_output():
    """Inputs of 64 elements and an output view of 16 inside a storage of 128 sentinels: a
    grid over the inputs writes 48 elements past the view, into its neighbours."""
    a, b = torch.randn(64), torch.randn(64)
    storage = torch.full((128,), SENTINEL)
    return a, b, storage, storage[:16]


def _assert_raised_and_intact(error, op_name: str, a, b, storage):
    message = str(error.value)
    assert message.startswith(f"{NS}::{op_name}: vv_Addfloat32: thread ("), message
    assert "writes 4 bytes at byte offset 64 of argument 2 'c'" in message, message
    assert "expected byte offsets 0 to 64 (the 64 bytes its view spans)" in message, message
    assert torch.equal(storage[16:], torch.full((112,), SENTINEL)), "the write past the view landed"
    assert torch.equal(storage[:16], (a + b)[:16])  # threads inside the view ran


def test_unchecked_operator_runs_and_writes_past_the_view(operators):
    """Without a switch the operator runs as before: right on a call that fits, and the
    write past a short view goes unnoticed into its neighbours (what the checks catch)."""
    a, b, storage, c = _short_output()
    out = torch.zeros(64)
    operators["add"](a, b, out)
    assert torch.equal(out, a + b)
    operators["add"](a, b, c)
    assert torch.equal(storage[:64], a + b)  # 48 neighbours overwritten


def test_checked_block_applies_to_operators(operators):
    a, b, storage, c = _short_output()
    with tm.checked():
        with pytest.raises(tm.KernelMemoryError) as error:
            operators["add"](a, b, c)
    _assert_raised_and_intact(error, "add_into", a, b, storage)
    with tm.checked():  # a call that fits runs checked with the same result
        out = torch.zeros(64)
        operators["add"](a, b, out)
        assert torch.equal(out, a + b)


def test_environment_applies_to_operators(operators, monkeypatch):
    monkeypatch.setenv("TORCH_METALLIB_CHECKED", "1")
    a, b, storage, c = _short_output()
    with pytest.raises(tm.KernelMemoryError) as error:
        operators["add"](a, b, c)
    _assert_raised_and_intact(error, "add_into", a, b, storage)


def test_operator_defined_checked_always_runs_checked(operators):
    a, b, storage, c = _short_output()
    with pytest.raises(tm.KernelMemoryError) as error:
        operators["add_checked"](a, b, c)
    _assert_raised_and_intact(error, "add_into_checked", a, b, storage)
    with tm.checked(False):  # the definition wins over a block that turns checking off
        with pytest.raises(tm.KernelMemoryError):
            operators["add_checked"](a, b, c)
    out = torch.zeros(64)
    operators["add_checked"](a, b, out)
    assert torch.equal(out, a + b)


@pytest.mark.usefixtures("fresh_dynamo")
def test_checked_block_reaches_the_compiled_graph(operators):
    """The operator runs inside the compiled graph; the block around the compiled call
    still checks it."""
    def fn(a, b, c):
        operators["add"](a, b, c)
        return c * 2

    compiled = torch.compile(fn, fullgraph=True)
    a, b, storage, c = _short_output()
    with tm.checked():
        with pytest.raises(tm.KernelMemoryError) as error:
            compiled(a, b, c)
    _assert_raised_and_intact(error, "add_into", a, b, storage)
    out = torch.zeros(64)
    assert torch.equal(compiled(a, b, out), (a + b) * 2)  # and outside it, unchecked as before


def _attention(head_dim: int, heads: int = 2, keys: int = 8):
    torch.manual_seed(0)
    q = torch.randn(1, heads, 1, head_dim)
    k, v = torch.randn(1, heads, keys, head_dim), torch.randn(1, heads, keys, head_dim)
    return q, k, v


def test_sdpa_with_the_head_dimension_it_was_built_for(operators):
    q, k, v = _attention(64)
    scale = 64 ** -0.5
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale)
    for checked in (False, True):
        with tm.checked(checked):
            assert torch.allclose(operators["sdpa"](q, k, v, scale), expected, atol=1e-5, rtol=1e-4), checked


def test_sdpa_with_a_smaller_head_dimension_raises_checked(operators):
    """Head dimension 32 into a kernel built for 64: it reads and writes 64 elements per
    head (unchecked, past every tensor: heap corruption); checked, it raises."""
    q, k, v = _attention(32)
    with tm.checked():
        with pytest.raises(tm.KernelMemoryError) as error:
            operators["sdpa"](q, k, v, 32 ** -0.5)
    message = str(error.value)
    assert message.startswith(f"{NS}::sdpa_64: sdpa_vector_float_64_64: thread ("), message
    assert "expected byte offsets 0 to 256 (the 256 bytes its view spans)" in message, message


CHILD = """
import sys, torch, torch_metallib as tm
sys.path.insert(0, {tests!r})
from test_checked_ops import _attention, _sdpa_64
op = _sdpa_64(tm.load({mlx!r}), "sdpa_child")
q, k, v = _attention(32)
try:
    op(q, k, v, 32 ** -0.5)
except tm.KernelMemoryError as error:
    print("RAISED", error)
else:
    print("NOT RAISED")
"""


def test_sdpa_with_a_smaller_head_dimension_under_the_environment_in_a_child(mlx_path):
    """The same call in a fresh process with TORCH_METALLIB_CHECKED=1: it raises and the
    process lives (unchecked, the same child may abort)."""
    script = CHILD.format(tests=os.path.dirname(__file__), mlx=mlx_path)
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
                            timeout=300, env={**os.environ, "TORCH_METALLIB_CHECKED": "1"})
    assert result.returncode == 0, f"child died ({result.returncode}): {result.stderr[-2000:]}"
    assert result.stdout.startswith(f"RAISED {NS}::sdpa_child: sdpa_vector_float_64_64: thread ("), \
        result.stdout + result.stderr[-2000:]

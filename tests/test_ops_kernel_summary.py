"""What ops.define checks a kernel against (ops/_kernel_summary.py), on Apple-built
mlx.metallib: with a warm disk cache, or with the disk cache off and an archive that
``precompile`` wrote, the MLX operators are defined without parsing any kernel's bitcode,
and the cached summary is exactly what reflection gives."""

import json
import os
import subprocess
import sys

import pytest

import torch_metallib as tm
import torch_metallib.library.function as function_module
from torch_metallib.cache.disk_cache import write_entry
from torch_metallib.cli import precompile
from torch_metallib.ops import _kernel_summary
from torch_metallib.ops._kernel_summary import kernel_summary, summary_entry

# Defines the MLX operators in a fresh process, counting the kernels it reflects.
_DEFINE_CHILD = r"""
import json, sys
import torch_metallib.library.function as function_module
reflected = []
real = function_module.reflect
function_module.reflect = lambda name, *args: reflected.append(name) or real(name, *args)
from torch_metallib import mlx
defined = mlx.load(sys.argv[1])
print(json.dumps({"reflected": len(reflected), "schemas": sorted(op.schema for op in defined.values())}))
"""


def _define_in_child(mlx_path, cache, **environment) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_METALLIB_ARCHIVES", "TORCH_METALLIB_CACHE")}
    env["TORCH_METALLIB_CACHE_DIR"] = str(cache)
    env.update(environment)
    child = subprocess.run([sys.executable, "-c", _DEFINE_CHILD, mlx_path], capture_output=True, text=True, env=env,
                           timeout=300)
    assert child.returncode == 0, child.stderr[-3000:]
    return json.loads(child.stdout.strip().splitlines()[-1])


def test_warm_cache_defines_mlx_operators_without_reflection(mlx_path, tmp_path):
    """The first process reflects each kernel once (for its call record and its summary);
    the second finds both on disk and parses no bitcode, defining the same operators."""
    cold = _define_in_child(mlx_path, tmp_path)
    warm = _define_in_child(mlx_path, tmp_path)
    assert cold["reflected"] > 100  # MLX's operators use about two hundred kernels
    assert warm["reflected"] == 0
    assert warm["schemas"] == cold["schemas"] and len(cold["schemas"]) > 70


def test_archive_defines_mlx_operators_without_reflection(mlx_path, defined, tmp_path, monkeypatch):
    """With the disk cache off, an archive ``precompile`` wrote for the kernels MLX's
    operators use carries their summaries beside their call records: a fresh process
    defines the same operators parsing no bitcode (without the summaries it reflected all
    of them). The kernels' objects are beside the point here: one is compiled, not 202."""
    kernels = sorted({f.name for op in defined.values() for f in op.kernels.values()})
    archive = tmp_path / "mlx.tmar"
    build = precompile._build
    monkeypatch.setattr(precompile, "_build", lambda task: build(task) if task[1] == "rmsfloat32" else ([], None))
    precompile.precompile(mlx_path, kernels, None, ["cpu"], str(archive), jobs=1, say=lambda text: None)
    without = _define_in_child(mlx_path, tmp_path, TORCH_METALLIB_CACHE="0")
    archived = _define_in_child(mlx_path, tmp_path, TORCH_METALLIB_CACHE="0", TORCH_METALLIB_ARCHIVES=str(archive))
    assert without["reflected"] == len(kernels) > 100
    assert archived["reflected"] == 0
    assert archived["schemas"] == without["schemas"]


@pytest.fixture
def mlx_kernels(defined, mlx_path, tmp_path, monkeypatch):
    """The names of every kernel MLX's operators use, with an empty disk cache and no
    summary in memory."""
    monkeypatch.setenv("TORCH_METALLIB_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(_kernel_summary, "_summaries", {})
    return sorted({f.name for op in defined.values() for f in op.kernels.values()})


def test_cached_summary_is_reflection(mlx_path, mlx_kernels, monkeypatch):
    """Stored on a miss, read back in another library object without reflecting: the same
    arguments (struct layouts, argument-buffer members) and constants, in the same order."""
    first = tm.load(mlx_path)
    for name in mlx_kernels:
        kernel_summary(first[name])
    monkeypatch.setattr(_kernel_summary, "_summaries", {})
    second = tm.load(mlx_path)
    monkeypatch.setattr(function_module, "reflect", lambda *args: pytest.fail("reflected with a warm cache"))
    read = {name: kernel_summary(second[name]) for name in mlx_kernels}
    for name, summary in read.items():
        assert summary.buffers == first[name].buffers, name
        assert summary.function_constants == first[name].function_constants, name
    assert any(a.struct_fields for s in read.values() for a in s.buffers)  # GEMM's params, at least
    assert any(s.function_constants for s in read.values())


def test_damaged_summary_is_rebuilt(mlx_path, mlx_kernels):
    """An entry whose payload is not a summary (here an argument without its fields) is
    rebuilt from reflection, not trusted."""
    lib = tm.load(mlx_path)
    function = lib[mlx_kernels[0]]
    kernel_summary(function)
    path, key = summary_entry(function)
    assert os.path.exists(path)
    write_entry(path, key, json.dumps({"buffers": [{"name": "x"}], "constants": []}).encode())
    _kernel_summary._summaries.clear()
    assert kernel_summary(tm.load(mlx_path)[mlx_kernels[0]]).buffers == function.buffers

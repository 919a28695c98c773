"""The disk cache cannot serve the wrong kernel, raise, or hang: one test per kind of
damage. Each entry names the key it was written for; whatever else is found at an entry's
path is rebuilt, and a cache directory that cannot be used is skipped with one warning."""

import glob
import json
import os
import pathlib
import subprocess
import sys
import warnings

import pytest
import torch

import torch_metallib as tm
from torch_metallib.backends.cpu import jit as cpu_jit
from torch_metallib.cache import disk_cache
from torch_metallib.dispatch.call_record import record_file_name, record_key


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh cache directory and no kernel compiled in memory: every call reads it."""
    monkeypatch.setenv("TORCH_METALLIB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(cpu_jit, "_compiled", {})
    monkeypatch.setattr(disk_cache, "_warned", set())
    return tmp_path / "cache"


def run_add(lib_source):
    """A fresh library (nothing in memory), one vv_Addfloat32 call, checked."""
    lib = tm.load(lib_source)
    a, b, c = torch.randn(100), torch.randn(100), torch.empty(100)
    lib.vv_Addfloat32(a, b, c)
    assert torch.equal(c, a + b)
    return lib


def run_exp(lib_source):
    lib = tm.load(lib_source)
    a, c = torch.randn(100), torch.empty(100)
    lib.v_Expfloat32float32(a, c)
    torch.testing.assert_close(c, a.exp())
    return lib


def record_path(cache, function):
    return cache / "calls" / record_file_name(function)


def objects(cache):
    return sorted(glob.glob(str(cache / "jit" / "*.o")))


def test_entries_are_written_and_read_back(cache, mlx_path, monkeypatch):
    lib = run_add(mlx_path)
    path = record_path(cache, lib.vv_Addfloat32)
    assert disk_cache.read_entry(str(path), record_key(lib.vv_Addfloat32)) is not None
    (obj,) = objects(cache)
    monkeypatch.setattr(cpu_jit, "_compiled", {})
    run_add(mlx_path)
    assert list(cpu_jit._compiled.values())[0].from_disk


@pytest.mark.parametrize("payload", [bytes(range(256)) * 4, b"[1, 2, 3]", b'{"arguments": 7}', b"\xff\xfe"])
def test_record_with_a_valid_checksum_but_not_a_record_is_rebuilt(cache, mlx_path, payload):
    function = run_add(mlx_path).vv_Addfloat32
    path = record_path(cache, function)
    disk_cache.write_entry(str(path), record_key(function), payload)
    run_add(mlx_path)  # no UnicodeDecodeError, no wrong record: rebuilt
    assert json.loads(disk_cache.read_entry(str(path), record_key(function)))["parameter_count"] == 5


def test_entries_swapped_between_keys_are_not_used(cache, mlx_path, monkeypatch):
    add = run_add(mlx_path).vv_Addfloat32
    exp = run_exp(mlx_path).v_Expfloat32float32
    add_path, exp_path = record_path(cache, add), record_path(cache, exp)
    add_bytes, exp_bytes = add_path.read_bytes(), exp_path.read_bytes()
    add_path.write_bytes(exp_bytes)
    exp_path.write_bytes(add_bytes)
    first, second = objects(cache)
    first_bytes, second_bytes = open(first, "rb").read(), open(second, "rb").read()
    open(first, "wb").write(second_bytes)
    open(second, "wb").write(first_bytes)
    monkeypatch.setattr(cpu_jit, "_compiled", {})
    run_add(mlx_path)
    run_exp(mlx_path)
    assert not any(k.from_disk for k in cpu_jit._compiled.values())  # both rebuilt, both right
    assert add_path.read_bytes() == add_bytes and exp_path.read_bytes() == exp_bytes


@pytest.mark.parametrize("damage", ["truncated", "flipped", "old format", "empty"])
def test_damaged_entries_are_rebuilt(cache, mlx_path, monkeypatch, damage):
    function = run_add(mlx_path).vv_Addfloat32
    for path in [record_path(cache, function), *map(pathlib.Path, objects(cache))]:
        data = bytearray(path.read_bytes())
        if damage == "truncated":
            data = data[: len(data) // 2]
        elif damage == "flipped":
            data[-1] ^= 1
        elif damage == "old format":
            data[:8] = b"TMCACHE1"
        else:
            data = b""
        path.write_bytes(bytes(data))
    monkeypatch.setattr(cpu_jit, "_compiled", {})
    run_add(mlx_path)
    assert not list(cpu_jit._compiled.values())[0].from_disk


def test_a_directory_where_an_entry_belongs_is_replaced(cache, mlx_path):
    function = tm.load(mlx_path).vv_Addfloat32
    path = record_path(cache, function)
    path.mkdir(parents=True)
    run_add(mlx_path)
    assert path.is_file()


def test_a_fifo_where_an_entry_belongs_does_not_hang_the_call(cache, mlx_path):
    function = tm.load(mlx_path).vv_Addfloat32
    path = record_path(cache, function)
    path.parent.mkdir(parents=True)
    os.mkfifo(path)
    code = f"""
import torch, torch_metallib as tm
lib = tm.load({mlx_path!r})
a, b, c = torch.randn(10), torch.randn(10), torch.empty(10)
lib.vv_Addfloat32(a, b, c)
assert torch.equal(c, a + b)
print("ok")
"""
    env = dict(os.environ, TORCH_METALLIB_CACHE_DIR=str(cache))
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]
    assert path.is_file()  # the FIFO was replaced by the entry


def test_an_unusable_cache_directory_costs_one_warning(tmp_path, monkeypatch, mlx_path):
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("a file where the cache directory should be")
    monkeypatch.setenv("TORCH_METALLIB_CACHE_DIR", str(blocked))
    monkeypatch.setattr(cpu_jit, "_compiled", {})
    monkeypatch.setattr(disk_cache, "_warned", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_add(mlx_path)
        run_exp(mlx_path)
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 2, messages  # one per cache kind (calls, jit), not one per call
    assert all("running without it" in m and "TORCH_METALLIB_CACHE_DIR" in m for m in messages)


def test_cache_keys_follow_the_package_code(monkeypatch):
    """Compiled kernels, PTX and call records are keyed by a hash of the code that shapes
    them: a change to a lowering module gives new keys, with no version to bump; a change to
    the CUDA lowering keeps the CPU's compiled kernels and the call records."""
    from types import SimpleNamespace

    from torch_metallib.cache import fingerprint

    paths = [path for path, _ in fingerprint._sources(fingerprint.COMMON + ("backends/cpu", "backends/cuda"))]
    assert any(path.endswith("/jit.py") for path in paths) and any(path.startswith("air/") for path in paths)
    assert not any(path.startswith(("cli/", "ops/", "library/")) for path in paths)
    function = SimpleNamespace(type="kernel", hash="ab" * 32)

    def keys():
        return (fingerprint.code_fingerprint("cuda"), cpu_jit._cache_key("ab" * 32, ()), record_key(function),
                record_file_name(function))

    def edited(changed):
        real = fingerprint._sources
        monkeypatch.setattr(fingerprint, "_sources", lambda folders: [
            (path, data + b"\n# edited\n" if path == changed else data) for path, data in real(folders)])
        fingerprint.clear_cache()
        try:
            return keys()
        finally:
            monkeypatch.setattr(fingerprint, "_sources", real)
            fingerprint.clear_cache()

    before = keys()
    shared = edited("air/intrinsics.py")
    assert all(old != new for old, new in zip(before, shared))
    cuda_only = edited("backends/cuda/lowering.py")
    assert cuda_only[0] != before[0] and cuda_only[1:] == before[1:]

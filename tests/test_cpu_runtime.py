"""The CPU runtime around a kernel call: several Python threads calling kernels at once,
torch's thread count, and the JIT's disk cache (entries, reuse, corruption, opting out,
concurrent processes, one entry per function-constant set).

Disk-cache scenarios each run in a fresh interpreter (`subprocess.run([sys.executable,
"-c", script])`), so the in-memory cache is empty and only the disk can make a compile
unnecessary; `TORCH_METALLIB_CACHE_DIR` points at the test's own directory.
"""

import hashlib
import json
import os
import struct
import subprocess
import sys
import threading
import time

import pytest
import torch

import torch_metallib as tm
from torch_metallib.backends.cpu import jit as _cpu_jit

MAGIC_SIZE = 8


def header_size(data: bytes) -> int:
    """Bytes before an entry's payload: 8-byte magic, u32 key length, the key, u64 payload
    length, SHA-256 of key and payload."""
    (key_size,) = struct.unpack_from("<I", data, MAGIC_SIZE)
    return MAGIC_SIZE + 4 + key_size + 8 + 32
SUBPROCESS_TIMEOUT = 300


# --- threads ----------------------------------------------------------------------------------

def test_four_threads_calling_kernels_at_once(mlx_path, fixture_metallib, tmp_path, monkeypatch):
    """4 threads start together (threading.Barrier) and each calls four kernels 50 times on
    its own tensors. The libraries are loaded fresh and the JIT's memory cache and disk
    directory are empty, so the first call of each kernel (reflection, argument table,
    compile) races in several threads; each kernel is compiled exactly once."""
    monkeypatch.setenv("TORCH_METALLIB_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TORCH_METALLIB_CACHE", raising=False)
    monkeypatch.setattr(_cpu_jit, "_compiled", {})
    mlx = tm.load(mlx_path)
    fixtures = tm.load(fixture_metallib)

    def add(rng, n, thread):
        a, b, c = torch.randn(n, generator=rng), torch.randn(n, generator=rng), torch.empty(n)
        mlx.vv_Addfloat32(a, b, c)
        return c, a + b

    def multiply(rng, n, thread):
        a, b, c = torch.randn(n, generator=rng), torch.randn(n, generator=rng), torch.empty(n)
        mlx.vv_Multiplyfloat32(a, b, c, n)
        return c, a * b

    def arange(rng, n, thread):
        # start + index * step with values for which every product and sum is exact.
        out = torch.empty(n)
        mlx.arangefloat32(float(thread), 0.25, out)
        return out, float(thread) + torch.arange(n, dtype=torch.float32) * 0.25

    def vector_add(rng, n, thread):
        a, b, out = torch.randn(n, generator=rng), torch.randn(n, generator=rng), torch.empty(n)
        fixtures.vector_add_float(a, b, out=out)
        return out, a + b

    kernels = [add, multiply, arange, vector_add]
    workers, iterations = 4, 50
    barrier = threading.Barrier(workers)
    failures, calls = [], [0] * workers

    def work(thread):
        rng = torch.Generator().manual_seed(thread)
        # threads 0 and 2 start with vv_Addfloat32, 1 and 3 with arangefloat32: each first
        # (compiling) call is raced by two threads while the other pair compiles another.
        order = kernels[2 * (thread % 2):] + kernels[:2 * (thread % 2)]
        try:
            barrier.wait(timeout=60)
            for iteration in range(iterations):
                # mostly small, some large enough to be split over torch's thread pool
                n = 70_001 if iteration % 10 == 3 else 1 + (iteration * 37 + thread * 101) % 3000
                for kernel in order:
                    got, expected = kernel(rng, n, thread)
                    calls[thread] += 1
                    if not torch.equal(got, expected):
                        failures.append(f"thread {thread} iteration {iteration} {kernel.__name__} n={n}: "
                                        f"{int((got != expected).sum())} elements differ")
        except Exception as error:  # noqa: BLE001 - reported below with its thread
            failures.append(f"thread {thread}: {type(error).__name__}: {error}")

    threads = [threading.Thread(target=work, args=(i,), name=f"kernel-caller-{i}") for i in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    assert not any(thread.is_alive() for thread in threads), "a kernel-calling thread hangs"
    assert not failures, "\n".join(failures[:20])
    assert calls == [iterations * len(kernels)] * workers
    # one compile per kernel, however many threads raced for it
    assert len(_cpu_jit._compiled) == len(kernels)
    entries = sorted(os.listdir(tmp_path / "jit"))
    assert len(entries) == len(kernels) and all(name.endswith(".o") for name in entries), entries


def test_torch_set_num_threads_is_respected(mlx_lib):
    """A large call (many chunks for at::parallel_for) gives torch's result with 1 and with
    2 intra-op threads; the previous setting is restored."""
    previous = torch.get_num_threads()
    n = (1 << 22) + 3
    rng = torch.Generator().manual_seed(7)
    a, b = torch.randn(n, generator=rng), torch.randn(n, generator=rng)
    expected = a + b
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            assert torch.get_num_threads() == count
            for group_size in (None, 32, 1024):
                c = torch.full((n,), float("nan"))
                mlx_lib.vv_Addfloat32(a, b, c, n, group_size=group_size)
                assert torch.equal(c, expected), (count, group_size)
                assert torch.get_num_threads() == count  # the call does not change it
    finally:
        torch.set_num_threads(previous)
    assert torch.get_num_threads() == previous


# --- the disk cache -----------------------------------------------------------------------------

# Each script prints one JSON line. "from_disk" lists, for every kernel the process
# compiled, whether its object came from the disk cache (from _cpu_jit's memory cache).

# vv_Addfloat32-like kernel argv[2] of library argv[1], once, checked against torch.
ADD_SCRIPT = r"""
import json, sys, torch, torch_metallib as tm
from torch_metallib.backends.cpu import jit as _cpu_jit
kernel = tm.load(sys.argv[1])[sys.argv[2]]
a = torch.arange(1000, dtype=torch.float32) * 0.5
b = torch.full((1000,), 3.25)
c = torch.full((1000,), float("nan"))
kernel(a, b, c)
print(json.dumps({"from_disk": [k.from_disk for k in _cpu_jit._compiled.values()], "ok": torch.equal(c, a + b)}))
"""

# As ADD_SCRIPT, but after everything up to the call it creates argv[3] and waits for
# argv[4] to exist, so that several processes reach the compile at the same moment.
RACE_SCRIPT = r"""
import json, os, sys, time, torch, torch_metallib as tm
from torch_metallib.backends.cpu import jit as _cpu_jit
kernel = tm.load(sys.argv[1])[sys.argv[2]]
kernel.reflection
a = torch.arange(1000, dtype=torch.float32) * 0.5
b = torch.full((1000,), 3.25)
c = torch.full((1000,), float("nan"))
open(sys.argv[3], "w").close()
deadline = time.monotonic() + 120
while not os.path.exists(sys.argv[4]):
    if time.monotonic() > deadline:
        sys.exit("no go signal")
    time.sleep(0.0002)
kernel(a, b, c)
print(json.dumps({"from_disk": [k.from_disk for k in _cpu_jit._compiled.values()], "ok": torch.equal(c, a + b)}))
"""

# function_constant_scale with the constant sets of argv[2] (JSON: [[use_bias, alpha], ...]),
# in order, each checked against torch.
CONSTANTS_SCRIPT = r"""
import json, sys, torch, torch_metallib as tm
from torch_metallib.backends.cpu import jit as _cpu_jit
kernel = tm.load(sys.argv[1]).function_constant_scale
x = torch.arange(64, dtype=torch.float32) - 20
bias = torch.full((64,), 0.5)
ok = []
for use_bias, alpha in json.loads(sys.argv[2]):
    out = torch.full((64,), float("nan"))
    extra = {"bias": bias} if use_bias else {}
    kernel(x, out, constants={"use_bias": use_bias, "alpha": alpha}, **extra)
    ok.append(torch.equal(out, x * alpha + (bias if use_bias else 0)))
print(json.dumps({"ok": ok, "from_disk": [k.from_disk for k in _cpu_jit._compiled.values()]}))
"""


def run_script(script, *argv, env=None):
    process = subprocess.run([sys.executable, "-c", script, *map(str, argv)], capture_output=True, text=True,
                             timeout=SUBPROCESS_TIMEOUT, env=env)
    assert process.returncode == 0, f"exit {process.returncode}\n{process.stderr[-3000:]}"
    return json.loads(process.stdout.strip().splitlines()[-1])


def files_under(directory):
    """Every file below `directory`, relative, sorted ([] if it does not exist)."""
    found = []
    for root, _dirs, names in os.walk(directory):
        found += [os.path.relpath(os.path.join(root, name), directory) for name in names]
    return sorted(found)


def assert_valid_entry(path, object_file=True):
    """`path` is a complete entry: an 8-byte ASCII magic starting with "TM", the key it
    was written for (u32 length, bytes), the payload length (u64), the SHA-256 of key and
    payload, and the payload (an ELF/Mach-O/COFF object for a JIT entry)."""
    data = open(path, "rb").read()
    assert data[:2] == b"TM" and data[:MAGIC_SIZE].isalnum(), data[:16]
    header = header_size(data)
    key = data[MAGIC_SIZE: MAGIC_SIZE + 4 + (header - MAGIC_SIZE - 44)]
    (size,) = struct.unpack_from("<Q", data, header - 40)
    payload = data[header:]
    assert len(payload) == size > 0, (len(payload), size)
    assert hashlib.sha256(key + payload).digest() == data[header - 32:header]
    if object_file:
        assert payload[:4] in (b"\x7fELF", b"\xcf\xfa\xed\xfe", b"\x64\x86\x00\x00", b"\x64\xaa\x00\x00"), payload[:4]
    return data


def jit_entries(cache_dir):
    """The JIT's entries (names in <cache>/jit); checks that every file anywhere in the
    cache directory is a complete entry and that no temporary file is left."""
    everything = files_under(cache_dir)
    assert not [name for name in everything if ".tmp-" in name], everything
    for name in everything:
        assert_valid_entry(cache_dir / name, object_file=name.startswith("jit" + os.sep))
    return sorted(os.listdir(cache_dir / "jit")) if (cache_dir / "jit").is_dir() else []


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    directory = tmp_path / "cache"
    monkeypatch.setenv("TORCH_METALLIB_CACHE_DIR", str(directory))
    monkeypatch.delenv("TORCH_METALLIB_CACHE", raising=False)
    return directory


@pytest.fixture
def fixture_path(tmp_path, fixture_metallib):
    path = tmp_path / "fixtures.metallib"
    path.write_bytes(fixture_metallib)
    return path


def first_entry(mlx_path, cache_dir, env=None):
    """Runs vv_Addfloat32 once in a fresh process on an empty cache; returns the path of
    the one JIT entry it wrote."""
    assert run_script(ADD_SCRIPT, mlx_path, "vv_Addfloat32", env=env) == {"from_disk": [False], "ok": True}
    entries = jit_entries(cache_dir)
    assert len(entries) == 1 and entries[0].endswith(".o"), entries
    stem = entries[0][:-2]
    assert len(stem) == 64 and all(ch in "0123456789abcdef" for ch in stem), entries  # a SHA-256 key
    return cache_dir / "jit" / entries[0]


@pytest.mark.slow
def test_first_process_writes_one_entry_and_the_next_reuses_it(mlx_path, cache_dir):
    path = first_entry(mlx_path, cache_dir)
    data, mtime = path.read_bytes(), os.stat(path).st_mtime_ns
    others = {name: os.stat(cache_dir / name).st_mtime_ns for name in files_under(cache_dir)}
    time.sleep(0.05)  # so that a rewrite would change the mtime
    for _ in range(2):
        assert run_script(ADD_SCRIPT, mlx_path, "vv_Addfloat32") == {"from_disk": [True], "ok": True}
    assert jit_entries(cache_dir) == [path.name]
    assert os.stat(path).st_mtime_ns == mtime and path.read_bytes() == data
    # nothing else in the cache is rewritten or added either
    assert {name: os.stat(cache_dir / name).st_mtime_ns for name in files_under(cache_dir)} == others


def _flip(data, at):
    return data[:at] + bytes([data[at] ^ 0x40]) + data[at + 1:]


DAMAGE = {
    "truncated_payload": lambda data: data[:header_size(data) + (len(data) - header_size(data)) // 2],
    "truncated_last_byte": lambda data: data[:-1],
    "truncated_inside_header": lambda data: data[:header_size(data) - 5],
    "empty_file": lambda data: b"",
    "flipped_payload_byte": lambda data: _flip(data, header_size(data) + (len(data) - header_size(data)) // 2),
    "flipped_last_byte": lambda data: _flip(data, len(data) - 1),
    "flipped_digest_byte": lambda data: _flip(data, header_size(data) - 29),
    "flipped_key_byte": lambda data: _flip(data, MAGIC_SIZE + 4 + 3),
    "flipped_magic_byte": lambda data: _flip(data, MAGIC_SIZE - 1),
    "length_field_too_large": lambda data: (data[:header_size(data) - 40]
                                            + struct.pack("<Q", len(data) - header_size(data) + 1)
                                            + data[header_size(data) - 32:]),
    "extra_trailing_byte": lambda data: data + b"\0",
}


@pytest.fixture(scope="module")
def good_cache(mlx_path, tmp_path_factory):
    """{relative path: bytes} of every file a first vv_Addfloat32 process writes into an
    empty cache (its JIT entry and whatever else the cache keeps), made once."""
    directory = tmp_path_factory.mktemp("first") / "cache"
    env = {k: v for k, v in os.environ.items() if k != "TORCH_METALLIB_CACHE"}
    env["TORCH_METALLIB_CACHE_DIR"] = str(directory)
    first_entry(mlx_path, directory, env=env)
    return {name: (directory / name).read_bytes() for name in files_under(directory)}


@pytest.mark.slow
@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_entry_is_detected_and_rebuilt(mlx_path, cache_dir, good_cache, damage):
    for name, data in good_cache.items():
        (cache_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (cache_dir / name).write_bytes(data)
    (name,) = [name for name in good_cache if name.startswith("jit" + os.sep)]
    path, good = cache_dir / name, good_cache[name]
    damaged = DAMAGE[damage](good)
    assert damaged != good
    path.write_bytes(damaged)

    # the damaged entry is not used: the kernel is compiled again, with the right result
    assert run_script(ADD_SCRIPT, mlx_path, "vv_Addfloat32") == {"from_disk": [False], "ok": True}
    # ... the entry is written again, whole, and nothing is left behind
    assert jit_entries(cache_dir) == [path.name]
    assert len(assert_valid_entry(path)) == len(good)
    assert sorted(good_cache) == files_under(cache_dir)
    # ... and the next process uses it
    assert run_script(ADD_SCRIPT, mlx_path, "vv_Addfloat32") == {"from_disk": [True], "ok": True}


@pytest.mark.slow
@pytest.mark.parametrize("value", ["0", "off", "False"])
def test_cache_off_writes_nothing(mlx_path, cache_dir, monkeypatch, value):
    monkeypatch.setenv("TORCH_METALLIB_CACHE", value)
    for _ in range(2):
        assert run_script(ADD_SCRIPT, mlx_path, "vv_Addfloat32") == {"from_disk": [False], "ok": True}
    assert files_under(cache_dir) == []


@pytest.mark.slow
def test_cache_off_ignores_an_existing_entry(mlx_path, cache_dir, monkeypatch):
    path = first_entry(mlx_path, cache_dir)
    before = {name: ((cache_dir / name).read_bytes(), os.stat(cache_dir / name).st_mtime_ns)
              for name in files_under(cache_dir)}
    monkeypatch.setenv("TORCH_METALLIB_CACHE", "0")
    assert run_script(ADD_SCRIPT, mlx_path, "vv_Addfloat32") == {"from_disk": [False], "ok": True}
    after = {name: ((cache_dir / name).read_bytes(), os.stat(cache_dir / name).st_mtime_ns)
             for name in files_under(cache_dir)}
    assert after == before and os.path.relpath(path, cache_dir) in after


@pytest.mark.slow
@pytest.mark.parametrize("processes", [2, 4])
def test_processes_compiling_the_same_kernel_at_once(mlx_path, cache_dir, tmp_path, processes):
    """Processes released at the same instant (each waits for a 'go' file after doing
    everything up to the call) all succeed and leave one valid entry, no temporary files."""
    go = tmp_path / "go"
    ready = [tmp_path / f"ready-{i}" for i in range(processes)]
    started = [subprocess.Popen([sys.executable, "-c", RACE_SCRIPT, str(mlx_path), "vv_Addfloat32",
                                 str(ready[i]), str(go)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for i in range(processes)]
    try:
        deadline = time.monotonic() + 120
        while not all(path.exists() for path in ready):
            assert all(p.poll() is None for p in started), "a process ended before it was ready"
            assert time.monotonic() < deadline, "processes did not get ready"
            time.sleep(0.005)
        go.touch()
        results = []
        for process in started:
            stdout, stderr = process.communicate(timeout=SUBPROCESS_TIMEOUT)
            assert process.returncode == 0, stderr[-3000:]
            results.append(json.loads(stdout.strip().splitlines()[-1]))
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert all(result["ok"] and len(result["from_disk"]) == 1 for result in results), results
    entries = jit_entries(cache_dir)  # also: every file complete, no .tmp- file
    assert len(entries) == 1 and entries[0].endswith(".o"), entries
    assert run_script(ADD_SCRIPT, mlx_path, "vv_Addfloat32") == {"from_disk": [True], "ok": True}


@pytest.mark.slow
def test_function_constant_values_get_their_own_entries(fixture_path, cache_dir):
    sets = [[False, 2.0], [False, 3.0], [True, 2.0], [False, 2.0]]  # the last repeats the first
    first = run_script(CONSTANTS_SCRIPT, fixture_path, json.dumps(sets))
    assert first == {"ok": [True] * 4, "from_disk": [False] * 3}
    entries = jit_entries(cache_dir)
    assert len(entries) == 3 and all(name.endswith(".o") for name in entries), entries
    # the payloads differ: the constants are compiled in
    assert len({(data := (cache_dir / "jit" / name).read_bytes())[header_size(data):] for name in entries}) == 3

    # a fresh process finds all three, asked in another order, and adds nothing
    again = run_script(CONSTANTS_SCRIPT, fixture_path, json.dumps(sets[2::-1]))
    assert again == {"ok": [True] * 3, "from_disk": [True] * 3}
    assert jit_entries(cache_dir) == entries

    # a new value is a new entry
    assert run_script(CONSTANTS_SCRIPT, fixture_path, json.dumps([[True, -1.5]])) == {"ok": [True], "from_disk": [False]}
    assert len(jit_entries(cache_dir)) == 4

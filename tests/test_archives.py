"""Ahead-of-time archives: ``python -m torch_metallib precompile`` builds real kernels of
mlx.metallib and the fixtures into an archive; a fresh process loading it runs them on
first call without compiling (the JIT's log says where each kernel came from) and gets
what the JIT computes; other constants, other toolchains and other CPUs fall back to the
JIT; damaged, truncated and foreign archives are refused with ArchiveFormatError."""

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest
import torch

import torch_metallib as tm
from torch_metallib.cache.archive import Target, read_archive, write_archive

pytestmark = pytest.mark.slow  # child processes: precompile, fresh loads, the fuzzer

ROOT = pathlib.Path(__file__).resolve().parent.parent
ELEMENTWISE, COOPERATIVE = "vv_Addfloat32", "rmsfloat32"  # threads; lane loops (SIMD sums, barriers)
SCALE_CONSTANTS = {"use_bias": True, "alpha": 2.0}


def precompile(*args):
    result = subprocess.run([sys.executable, "-m", "torch_metallib", "precompile", *map(str, args)],
                            capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def built(tmp_path_factory, mlx_path, fixture_metallib):
    """(folder, MLX archive, fixtures archive, fixtures library path)."""
    folder = tmp_path_factory.mktemp("archives")
    fixtures = folder / "fixtures.metallib"
    fixtures.write_bytes(fixture_metallib)
    said = precompile(mlx_path, "--kernel", ELEMENTWISE, "--kernel", "rms(float32)", "-j", "2",
                      "-o", folder / "mlx.tmar")
    assert "2 entries (2 kernels; cpu:x86-64-v3)" in said, said
    said = precompile(fixtures, "--kernel", "function_constant_scale", "--constants",
                      json.dumps([SCALE_CONSTANTS]), "-j", "1", "-o", folder / "fixtures.tmar")
    assert "1 entries" in said, said
    return folder, folder / "mlx.tmar", folder / "fixtures.tmar", fixtures


CHILD = r"""
import sys, torch, torch_metallib as tm
library, archives, out = sys.argv[1], sys.argv[2:-1], sys.argv[-1]
torch.manual_seed(0)
results = {}
if library.endswith("mlx.metallib"):
    from torch_metallib import mlx
    lib = tm.load(library, archives=archives)
    a, b = torch.randn(1000), torch.randn(1000)
    c = torch.empty(1000)
    lib.vv_Addfloat32(a, b, c, threads=1000)
    results["add"] = c
    x, w = torch.randn(8, 64), torch.randn(64)
    results["rms"] = mlx.rms_norm(x, w, 1e-5)  # mlx's own library: TORCH_METALLIB_ARCHIVES
else:
    lib = tm.load(library, archives=archives)
    x, bias = torch.randn(256), torch.randn(256)
    for alpha in (2.0, 3.0):  # the archive has 2.0 only
        out_ = torch.empty(256)
        lib.function_constant_scale(x, out_, bias, threads=256, constants={"use_bias": True, "alpha": alpha})
        results[alpha] = out_
torch.save(results, out)
"""


def run_child(tmp_path, library, archives=(), environment=None):
    """(results, the JIT's log lines) of CHILD in a fresh process without a disk cache."""
    out = tmp_path / "results.pt"
    env = {k: v for k, v in os.environ.items() if k != "TORCH_METALLIB_ARCHIVES"}
    env.update({"PYTHONPATH": str(ROOT), "TORCH_METALLIB_CACHE": "0", "TORCH_METALLIB_LOG": "info", **(environment or {})})
    result = subprocess.run([sys.executable, "-c", CHILD, str(library), *map(str, archives), str(out)],
                            capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("torch_metallib ")]
    return torch.load(out), lines


def sources(lines):
    """kernel -> where the JIT took it from ("compiled", "archive", "disk cache")."""
    found = {}
    for line in lines:
        if ": cpu: " in line:
            name, _, rest = line.split(": cpu: ", 1)[1].partition(": ")
            found[name] = "archive" if "from archive" in rest else "compiled" if rest.startswith("compiled") else rest
    return found


@pytest.fixture(scope="module")
def without_archive(built, tmp_path_factory, mlx_path):
    folder, _, _, fixtures = built
    mlx_results, mlx_lines = run_child(tmp_path_factory.mktemp("plain"), mlx_path)
    fixture_results, _ = run_child(tmp_path_factory.mktemp("plain"), fixtures)
    assert sources(mlx_lines) == {ELEMENTWISE: "compiled", COOPERATIVE: "compiled"}
    return mlx_results, fixture_results


def test_first_calls_take_the_archive_and_compute_what_the_jit_does(built, without_archive, tmp_path, mlx_path):
    _, mlx_archive, _, _ = built
    results, lines = run_child(tmp_path, mlx_path, [mlx_archive], {"TORCH_METALLIB_ARCHIVES": str(mlx_archive)})
    assert sources(lines) == {ELEMENTWISE: "archive", COOPERATIVE: "archive"}, lines
    assert any("rmsfloat32: loaded from archive" in line and "(as lanes)" in line for line in lines), lines
    for name, expected in without_archive[0].items():
        assert torch.equal(results[name], expected), name


def test_the_environment_variable_serves_every_library(built, tmp_path, mlx_path):
    _, mlx_archive, _, _ = built
    _, lines = run_child(tmp_path, mlx_path, [], {"TORCH_METALLIB_ARCHIVES": str(mlx_archive)})
    assert sources(lines) == {ELEMENTWISE: "archive", COOPERATIVE: "archive"}, lines
    _, lines = run_child(tmp_path, mlx_path, [mlx_archive])  # mlx.rms_norm's library was loaded without it
    assert sources(lines) == {ELEMENTWISE: "archive", COOPERATIVE: "compiled"}, lines


def test_other_constants_fall_back_to_the_jit(built, without_archive, tmp_path):
    _, _, fixture_archive, fixtures = built
    results, lines = run_child(tmp_path, fixtures, [fixture_archive])
    loaded = [line for line in lines if "function_constant_scale" in line]
    assert len(loaded) == 2 and "from archive" in loaded[0] and ": compiled" in loaded[1], lines
    for alpha, expected in without_archive[1].items():
        assert torch.equal(results[alpha], expected), alpha


def test_an_archive_serves_only_its_functions(built, tmp_path, mlx_path):
    """The fixtures' archive has nothing for MLX's kernels (another HASH)."""
    _, _, fixture_archive, _ = built
    _, lines = run_child(tmp_path, mlx_path, [fixture_archive])
    assert sources(lines) == {ELEMENTWISE: "compiled", COOPERATIVE: "compiled"}, lines


def rewritten(path, **changes) -> bytes:
    """The archive at `path` with its targets' fields changed."""
    archive = read_archive(path)
    targets = {t: Target(**{**t.__dict__, **changes}) for t in archive.targets}
    entries = []
    for entry in archive.entries.values():
        payload = archive.lookup(entry.target.name, entry.hash, entry.constants, entry.form)[1]
        entries.append((type(entry)(**{**entry.__dict__, "target": targets[entry.target]}), payload))
    return write_archive(list(targets.values()), entries)


@pytest.mark.parametrize("changes,warning", [
    ({"toolchain": "llvmlite 0.0 llvm (1, 0, 0) x86_64-unknown-linux-gnu code 0"}, "built by another toolchain"),
    ({"features": ("avx512f", "not-a-real-feature")}, "need CPU features this machine lacks (not-a-real-feature)"),
])
def test_archives_for_another_toolchain_or_cpu_are_passed_over(built, without_archive, tmp_path, mlx_path, changes,
                                                               warning):
    _, mlx_archive, _, _ = built
    other = tmp_path / "other.tmar"
    other.write_bytes(rewritten(mlx_archive, **changes))
    results, lines = run_child(tmp_path, mlx_path, [other])
    assert sources(lines) == {ELEMENTWISE: "compiled", COOPERATIVE: "compiled"}, lines
    warnings = [line for line in lines if "WARNING" in line]
    assert len(warnings) == 1 and warning in warnings[0], lines
    assert torch.equal(results["add"], without_archive[0]["add"])


def test_damaged_truncated_and_foreign_archives_are_refused(built, mlx_path, tmp_path):
    _, mlx_archive, _, _ = built
    data = mlx_archive.read_bytes()
    archive = read_archive(data)
    entry = next(iter(archive.entries.values()))
    cases = {
        "payload": (bytearray(data), entry.offset + entry.size // 2, "payload SHA-256"),
        "index": (bytearray(data), 100, "index SHA-256"),
        "version": (bytearray(data), 8, "format version"),
    }
    for label, (damaged, at, field) in cases.items():
        damaged[at] ^= 0x40
        with pytest.raises(tm.ArchiveFormatError, match=field) as raised:
            tm.load(mlx_path, archives=[bytes(damaged)])
        assert raised.value.offset is not None and "expected" in str(raised.value), label
    with pytest.raises(tm.ArchiveFormatError, match="file size at byte offset 16: expected the file's 500 bytes"):
        tm.load(mlx_path, archives=[data[:500]])
    path = tmp_path / "foreign.tmar"
    path.write_bytes(pathlib.Path(mlx_path).read_bytes()[:4096])
    with pytest.raises(tm.ArchiveFormatError, match=r"magic at byte offset 0: expected b'TMARCHIV', got b'MTLB"):
        tm.load(mlx_path, archives=[path])
    with pytest.raises(tm.ArchiveFormatError, match="header at byte offset 0: expected 88 bytes"):
        tm.load(mlx_path, archives=[b"TMARCHIV"])


def test_a_damaged_archive_in_the_environment_is_skipped_with_a_warning(built, without_archive, tmp_path, mlx_path):
    _, mlx_archive, _, _ = built
    damaged = tmp_path / "damaged.tmar"
    damaged.write_bytes(mlx_archive.read_bytes()[:-1])
    results, lines = run_child(tmp_path, mlx_path, [], {"TORCH_METALLIB_ARCHIVES": str(damaged)})
    assert sources(lines) == {ELEMENTWISE: "compiled", COOPERATIVE: "compiled"}, lines
    assert any("TORCH_METALLIB_ARCHIVES: skipping" in line and "file size" in line for line in lines), lines
    assert torch.equal(results["rms"], without_archive[0]["rms"])


def test_mutated_archives_never_crash_hang_or_raise_foreign_errors(built, tmp_path, fixture_metallib):
    """tools/fuzz_archive.py: each case in a forked worker, with the metallib fuzzer's mutations."""
    _, mlx_archive, fixture_archive, fixtures = built
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "fuzz_archive.py"), "--cases", "3000", "--jobs",
                             "2", "--out", str(tmp_path / "findings"), "--library", str(fixtures), str(mlx_archive),
                             str(fixture_archive)], capture_output=True, text=True, timeout=600,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert summary.startswith("cases 3000 ") and "crashes 0 hangs 0 foreign 0" in summary, summary
    counts = dict(zip(summary.split()[::2], summary.split()[1::2]))
    assert int(counts["rejected"]) > 2500, summary


def test_precompile_refuses_unknown_targets_and_kernels(mlx_path, tmp_path):
    for args, message in ((["--kernel", ELEMENTWISE, "--target", "cpu:pentium"], "unknown CPU level"),
                          (["--kernel", "no_such_kernel_at_all"], "no function 'no_such_kernel_at_all'")):
        result = subprocess.run([sys.executable, "-m", "torch_metallib", "precompile", str(mlx_path), *args, "-o",
                                 str(tmp_path / "x.tmar")], capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert result.returncode == 1 and message in result.stderr, result.stderr


def test_cuda_ptx_is_archived_per_architecture(mlx_path, mlx_lib, tmp_path, monkeypatch, caplog):
    """PTX needs no GPU to build: the CUDA backend's kernel takes it from the archive, the
    same text its lowering makes, and compiles for an architecture the archive lacks."""
    import logging

    from torch_metallib.backends.cuda.backend import CudaKernel, grid_only
    from torch_metallib.backends.cuda.ptx import kernel_ptx

    archive = tmp_path / "cuda.tmar"
    said = precompile(mlx_path, "--kernel", ELEMENTWISE, "--target", "cuda:sm_80", "-j", "1", "-o", archive)
    assert "1 entries (1 kernels; cuda:sm_80)" in said, said
    monkeypatch.setenv("TORCH_METALLIB_CACHE", "0")
    monkeypatch.setenv("TORCH_METALLIB_ARCHIVES", str(archive))
    caplog.set_level(logging.INFO, logger="torch_metallib")
    function = mlx_lib[ELEMENTWISE]
    state = function._dispatch_state()
    only = grid_only(function, state.cooperative, state.serial)
    kernel = CudaKernel(function, (), only)
    assert kernel.ptx("sm_80") == kernel_ptx(function, {}, kernel.symbol, "sm_80", only)
    kernel.ptx("sm_90")
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"cuda: {ELEMENTWISE}")]
    assert "loaded from an archive (sm_80)" in said[0] and "compiled (sm_90)" in said[1], said


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (CUDA)")
def test_archived_ptx_runs_on_the_gpu(mlx_path, tmp_path, monkeypatch, caplog):
    """On a GPU: the archive's PTX for this GPU's architecture is what the call loads and
    runs, with the JIT's result."""
    import logging

    major, minor = torch.cuda.get_device_capability()
    arch = f"sm_{major}{minor}"
    archive = tmp_path / "gpu.tmar"
    precompile(mlx_path, "--kernel", ELEMENTWISE, "--target", f"cuda:{arch}", "-j", "1", "-o", archive)
    monkeypatch.setenv("TORCH_METALLIB_CACHE", "0")
    caplog.set_level(logging.INFO, logger="torch_metallib")
    function = tm.load(mlx_path, archives=[str(archive)])[ELEMENTWISE]
    a, b = torch.randn(5000, device="cuda"), torch.randn(5000, device="cuda")
    out = torch.empty_like(a)
    function(a, b, out, threads=5000)
    torch.cuda.synchronize()
    assert torch.equal(out, a + b)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"cuda: {ELEMENTWISE}")]
    assert said and f"loaded from an archive ({arch})" in said[0], said


def test_archives_carry_call_records_so_first_calls_skip_reflection(built, mlx_lib, monkeypatch):
    from torch_metallib.dispatch import call_record

    _, mlx_archive, _, _ = built
    archive = read_archive(mlx_archive)
    records = {e.function for e in archive.entries.values() if e.target.name == call_record.RECORD_TARGET}
    assert records == {ELEMENTWISE, COOPERATIVE}
    monkeypatch.setenv("TORCH_METALLIB_CACHE", "0")
    monkeypatch.setenv("TORCH_METALLIB_ARCHIVES", str(mlx_archive))
    fresh = tm.load(mlx_lib.subset([COOPERATIVE]))[COOPERATIVE]
    assert call_record.cached_call_record(fresh) == call_record.call_record(mlx_lib[COOPERATIVE])
    assert fresh._reflection is None  # the record came from the archive, not from the bitcode


LINK_ONLY = r"""
import sys, torch, torch_metallib as tm
from torch_metallib.backends.cpu import jit
lib = tm.load(sys.argv[1], archives=[sys.argv[2]])
a, b, c = torch.randn(1000), torch.randn(1000), torch.empty(1000)
lib.vv_Addfloat32(a, b, c, threads=1000)
print(torch.equal(c, a + b), jit._host is None, {k.from_disk for k in jit._compiled.values()} == {True})
"""


def test_an_archived_kernel_loads_without_the_compile_target_machine(built, mlx_path):
    """A process whose kernels all come from an archive never makes the target machine
    that compiling needs, nor reads the CPU's name for the disk cache's key: its first
    call only links the object."""
    _, mlx_archive, _, _ = built
    env = {k: v for k, v in os.environ.items() if k != "TORCH_METALLIB_ARCHIVES"}
    result = subprocess.run([sys.executable, "-c", LINK_ONLY, str(mlx_path), str(mlx_archive)], capture_output=True,
                            text=True, timeout=600, env={**env, "PYTHONPATH": str(ROOT), "TORCH_METALLIB_CACHE": "0"})
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.split() == ["True", "True", "True"], result.stdout


def test_constants_per_kernel_and_kernels_that_cannot_be_built(built, tmp_path):
    """An object of per-kernel lists: every combination for its kernels, names checked;
    kernels whose required constants are not given are named and skipped."""
    _, _, _, fixtures = built
    constants = tmp_path / "constants.json"
    constants.write_text(json.dumps({"function_constant_.*": [SCALE_CONSTANTS, {"use_bias": False, "alpha": 1.0}],
                                     "vector_add_float": [{"no_such_constant": 1}]}))
    said = precompile(fixtures, "--kernel", "function_constant_scale", "--kernel", "vector_add_float",
                      "--constants", f"@{constants}", "-j", "1", "-o", tmp_path / "a.tmar")
    assert "skipped vector_add_float with constants {\"no_such_constant\": 1}: vector_add_float: constants: no " \
           "function constant 'no_such_constant'" in said, said
    assert "2 entries (1 kernels; cpu:x86-64-v3) and 1 call records" in said, said
    forms = sorted(key[2] for key in read_archive(tmp_path / "a.tmar").entries if key[0] == "cpu:x86-64-v3")
    assert forms == ["((0, 0), (1, 1.0))", "((0, 1), (1, 2.0))"], forms  # as calls canonicalize them
    result = subprocess.run([sys.executable, "-m", "torch_metallib", "precompile", str(fixtures), "--kernel",
                             "function_constant_scale", "-o", str(tmp_path / "b.tmar")], capture_output=True,
                            text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 1 and "missing function constants: use_bias (bool, index 0)" in result.stdout
    assert "nothing was compiled" in result.stderr and not (tmp_path / "b.tmar").exists()


@pytest.mark.skipif(shutil.which("objdump") is None, reason="needs binutils' objdump to read the objects")
def test_cpu_objects_use_only_their_levels_instructions(mlx_path, tmp_path):
    """Built on any machine (this one may have AVX-512), an x86-64-v2 object has no AVX
    (VEX) instruction and an x86-64-v3 one no AVX-512 register: they run on other CPUs."""
    archive = tmp_path / "levels.tmar"
    precompile(mlx_path, "--kernel", ELEMENTWISE, "--target", "cpu:x86-64-v2", "--target", "cpu:x86-64-v3", "-j", "2",
               "-o", archive)
    found = {}
    opened = read_archive(archive)
    for key, entry in opened.entries.items():
        if key[0].startswith("cpu:"):
            (tmp_path / "object.o").write_bytes(opened.lookup(*key)[1])
            listing = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(tmp_path / "object.o")],
                                     capture_output=True, text=True, check=True).stdout
            mnemonics = [line.split("\t", 1)[1].split()[0] for line in listing.splitlines()
                         if re.match(r"\s+[0-9a-f]+:\t\S", line)]
            found[key[0]] = (mnemonics, listing)
    v2, listing2 = found["cpu:x86-64-v2"]
    v3, listing3 = found["cpu:x86-64-v3"]
    assert v2 and v3
    assert "ymm" not in listing2 and not [m for m in v2 if m.startswith(("vmov", "vadd", "vfmadd", "vbroadcast"))]
    assert "zmm" not in listing3 and "ymm" in listing3  # AVX2 vectors, no AVX-512

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


def precompile(*args, environment=None):
    result = subprocess.run([sys.executable, "-m", "torch_metallib", "precompile", *map(str, args)],
                            capture_output=True, text=True, timeout=600, cwd=ROOT, env={**os.environ, **(environment or {})})
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


def test_mutated_archives_never_crash_hang_or_raise_foreign_errors(built, tmp_path, fixture_metallib, request):
    """tools/fuzz_archive.py: each case in a forked worker, with the metallib fuzzer's mutations
    (and an archive with cubins where ptxas can build one)."""
    _, mlx_archive, fixture_archive, fixtures = built
    seeds = [mlx_archive, fixture_archive] + ([request.getfixturevalue("cuda_archive")] if _ptxas() else [])
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "fuzz_archive.py"), "--cases", "3000", "--jobs",
                             "2", "--out", str(tmp_path / "findings"), "--library", str(fixtures), *map(str, seeds)],
                            capture_output=True, text=True, timeout=600,
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
    assert ("2 entries (1 kernels; cuda:sm_80; 1 of them cubins" if _ptxas() else "1 entries (1 kernels; cuda:sm_80)") \
        in said, said
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
    """On a GPU: the archive's PTX for this GPU's architecture (no ptxas: no cubin) is what
    the call loads and runs, with the JIT's result."""
    import logging

    major, minor = torch.cuda.get_device_capability()
    arch = f"sm_{major}{minor}"
    archive = tmp_path / "gpu.tmar"
    precompile(mlx_path, "--kernel", ELEMENTWISE, "--target", f"cuda:{arch}", "-j", "1", "-o", archive,
               environment={"PTXAS": str(tmp_path / "no-ptxas")})
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
    """And operator summaries, so that ops.define skips it too (tests/test_ops_kernel_summary.py
    defines every MLX operator from an archive)."""
    from torch_metallib.dispatch import call_record
    from torch_metallib.ops import _kernel_summary

    _, mlx_archive, _, _ = built
    archive = read_archive(mlx_archive)
    for target in (call_record.RECORD_TARGET, _kernel_summary.SUMMARY_TARGET):
        assert {e.function for e in archive.entries.values() if e.target.name == target} == {ELEMENTWISE, COOPERATIVE}
    monkeypatch.setenv("TORCH_METALLIB_CACHE", "0")
    monkeypatch.setenv("TORCH_METALLIB_ARCHIVES", str(mlx_archive))
    monkeypatch.setattr(_kernel_summary, "_summaries", {})
    fresh = tm.load(mlx_lib.subset([COOPERATIVE]))[COOPERATIVE]
    assert call_record.cached_call_record(fresh) == call_record.call_record(mlx_lib[COOPERATIVE])
    summary = _kernel_summary.kernel_summary(fresh)
    assert fresh._reflection is None  # the record and the summary came from the archive, not from the bitcode
    assert (summary.buffers, summary.function_constants) == (mlx_lib[COOPERATIVE].buffers,
                                                             mlx_lib[COOPERATIVE].function_constants)


def test_archives_without_summaries_still_serve_their_call_records(built, mlx_lib, monkeypatch, tmp_path):
    """An archive written before summaries were stored (no ``ops`` target) loads as before:
    its call records are used and the summary comes from reflection."""
    from torch_metallib.dispatch import call_record
    from torch_metallib.ops import _kernel_summary

    _, mlx_archive, _, _ = built
    archive = read_archive(mlx_archive)
    kept = [(e, archive.lookup(*key)[1]) for key, e in archive.entries.items()
            if e.target.name != _kernel_summary.SUMMARY_TARGET]
    older = tmp_path / "older.tmar"
    older.write_bytes(write_archive([t for t in archive.targets if t.name != _kernel_summary.SUMMARY_TARGET], kept))
    monkeypatch.setenv("TORCH_METALLIB_CACHE", "0")
    monkeypatch.setattr(_kernel_summary, "_summaries", {})
    fresh = tm.load(mlx_lib.subset([COOPERATIVE]), archives=[older])[COOPERATIVE]
    assert call_record.cached_call_record(fresh) == call_record.call_record(mlx_lib[COOPERATIVE])
    assert fresh._reflection is None
    assert _kernel_summary.kernel_summary(fresh).buffers == mlx_lib[COOPERATIVE].buffers
    assert fresh._reflection is not None


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
    # Records and summaries of both kernels: they do not depend on the constants.
    assert "2 entries (1 kernels; cpu:x86-64-v3) and 2 call records and as many operator summaries" in said, said
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


# --- CUDA cubins ---------------------------------------------------------------------------

def _ptxas():
    from torch_metallib.backends.cuda.archived import ptxas_for_archives

    return ptxas_for_archives()[0]


needs_ptxas = pytest.mark.skipif(_ptxas() is None, reason="needs CUDA's ptxas (precompile assembles cubins with it)")


@pytest.fixture(scope="module")
def cuda_archive(tmp_path_factory, mlx_path):
    """An archive of PTX and cubins for sm_80 and sm_90 (ptxas installed)."""
    if _ptxas() is None:
        pytest.skip("needs CUDA's ptxas (precompile assembles cubins with it)")
    path = tmp_path_factory.mktemp("cuda") / "cubins.tmar"
    said = precompile(mlx_path, "--kernel", ELEMENTWISE, "--kernel", "rms(float32)", "--target", "cuda:sm_80,sm_90",
                      "-j", "2", "-o", path)
    assert "8 entries (2 kernels; cuda:sm_80, cuda:sm_90; 4 of them cubins, by ptxas V" in said, said
    return path


def with_payloads(path, replace) -> bytes:
    """The archive at `path` with each payload `replace(entry, payload)` gives (None: kept)
    in its place: new SHA-256s, so the reader takes it."""
    archive = read_archive(path)
    entries = []
    for key, entry in archive.entries.items():
        payload = archive.lookup(*key)[1]
        entries.append((entry, replace(entry, payload) or payload))
    return write_archive(archive.targets, entries)


@needs_ptxas
def test_cubins_are_archived_per_architecture_beside_the_ptx(cuda_archive):
    """Each kernel's cubin is ptxas's ELF for exactly its target's architecture, its entry
    the PTX's, its toolchain the PTX's with the ptxas version after it."""
    import struct

    from torch_metallib.backends.cuda.archived import cubin_problem, cubin_toolchain, cuda_toolchain, ptxas_version

    archive = read_archive(cuda_archive)
    cubins = {}
    for (target, _, constants, form), entry in archive.entries.items():
        if target.startswith("cuda:") and form.startswith("cubin"):
            cubins[(target, entry.function)] = entry, archive.lookup(target, entry.hash, constants, form)[1]
    assert set(cubins) == {(f"cuda:{arch}", name) for arch in ("sm_80", "sm_90") for name in (ELEMENTWISE, COOPERATIVE)}
    for (target, name), (entry, image) in cubins.items():
        flags = struct.unpack_from("<I", image, 48)[0]
        number = int(target.split("_")[1])
        assert image[:4] == b"\x7fELF" and struct.unpack_from("<H", image, 18)[0] == 190  # EM_CUDA
        assert number in (flags & 0xFF, (flags >> 8) & 0xFF), (target, hex(flags))  # the SM, by ABI version
        assert cubin_problem(image) is None
        assert entry.target.toolchain == cubin_toolchain(ptxas_version(_ptxas()))
        ptx_form = entry.form.replace("cubin", "ptx")
        ptx_entry, ptx = archive.lookup(target, entry.hash, entry.constants, ptx_form)
        assert ptx_entry.target.toolchain == cuda_toolchain()
        assert f".entry {entry.symbol}(".encode() in ptx and entry.symbol.encode() + b"\0" in image
    assert cubins[("cuda:sm_80", ELEMENTWISE)][1] != cubins[("cuda:sm_90", ELEMENTWISE)][1]
    assert cubins[("cuda:sm_90", ELEMENTWISE)][0].form == "cubin+grid-only"  # coarsened: its entry says so
    assert cubins[("cuda:sm_90", ELEMENTWISE)][0].symbol.endswith("_x4")


def test_precompile_without_ptxas_stores_ptx_only_and_says_so(mlx_path, tmp_path):
    path = tmp_path / "ptx.tmar"
    result = subprocess.run([sys.executable, "-m", "torch_metallib", "precompile", str(mlx_path), "--kernel",
                             ELEMENTWISE, "--kernel", "rms(float32)", "--target", "cuda:sm_80,sm_90", "-j", "2", "-o",
                             str(path)], capture_output=True, text=True, timeout=600, cwd=ROOT,
                            env={**os.environ, "PTXAS": str(tmp_path / "no-ptxas")})
    assert result.returncode == 0, result.stdout + result.stderr
    said = [line for line in result.stdout.splitlines() if not line.startswith("wrote ")]
    assert said == [f"ptxas {tmp_path / 'no-ptxas'} (PTXAS) is not an executable file: storing PTX only, no cubins "
                    "(a GPU's driver compiles the PTX when it loads it)"], result.stdout
    forms = sorted(key[3] for key in read_archive(path).entries if key[0].startswith("cuda:"))
    assert forms == ["ptx", "ptx", "ptx+grid-only", "ptx+grid-only"], forms
    assert "4 entries (2 kernels; cuda:sm_80, cuda:sm_90) and 2 call records" in result.stdout, result.stdout


@needs_ptxas
def test_the_cubin_check_refuses_damaged_headers_and_never_raises(cuda_archive):
    """The driver is given no length: a cubin whose headers point outside its bytes is
    refused before it; every truncation is; 3,000 overwritten headers never raise."""
    import random
    import struct

    from torch_metallib.backends.cuda.archived import cubin_problem

    archive = read_archive(cuda_archive)
    image = next(archive.lookup(*key)[1] for key in archive.entries if key[3].startswith("cubin"))
    assert all(cubin_problem(image[:size]) for size in range(len(image)))
    shoff, shnum = struct.unpack_from("<Q", image, 40)[0], struct.unpack_from("<H", image, 60)[0]
    far = bytearray(image)
    struct.pack_into("<Q", far, shoff + 64 + 32, len(image))  # section 1's size: past the end
    assert "section 1:" in cubin_problem(bytes(far)) and "past its" in cubin_problem(bytes(far))
    moved = bytearray(image)
    struct.pack_into("<Q", moved, 40, len(image) - 64 * shnum + 1)
    assert "section headers" in cubin_problem(bytes(moved))
    assert "not a 64-bit little-endian ELF" in cubin_problem(b"\0" * 64)
    rng = random.Random(7)
    refused = 0
    for _ in range(3000):
        damaged = bytearray(image)
        at = rng.choice([rng.randrange(64), shoff + rng.randrange(64 * shnum), rng.randrange(len(image))])
        damaged[at:at + 8] = rng.randbytes(8)
        problem = cubin_problem(bytes(damaged))
        assert problem is None or isinstance(problem, str)
        refused += problem is not None
    assert refused > 1000, refused


class FakeDriver:
    """The driver's calls a kernel's load makes, recorded; `refuse`: cuModuleLoadData's error."""

    def __init__(self, capability, refuse=None):
        self.capability, self.refuse, self.calls = capability, refuse, []

    def compute_capability(self, index):
        return self.capability

    def load_cubin(self, image, entry):
        self.calls.append(("cubin", image, entry))
        if self.refuse:
            raise tm.KernelExecutionError(self.refuse)
        return "cubin kernel"

    def load(self, ptx, entry, threads=0):
        self.calls.append(("ptx", ptx, entry))
        return "ptx kernel"

    def attribute(self, function, attribute):
        return 1024 if attribute == 0 else 0


def load_with(monkeypatch, caplog, mlx_path, archive, driver, threads=0):
    """(what the fake driver was asked, the kernel's load, log lines) of ELEMENTWISE's first
    load from `archive` on a device of the driver's compute capability."""
    import logging

    from torch_metallib.backends.cuda import driver as cuda_driver
    from torch_metallib.backends.cuda.backend import CudaKernel

    monkeypatch.setattr(cuda_driver, "driver", lambda: driver)
    monkeypatch.setenv("TORCH_METALLIB_CACHE", "0")
    caplog.clear()
    caplog.set_level(logging.INFO, logger="torch_metallib")
    function = tm.load(mlx_path, archives=[str(archive)])[ELEMENTWISE]
    loaded = CudaKernel(function, (), True).loaded(0, threads)
    return driver.calls, loaded, [r.getMessage() for r in caplog.records]


@needs_ptxas
def test_a_gpu_of_the_cubins_architecture_loads_the_cubin(cuda_archive, mlx_path, monkeypatch, caplog):
    """Exactly sm_90: its cubin, nothing compiled; a block larger than the cubin allows and
    an sm_86 GPU (SASS is not portable to it) take PTX."""
    archive = read_archive(cuda_archive)
    want = next((e, archive.lookup(*k)[1]) for k, e in archive.entries.items()
                if k[0] == "cuda:sm_90" and e.function == ELEMENTWISE and e.form == "cubin+grid-only")
    calls, loaded, said = load_with(monkeypatch, caplog, mlx_path, cuda_archive, FakeDriver(90))
    assert calls == [("cubin", want[1], want[0].symbol)] and loaded[0] == "cubin kernel" and loaded[3] == 4
    assert any(f"{ELEMENTWISE}: loaded from an archive (sm_90 cubin, ptxas V" in line for line in said), said
    calls, loaded, said = load_with(monkeypatch, caplog, mlx_path, cuda_archive, FakeDriver(90), threads=2048)
    assert [call[0] for call in calls] == ["ptx"] and loaded[3] == 4
    calls, _, said = load_with(monkeypatch, caplog, mlx_path, cuda_archive, FakeDriver(86))
    assert [call[0] for call in calls] == ["ptx"] and any("compiled (sm_86)" in line for line in said), said


@needs_ptxas
@pytest.mark.parametrize("damage", ["refused by the driver", "garbage with a valid SHA-256", "another entry point"])
def test_a_cubin_that_cannot_load_falls_back_to_the_ptx_with_one_warning(cuda_archive, mlx_path, monkeypatch, caplog,
                                                                          tmp_path, damage):
    import dataclasses

    archive = read_archive(cuda_archive)
    ptx = next(archive.lookup(*k)[1] for k, e in archive.entries.items()
               if k[0] == "cuda:sm_90" and e.function == ELEMENTWISE and e.form == "ptx+grid-only")
    path = tmp_path / f"{damage.split()[0]}.tmar"
    refuse = None
    if damage == "refused by the driver":
        refuse = "CUDA driver: cuModuleLoadData failed with error 209 (no kernel image is available for execution)"
        path.write_bytes(cuda_archive.read_bytes())
    elif damage == "another entry point":
        data = read_archive(cuda_archive)
        entries = [(dataclasses.replace(e, symbol="main") if e.form.startswith("cubin") else e, data.lookup(*k)[1])
                   for k, e in data.entries.items()]
        path.write_bytes(write_archive(data.targets, entries))
    else:
        path.write_bytes(with_payloads(cuda_archive, lambda e, p: bytes(range(256)) * 8 if e.form.startswith("cubin")
                                       else None))
    calls, loaded, said = load_with(monkeypatch, caplog, mlx_path, path, FakeDriver(90, refuse))
    assert calls[-1] == ("ptx", ptx.decode(), calls[-1][2]) and loaded[0] == "ptx kernel"
    assert [call[0] for call in calls] == (["cubin", "ptx"] if refuse else ["ptx"])
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    why = {"refused by the driver": "cuModuleLoadData failed with error 209",
           "garbage with a valid SHA-256": "not a 64-bit little-endian ELF file",
           "another entry point": "its entry 'main' is not this kernel's"}[damage]
    assert len(warnings) == 1 and warnings[0].startswith(f"archive {path}: {ELEMENTWISE}: its sm_90 cubin (ptxas V")
    assert why in warnings[0] and "Loading the kernel's PTX instead" in warnings[0], warnings
    assert any(f"{ELEMENTWISE}: loaded from an archive (sm_90)" in line for line in said), said


def gpu_arch() -> str:
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (CUDA)")
@needs_ptxas
def test_archived_cubins_run_on_the_gpu_with_the_jits_results(mlx_path, tmp_path, monkeypatch, caplog):
    """An archive built for this GPU's architecture: both kernels load its cubins (nothing
    compiled, by us or the driver) and compute what the JIT's PTX computes."""
    import logging

    arch = gpu_arch()
    archive = tmp_path / "gpu.tmar"
    precompile(mlx_path, "--kernel", ELEMENTWISE, "--kernel", "rms(float32)", "--target", f"cuda:{arch}", "-j", "2",
               "-o", archive)
    monkeypatch.setenv("TORCH_METALLIB_CACHE", "0")
    caplog.set_level(logging.INFO, logger="torch_metallib")
    a, b = torch.randn(5000, device="cuda"), torch.randn(5000, device="cuda")
    x, w = torch.randn(64, 1024, device="cuda"), torch.randn(1024, device="cuda")
    results = {}
    for label, archives in (("cubin", [str(archive)]), ("jit", None)):
        library = tm.load(mlx_path, archives=archives)
        out = torch.empty_like(a)
        library[ELEMENTWISE](a, b, out, threads=5000)
        normed = torch.empty_like(x)
        library[COOPERATIVE](x, w, normed, eps=1e-5, axis_size=1024, w_stride=1, threads=64 * 256, group_size=256)
        torch.cuda.synchronize()
        results[label] = out, normed
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("cuda: ")]
    for name in (ELEMENTWISE, COOPERATIVE):
        assert any(f"{name}: loaded from an archive ({arch} cubin, ptxas V" in line for line in said), said
    assert not any("WARNING" == r.levelname for r in caplog.records), said
    assert torch.equal(results["cubin"][0], a + b) and torch.equal(results["jit"][0], a + b)
    # ptxas and the driver's JIT may be different versions: the same PTX, maybe other SASS.
    torch.testing.assert_close(results["cubin"][1], results["jit"][1], rtol=1e-6, atol=1e-6)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (CUDA)")
@needs_ptxas
def test_a_cubin_the_driver_refuses_falls_back_to_the_ptx_on_the_gpu(mlx_path, tmp_path, monkeypatch, caplog):
    """This GPU's cubins replaced by another major architecture's (SASS does not run
    across majors): cuModuleLoadData's error, one warning, the archive's PTX, right results."""
    import logging

    arch = gpu_arch()
    other = "sm_80" if not arch.startswith("sm_8") else "sm_90"
    both = tmp_path / "both.tmar"
    precompile(mlx_path, "--kernel", ELEMENTWISE, "--target", f"cuda:{arch},{other}", "-j", "2", "-o", both)
    opened = read_archive(both)
    foreign = {e.function: opened.lookup(*k)[1] for k, e in opened.entries.items()
               if k[0] == f"cuda:{other}" and e.form.startswith("cubin")}
    swapped = tmp_path / "swapped.tmar"
    swapped.write_bytes(with_payloads(both, lambda e, p: foreign[e.function] if e.form.startswith("cubin")
                                      and e.target.name == f"cuda:{arch}" else None))
    monkeypatch.setenv("TORCH_METALLIB_CACHE", "0")
    caplog.set_level(logging.INFO, logger="torch_metallib")
    function = tm.load(mlx_path, archives=[str(swapped)])[ELEMENTWISE]
    a, b = torch.randn(5000, device="cuda"), torch.randn(5000, device="cuda")
    for _ in range(2):
        out = torch.empty_like(a)
        function(a, b, out, threads=5000)
        torch.cuda.synchronize()
        assert torch.equal(out, a + b)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and f"archive {swapped}: {ELEMENTWISE}: its {arch} cubin" in warnings[0], warnings
    assert "cuModuleLoadData failed with error" in warnings[0], warnings
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"cuda: {ELEMENTWISE}")]
    assert said == [f"cuda: {ELEMENTWISE}: loaded from an archive ({arch})" + said[0].rsplit(")", 1)[1]], said

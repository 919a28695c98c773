"""`python -m torch_metallib doctor [--json]`: the report's data, and a self-test that
really runs the kernels and fails when one computes something else."""

import json
import os
import subprocess
import sys

import llvmlite
import pytest
import torch

import torch_metallib as tm
from torch_metallib.cli import doctor, doctor_backends, doctor_kernels, doctor_selftest
from torch_metallib.cli.main import main

KEYS = {"schema", "versions", "cpu", "cuda", "metal", "backends", "caches", "self_test", "passed", "seconds"}
CHECKS = ["kernel", "cooperative", "operator"]


def run_doctor(*args, env=None):
    return subprocess.run([sys.executable, "-m", "torch_metallib", "doctor", *args], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, **(env or {})))


def in_process(capsys, *args):
    status = main(["doctor", *args])
    return status, capsys.readouterr().out


@pytest.fixture(scope="module")
def cache_runs(tmp_path_factory):
    """Two `doctor --json` runs as a user would start them, in a fresh disk cache."""
    cache = tmp_path_factory.mktemp("doctor-cache")
    runs = [run_doctor("--json", env={"TORCH_METALLIB_CACHE_DIR": str(cache)}) for _ in range(2)]
    return cache, runs


def test_json_is_one_object_with_every_section(cache_runs):
    _, (first, _) = cache_runs
    assert first.returncode == 0, first.stderr
    report = json.loads(first.stdout)  # the whole of stdout is one JSON object
    assert set(report) == KEYS and report["schema"] == "torch_metallib.doctor/1"
    versions = report["versions"]
    assert versions["torch_metallib"] == tm.__version__ and versions["torch"] == torch.__version__
    assert versions["llvmlite"] == llvmlite.__version__
    assert versions["python"] == ".".join(map(str, sys.version_info[:3]))
    assert versions["system"] and versions["machine"]
    assert report["cpu"]["name"] and report["cpu"]["triple"] and report["cpu"]["features"]
    assert set(report["cuda"]) == {"torch_built", "available", "driver", "devices", "libdevice"}
    assert set(report["metal"]) == {"backend_built", "torch_mps_built", "available", "macos", "chip"}
    assert report["backends"]["cpu"] == {"available": True, "reason": ""}
    for name in ("cuda", "mps"):  # available, or not with the reason why
        state = report["backends"][name]
        assert state["available"] or len(state["reason"]) > 20, state
    assert set(report["caches"]) == {"disk_cache", "corpus", "public_corpus", "environment"}
    assert report["passed"] is True


@pytest.mark.skipif(torch.cuda.is_available() or torch.backends.mps.is_available(), reason="a GPU is here")
def test_without_a_gpu_only_the_cpu_is_tested_and_the_others_say_why(cache_runs):
    _, (first, _) = cache_runs
    report = json.loads(first.stdout)
    assert [(r["backend"], r["check"]) for r in report["self_test"]] == [("cpu", check) for check in CHECKS]
    assert not report["backends"]["mps"]["available"]
    if sys.platform != "darwin":
        assert "macOS only" in report["backends"]["mps"]["reason"]
    if not torch.backends.cuda.is_built():
        assert "built without CUDA" in report["backends"]["cuda"]["reason"]


def test_self_test_computed_and_compared(cache_runs):
    _, (first, _) = cache_runs
    results = {r["check"]: r for r in json.loads(first.stdout)["self_test"] if r["backend"] == "cpu"}
    assert {check: (r["passed"], r["elements"], r["mismatches"], r["max_abs_error"], r["error"])
            for check, r in results.items()} == {
        "kernel": (True, doctor_selftest.ELEMENTS, 0, 0.0, ""),
        "cooperative": (True, doctor_selftest.GROUPS, 0, 0.0, ""),
        "operator": (True, 2 * doctor_selftest.ELEMENTS, 0, 0.0, "")}  # returned, and out=
    assert results["kernel"]["subject"] == "vector_add_float"
    assert results["cooperative"]["subject"] == "group_sum_int"
    assert results["cooperative"]["cpu_scheme"] in ("lanes", "coroutines")
    assert results["operator"]["subject"].startswith("torch_metallib_doctor::add_")


def test_caches_report_what_the_self_test_compiled(cache_runs):
    cache, (first, second) = cache_runs
    before, after = (json.loads(run.stdout)["caches"]["disk_cache"] for run in (first, second))
    assert before["enabled"] and before["root"] == str(cache)
    assert before["kinds"]["jit"]["exists"] is False  # measured before the first self-test compiled anything
    assert after["kinds"]["jit"]["files"] >= 2 and after["kinds"]["jit"]["bytes"] > 0  # both kernels, compiled once


def test_disk_cache_off_is_reported():
    report = json.loads(run_doctor("--json", env={"TORCH_METALLIB_CACHE": "0"}).stdout)
    assert report["caches"]["disk_cache"] == {"enabled": False, "root": None, "kinds": {}}
    assert report["caches"]["environment"]["TORCH_METALLIB_CACHE"] == "0"
    assert report["passed"]


def test_human_report(capsys):
    status, out = in_process(capsys)
    assert status == 0
    lines = out.splitlines()
    assert lines[0].startswith(f"Versions   torch_metallib {tm.__version__}, torch {torch.__version__}")
    assert any(line.startswith("Backends   cpu   available") for line in lines)
    for check in CHECKS:
        assert any(f"cpu   {check}" in line and " ok (" in line for line in lines), out
    assert lines[-1].startswith("All ") and "self-tests passed" in lines[-1]
    assert len(lines) < 30  # short


def _broken(name, old, new):
    function, arguments, convergent = doctor_kernels.KERNELS[name]
    assert old in function
    return function.replace(old, new), arguments, convergent


@pytest.mark.parametrize("kernel, old, new, failing", [
    ("vector_add_float", "fadd float", "fsub float", {"kernel", "operator"}),  # the operator runs the same kernel
    ("group_sum_int", "%added = add i32", "%added = sub i32", {"cooperative"}),
    # writes nothing: the outputs' sentinels (NaN) catch it
    ("vector_add_float", "  store float %sum, ptr addrspace(1) %po, align 4\n", "", {"kernel", "operator"}),
])
def test_a_wrong_kernel_fails_the_self_test(monkeypatch, capsys, kernel, old, new, failing):
    monkeypatch.setitem(doctor_kernels.KERNELS, kernel, _broken(kernel, old, new))
    status, out = in_process(capsys, "--json")
    assert status == 1
    report = json.loads(out)
    assert report["passed"] is False
    results = {r["check"]: r for r in report["self_test"] if r["backend"] == "cpu"}
    assert {check for check, r in results.items() if not r["passed"]} == failing
    for check in failing:
        assert results[check]["mismatches"] > 0 and results[check]["error"] == ""  # it ran, and computed something else
        # the largest difference; None where the output kept its NaN sentinel (JSON has no NaN)
        assert results[check]["max_abs_error"] is None if "store" in old else results[check]["max_abs_error"] > 0
    status, out = in_process(capsys)
    assert status == 1
    assert out.splitlines()[-1].startswith(f"FAILED: {len(failing)} of 3 self-tests")
    assert sum("FAILED:" in line and "elements differ from" in line for line in out.splitlines()) == len(failing)


def test_an_exception_in_a_check_is_reported_not_raised(monkeypatch, capsys):
    def refuses(library, op, device):
        library.vector_add_float(torch.zeros(4, dtype=torch.float64), torch.zeros(4), torch.zeros(4))

    monkeypatch.setitem(doctor_selftest.CHECKS, "kernel", refuses)
    status, out = in_process(capsys, "--json")
    assert status == 1
    (result,) = [r for r in json.loads(out)["self_test"] if r["check"] == "kernel"]
    assert not result["passed"] and result["error"].startswith("KernelArgumentError: vector_add_float: argument 0")


def test_unavailable_backends_say_why():
    no_gpu = {"torch_built": True, "available": False, "driver": None, "devices": [], "libdevice": None}
    assert "no CUDA driver found" in doctor_backends._cuda(True, no_gpu)["reason"]
    gpu = dict(no_gpu, available=True)
    assert doctor_backends._cuda(True, gpu)["notes"][0].startswith("NVIDIA's libdevice was not found")
    assert "torch.backends.mps.is_available() is False" in doctor_backends._mps(True, {"available": False})["reason"]


def test_shipped_kernels_match_the_fixtures(fixtures_lib):
    """The doctor's vector_add_float is tests/fixtures/vector_add_float.ll's kernel."""
    shipped = tm.load(doctor_kernels.self_test_library_bytes(), verify=True)
    assert shipped.vector_add_float.signature == fixtures_lib.vector_add_float.signature
    assert shipped.group_sum_int.signature == (
        "kernel void group_sum_int(device const int* in [[buffer(0)]], device int* out [[buffer(1)]], "
        "threadgroup int* partial [[threadgroup(0)]], uint gid [[thread_position_in_grid]], "
        "uint group [[threadgroup_position_in_grid]], uint lane [[thread_index_in_simdgroup]], "
        "uint sg [[simdgroup_index_in_threadgroup]], uint nsg [[simdgroups_per_threadgroup]])")
    assert shipped.group_sum_int.reflection.uses_simdgroup_ops and shipped.group_sum_int.reflection.uses_barriers


@pytest.mark.metal_sim
@pytest.mark.skipif(sys.platform == "darwin", reason="the simulated Metal is built on Linux only")
def test_self_test_through_the_simulated_metal():
    """The kernel and cooperative checks with the Metal backend (csrc/mps against the
    simulated Metal) in the CPU backend's place: each call encoded, replayed, and
    bit-identical (tests/_metal_sim.py). The operator on cpu tensors runs its CPU kernel
    natively, not through the seam (test_metal_sim.py covers operators on the MPS key)."""
    from _metal_sim import simulated_metal

    with simulated_metal() as metal:
        report = doctor.report()
    assert report["passed"], report["self_test"]
    assert metal.runs == 2

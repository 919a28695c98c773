"""`python -m torch_metallib inspect` and `corpus`, run as a user would."""

import json
import subprocess
import sys

import pytest

import torch_metallib as tm
from torch_metallib.cli.inspect_reflection import reflection_record


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "torch_metallib", *args],
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def fixture_file(fixture_metallib, tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "fixtures.metallib"
    path.write_bytes(fixture_metallib)
    return str(path)


def test_inspect_json_on_the_corpus(mlx_path, mlx_lib):
    result = run_cli("inspect", mlx_path, "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["header"]["function_count"] == 17_248
    assert report["header"]["file_version"] == [1, 2, 7]
    assert report["header"]["platform"] == "macos"
    assert len(report["functions"]) == 17_248
    add = next(f for f in report["functions"] if f["name"] == "vv_Addfloat32")
    assert add["hash"] == mlx_lib["vv_Addfloat32"].hash
    assert add["air_version"] == [2, 6] and add["language_version"] == [3, 1]


def test_inspect_one_function_in_detail(fixture_file):
    result = run_cli("inspect", fixture_file, "--function", "function_constant_scale", "--json")
    assert result.returncode == 0, result.stderr
    (function,) = json.loads(result.stdout)["functions"]
    assert function["declared_constants"] == [
        {"name": "use_bias", "type": "bool", "index": 0, "required": True},
        {"name": "alpha", "type": "float", "index": 1, "required": True},
    ]
    assert [tag["tag"] for tag in function["tags"]] == ["NAME", "TYPE", "HASH", "OFFT", "VERS", "MDSZ"]
    assert function["bitcode_size"] > 0


def test_inspect_text_table(fixture_file):
    result = run_cli("inspect", fixture_file, "--verify")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("file:") and "format 1.2.7, executable" in lines[0]
    assert lines[1] == "platform:  macos 14.0.0"
    assert "functions: 5" in lines
    row = next(line for line in lines if line.startswith("function_constant_scale "))
    assert "kernel" in row and "use_bias:bool@0, alpha:float@1" in row


@pytest.mark.slow
def test_inspect_reports_errors_without_a_traceback(fixture_file, tmp_path):
    result = run_cli("inspect", fixture_file, "--function", "vector_add_flot")
    assert result.returncode == 1
    assert "Did you mean: vector_add_float" in result.stderr and "Traceback" not in result.stderr
    # The hint names a command the user can run, not Python API they do not have here.
    assert f"Run `python -m torch_metallib inspect {fixture_file}` to list them." in result.stderr
    assert "lib.function_names" not in result.stderr
    bad = tmp_path / "bad.metallib"
    bad.write_bytes(b"MTLB" + bytes(10))
    result = run_cli("inspect", str(bad))
    assert result.returncode == 1
    assert result.stderr.startswith("error: metallib: header at byte offset 0: expected at least 88 bytes")


@pytest.mark.slow
def test_console_script_names_itself(fixture_file):
    """Installed as `torch-metallib`, its usage and hints say so (not `python -m`)."""
    code = ("import sys; from torch_metallib.cli.main import main; "
            "sys.argv[0] = '/usr/bin/torch-metallib'; sys.exit(main(sys.argv[1:]))")
    result = subprocess.run([sys.executable, "-c", code, "inspect", fixture_file, "--function", "nope"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert f"Run `torch-metallib inspect {fixture_file}` to list them." in result.stderr
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.stderr.startswith("usage: torch-metallib ")
    assert run_cli().stderr.startswith("usage: python -m torch_metallib ")


def test_corpus_command_prints_the_cached_path(mlx_path):
    result = run_cli("corpus")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == mlx_path


@pytest.mark.slow
def test_inspect_function_shows_signature_and_argument_table(fixture_file):
    result = run_cli("inspect", fixture_file, "--function", "threadgroup_sum_float")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert ("kernel void threadgroup_sum_float(device const float* in [[buffer(0)]], "
            "device float* out [[buffer(1)]], threadgroup float* scratch [[threadgroup(0)]], "
            "uint lid [[thread_position_in_threadgroup]], uint gid [[threadgroup_position_in_grid]], "
            "uint tpg [[threads_per_threadgroup]])") in lines
    header = next(line for line in lines if line.split()[:3] == ["pos", "name", "kind"])
    rows = lines[lines.index(header) + 1:lines.index(header) + 7]
    assert [row.split()[:4] for row in rows] == [
        ["0", "in", "buffer", "0"], ["1", "out", "buffer", "1"], ["2", "scratch", "threadgroup", "0"],
        ["3", "lid", "builtin", "-"], ["4", "gid", "builtin", "-"], ["5", "tpg", "builtin", "-"]]
    assert "barriers:            yes; SIMD-group ops: no" in lines


@pytest.mark.slow
def test_inspect_function_json_includes_the_reflection(fixture_file):
    result = run_cli("inspect", fixture_file, "--function", "struct_arg_axpy", "--json")
    assert result.returncode == 0, result.stderr
    (function,) = json.loads(result.stdout)["functions"]
    reflection = function["reflection"]
    assert reflection["signature"].startswith("kernel void struct_arg_axpy(")
    p = reflection["arguments"][2]
    assert (p["name"], p["kind"], p["binding"], p["address_space"]) == ("p", "buffer", 2, "constant")
    assert [f["name"] for f in p["struct_fields"]] == ["alpha", "n"]
    assert reflection["threadgroup_memory_static"] == 0 and reflection["uses_barriers"] is False


def test_inspect_all_reflects_every_function(fixture_file):
    result = run_cli("inspect", fixture_file, "--all")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "reflected 5 of 5 functions; 0 failed"
    assert "reflected 5/5 functions, 0 failed" in result.stderr  # progress (not a terminal)


@pytest.mark.slow
def test_inspect_all_summarizes_failures(fixture_sources, tmp_path):
    broken = [tm.FunctionSource(f"broken_{i}", b"BC\xc0\xde" + bytes(64)) for i in range(3)]
    path = tmp_path / "mixed.metallib"
    path.write_bytes(tm.pack(list(fixture_sources) + broken))
    result = run_cli("inspect", str(path), "--all")
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines[0] == "reflected 5 of 8 functions; 3 failed"
    assert lines[1].startswith("  3 x LLVM ") and "cannot parse the function's bitcode" in lines[1]
    assert lines[2].strip() == "e.g. broken_0, broken_1, broken_2"
    result = run_cli("inspect", str(path), "--all", "--json")
    report = json.loads(result.stdout)
    assert sorted(report["failures"]) == ["broken_0", "broken_1", "broken_2"]
    assert report["functions"][0]["reflection"]["signature"].startswith("kernel void ")


@pytest.mark.slow
def test_inspect_all_in_worker_processes_matches_in_process(mlx_lib, tmp_path):
    names = mlx_lib.function_names[::29]  # 595 kernels of every family: more than one chunk
    path = tmp_path / "sample.metallib"
    path.write_bytes(mlx_lib.subset(names))
    result = run_cli("inspect", str(path), "--all", "--jobs", "2", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["failures"] == {}
    assert [f["name"] for f in report["functions"]] == list(names)
    sample = tm.load(str(path))
    for function in report["functions"][::50]:
        expected = json.loads(json.dumps(reflection_record(sample[function["name"]])))
        assert function["reflection"] == expected
    assert run_cli("inspect", str(path), "--all", "--jobs", "0").returncode == 2

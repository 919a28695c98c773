"""`python -m torch_metallib inspect` and `corpus`, run as a user would."""

import json
import subprocess
import sys

import pytest


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


def test_inspect_reports_errors_without_a_traceback(fixture_file, tmp_path):
    result = run_cli("inspect", fixture_file, "--function", "vector_add_flot")
    assert result.returncode == 1
    assert "Did you mean: vector_add_float" in result.stderr and "Traceback" not in result.stderr
    bad = tmp_path / "bad.metallib"
    bad.write_bytes(b"MTLB" + bytes(10))
    result = run_cli("inspect", str(bad))
    assert result.returncode == 1
    assert result.stderr.startswith("error: metallib: header at byte offset 0: expected at least 88 bytes")


def test_corpus_command_prints_the_cached_path(mlx_path):
    result = run_cli("corpus")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == mlx_path

"""The GitHub workflows lint clean, and the linters .ci/run runs on them catch mistakes:
check-jsonschema against GitHub's workflow schema (vendored in check-jsonschema, read
without network) and actionlint (expressions, action inputs and runtimes, runner labels).
Both are pinned in .ci/setup; a missing one fails the test."""

import os
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
# Any network use fails: the schema must come from check-jsonschema itself.
OFFLINE = {"HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9", "NO_PROXY": ""}


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed; bash .ci/setup installs it")
    return path


def check_jsonschema(*paths):
    return subprocess.run([_tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows", *map(str, paths)],
                          capture_output=True, text=True, timeout=120, env=dict(os.environ, **OFFLINE))


def actionlint(*paths):
    return subprocess.run([_tool("actionlint"), *map(str, paths)], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)


def test_the_workflows_lint_clean():
    assert WORKFLOWS
    schema = check_jsonschema(*WORKFLOWS)
    assert schema.returncode == 0 and "validation done" in schema.stdout, schema.stdout + schema.stderr
    lint = actionlint(*WORKFLOWS)
    assert lint.returncode == 0, lint.stdout + lint.stderr


def _broken(tmp_path, old, new):
    text = (ROOT / ".github" / "workflows" / "macos.yml").read_text()
    assert old in text
    path = tmp_path / "macos.yml"
    path.write_text(text.replace(old, new, 1))
    return path


def test_check_jsonschema_refuses_a_misspelled_key(tmp_path):
    result = check_jsonschema(_broken(tmp_path, "    runs-on:", "    run-on:"))
    assert result.returncode == 1 and "'runs-on' is a required property" in result.stdout, result.stdout


@pytest.mark.parametrize("old, new, expected", [
    ("${{ matrix.torch }}", "${{ matrix.torhc }}", 'property "torhc" is not defined'),
    ("actions/checkout@v5", "actions/checkout@v4", 'runtime "node20" is deprecated'),
])
def test_actionlint_refuses_a_mistake(tmp_path, old, new, expected):
    result = actionlint(_broken(tmp_path, old, new))
    assert result.returncode == 1 and expected in result.stdout, result.stdout

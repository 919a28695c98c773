"""The package tree mirrors the architecture (ARCHITECTURE.md): each stage is a folder, and
a stage imports only the stages before it."""

import ast
import importlib.metadata
import pathlib
import re
import sys

import pytest

import torch_metallib

PACKAGE = pathlib.Path(torch_metallib.__file__).parent
# ARCHITECTURE.md's order; a module may import its own stage and the ones before it.
STAGES = ["errors", "container", "reflection", "cache", "dispatch", "air", "backends", "library", "ops", "lint", "mlx",
          "cli"]
PUBLIC_TOP_LEVEL = {"__init__.py", "__main__.py", "_version.py", "errors.py", "config.py", "diagnostics.py"}
ROOT = PACKAGE.parent


def imported_stages(path: pathlib.Path, source: str = None):
    """(line, stage) for every import of a torch_metallib stage in the module at `path`
    (its text, unless `source` is given)."""
    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    package = module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text() if source is None else source)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = base + (node.module.split(".") if node.module else [])
                names = [target + [alias.name] for alias in node.names] if not node.module else [target]
            else:
                names = [(node.module or "").split(".")]
        elif isinstance(node, ast.Import):
            names = [alias.name.split(".") for alias in node.names]
        else:
            continue
        for name in names:
            if name[0] == "torch_metallib" and len(name) > 1 and name[1] in STAGES:
                yield node.lineno, name[1]


def test_top_level_holds_only_public_modules_and_stages():
    files = {p.name for p in PACKAGE.iterdir() if p.suffix == ".py"}
    assert files == PUBLIC_TOP_LEVEL
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name not in ("__pycache__", "csrc")}
    assert folders == set(STAGES) - {"errors"}


def test_stages_import_only_earlier_stages():
    backwards = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).parts
        stage = parts[0].removesuffix(".py")
        if stage not in STAGES:
            continue
        for line, imported in imported_stages(path):
            if STAGES.index(imported) > STAGES.index(stage):
                backwards.append(f"{path.relative_to(PACKAGE)}:{line} ({stage}) imports {imported}")
    assert not backwards, "\n".join(backwards)


def test_the_checker_sees_backward_imports():
    """The rule above can fail: relative, absolute and package-relative imports are seen."""
    probe = PACKAGE / "container" / "probe.py"
    source = ("from ..dispatch.calls import call\nimport torch_metallib.ops\n"
              "from .. import library\nfrom . import tables\n")
    assert list(imported_stages(probe, source)) == [(1, "dispatch"), (2, "ops"), (3, "library"), (4, "container")]


def test_the_version_has_one_source():
    """The version is written once, in torch_metallib/_version.py: pyproject.toml declares it
    dynamic (setuptools reads that file), setup.py and __init__.py do not spell it."""
    if not (ROOT / "setup.py").exists():
        pytest.skip("an installed torch_metallib, not a checkout")
    assert (ROOT / "pyproject.toml").exists(), "no pyproject.toml: the project's metadata has no home"
    tomllib = pytest.importorskip("tomllib" if sys.version_info >= (3, 11) else "tomli")
    version = torch_metallib.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", version), version
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "torch_metallib._version.__version__"}
    assert (PACKAGE / "_version.py").read_text().count(f'"{version}"') == 1
    for other in (ROOT / "setup.py", PACKAGE / "__init__.py"):
        text = other.read_text()
        assert version not in text, f"{other.name} spells the version {version}; only _version.py may"
        assert not re.search(r"\bversion\s*=", text), f"{other.name} sets a version; only _version.py may"


def test_the_installed_metadata_carries_that_version():
    """The distribution's metadata (pip's view) agrees with ``torch_metallib.__version__``."""
    try:
        installed = importlib.metadata.version("torch_metallib")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("torch_metallib is imported from a checkout that is not installed")
    assert installed == torch_metallib.__version__, (
        f"installed metadata says {installed}, torch_metallib.__version__ {torch_metallib.__version__}: "
        "reinstall (bash .ci/setup, or pip install --no-build-isolation -e .)")

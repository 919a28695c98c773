"""The package tree mirrors the architecture (ARCHITECTURE.md): each stage is a folder, and
a stage imports only the stages before it."""

import ast
import pathlib

import torch_metallib

PACKAGE = pathlib.Path(torch_metallib.__file__).parent
# ARCHITECTURE.md's order; a module may import its own stage and the ones before it.
STAGES = ["errors", "container", "reflection", "cache", "dispatch", "backends", "library", "ops", "cli"]
PUBLIC_TOP_LEVEL = {"__init__.py", "__main__.py", "errors.py"}


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

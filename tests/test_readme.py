"""README's and the documentation's Python examples run as written: every ```python block
of a page (README.md, docs/**/*.md), in order, in one child process per page, in a folder
holding the files docs/index.md says to make (mlx.metallib, fixtures.metallib). A line
``expr   # True`` (or ``# False``) is checked.

A block that needs an NVIDIA GPU or a Mac starts its device code with
``if torch.cuda.is_available():`` or ``if torch.backends.mps.is_available():``, so it does
nothing elsewhere; test_device_code_is_guarded holds every block to that."""

import ast
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

import torch_metallib

ROOT = pathlib.Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"^( *)```python\n(.*?)^\1```", re.S | re.M)
CLAIM = re.compile(r"^(\s*)([^#=\s][^#]*?)\s+#\s*(True|False)\s*(?:[;(].*)?$")
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))
# Device code: a device named in a string, or Tensor.cuda().
DEVICE_CODE = re.compile(r"""["'](?:cuda|mps)(?::\d+)?["']|\.cuda\(""")
GUARDS = ("torch.cuda.is_available()", "torch.backends.mps.is_available()")


def python_blocks(text: str):
    return [textwrap.dedent(body) for _indent, body in BLOCK.findall(text)]


def located_blocks(text: str):
    """(line of the block's first code line, dedented code) for every ```python block."""
    return [(text.count("\n", 0, match.start(2)) + 1, textwrap.dedent(match.group(2)))
            for match in BLOCK.finditer(text)]


def is_expression(text: str) -> bool:
    try:
        compile(text, "<readme>", "eval")
    except SyntaxError:
        return False
    return True


def with_claims_checked(block: str) -> str:
    """Turns ``expr  # True`` into ``assert (expr) is True`` (statements stay as they are)."""
    lines = []
    for line in block.splitlines():
        match = CLAIM.match(line)
        if match and is_expression(match.group(2)):
            indent, expression, value = match.groups()
            line = f"{indent}assert ({expression}) is {value}, {expression!r}"
        lines.append(line)
    return "\n".join(lines)


def page_script(path: pathlib.Path) -> str:
    """The page's blocks as one script; each starts with a comment naming page and line."""
    name = path.relative_to(ROOT)
    return "\n\n".join(f"# --- {name}, line {line}\n{with_claims_checked(code)}"
                       for line, code in located_blocks(path.read_text()))


def unguarded_device_code(block: str):
    """(line in the block, source) of its top-level statements that name a GPU device
    outside a GUARDS `if`."""
    lines = block.splitlines()
    found = []
    for node in ast.parse(block).body:
        if isinstance(node, ast.If) and ast.unparse(node.test) in GUARDS:
            continue
        source = "\n".join(lines[node.lineno - 1:node.end_lineno])
        if DEVICE_CODE.search(source):
            found.append((node.lineno, source))
    return found


PAGES_WITH_CODE = [page for page in PAGES if python_blocks(page.read_text())]


def test_claim_rewriting():
    assert with_claims_checked("torch.equal(c, a + b)   # True") == \
        "assert (torch.equal(c, a + b)) is True, 'torch.equal(c, a + b)'"
    assert with_claims_checked('hasattr(lib, "x")   # False; more') == \
        "assert (hasattr(lib, \"x\")) is False, 'hasattr(lib, \"x\")'"
    assert with_claims_checked("x = f()   # True") == "x = f()   # True"


def test_blocks_are_found():
    """The regular expression sees the blocks: README's examples (one per backend and an
    operator) and the guide's, backends' and reliability pages' (in lists too)."""
    assert len(python_blocks((ROOT / "README.md").read_text())) >= 4
    names = {str(page.relative_to(ROOT)) for page in PAGES_WITH_CODE}
    assert {"README.md", "docs/guide/loading.md", "docs/guide/reflection.md", "docs/guide/calling.md",
            "docs/guide/operators.md", "docs/guide/mlx.md", "docs/guide/writing.md", "docs/backends/cpu.md",
            "docs/backends/cuda.md", "docs/backends/metal.md", "docs/reliability.md"} <= names
    assert python_blocks("- item:\n\n    ```python\n    x = 1\n    ```\n") == ["x = 1\n"]


def test_device_code_is_guarded():
    unguarded = [f"{page.relative_to(ROOT)}:{start + line - 1}: {source}"
                 for page in PAGES_WITH_CODE for start, code in located_blocks(page.read_text())
                 for line, source in unguarded_device_code(code)]
    assert not unguarded, "\n".join(unguarded)
    assert unguarded_device_code('x = torch.ones(2, device="cuda")\nif torch.cuda.is_available():\n'
                                 '    y = x.cuda()\n') == [(1, 'x = torch.ones(2, device="cuda")')]


@pytest.mark.parametrize("page", PAGES_WITH_CODE, ids=lambda page: str(page.relative_to(ROOT)))
def test_python_blocks_run_as_written(page, mlx_path, fixture_metallib, tmp_path):
    (tmp_path / "mlx.metallib").symlink_to(mlx_path)
    (tmp_path / "fixtures.metallib").write_bytes(fixture_metallib)
    (tmp_path / "tests").symlink_to(ROOT / "tests")
    (tmp_path / "page_blocks.py").write_text(page_script(page))
    # The child imports the torch_metallib these tests import (an in-place build too).
    package_root = str(pathlib.Path(torch_metallib.__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])))
    result = subprocess.run([sys.executable, "page_blocks.py"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=900, env=env)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"

"""README's Python examples run as written: every ```python block, in order, in one
child process, in a folder holding the files README's Install section says to make
(mlx.metallib, fixtures.metallib). A line ``expr   # True`` (or ``# False``) is checked."""

import pathlib
import re
import subprocess
import sys
import textwrap


ROOT = pathlib.Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"^( *)```python\n(.*?)^\1```", re.S | re.M)
CLAIM = re.compile(r"^(\s*)([^#=\s][^#]*?)\s+#\s*(True|False)\s*(?:[;(].*)?$")


def python_blocks(text: str):
    return [textwrap.dedent(body) for _indent, body in BLOCK.findall(text)]


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


def test_claim_rewriting():
    assert with_claims_checked("torch.equal(c, a + b)   # True") == \
        "assert (torch.equal(c, a + b)) is True, 'torch.equal(c, a + b)'"
    assert with_claims_checked('hasattr(lib, "x")   # False; more') == \
        "assert (hasattr(lib, \"x\")) is False, 'hasattr(lib, \"x\")'"
    assert with_claims_checked("x = f()   # True") == "x = f()   # True"


def test_readme_python_blocks_run_as_written(mlx_path, fixture_metallib, tmp_path):
    blocks = python_blocks((ROOT / "README.md").read_text())
    assert len(blocks) >= 6
    (tmp_path / "mlx.metallib").symlink_to(mlx_path)
    (tmp_path / "fixtures.metallib").write_bytes(fixture_metallib)
    (tmp_path / "tests").symlink_to(ROOT / "tests")
    script = "\n\n".join(f"# --- README block {i}\n{with_claims_checked(b)}" for i, b in enumerate(blocks))
    (tmp_path / "readme_blocks.py").write_text(script)
    result = subprocess.run([sys.executable, "readme_blocks.py"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=900)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"

"""Every script in benchmarks/ starts as the docs say (``python benchmarks/X.py``, docs/performance.md): its
imports work from that folder, which Python puts first on sys.path (a script named like a
package torch imports, such as ``cuda.py``, broke every benchmark there), and it answers
``--help``. The measurements themselves are run by hand (docs/performance.md)."""

import pathlib
import subprocess
import sys

import pytest

BENCHMARKS = pathlib.Path(__file__).resolve().parent.parent / "benchmarks"
SCRIPTS = sorted(p.name for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_"))


def test_scripts_are_found():
    assert "cooperative.py" in SCRIPTS and len(SCRIPTS) >= 9


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS)
def test_script_starts(script):
    result = subprocess.run([sys.executable, str(BENCHMARKS / script), "--help"], capture_output=True, text=True,
                            timeout=120, cwd=BENCHMARKS.parent)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "usage" in result.stdout.lower(), result.stdout[-1000:]

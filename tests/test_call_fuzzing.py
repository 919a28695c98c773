"""Call fuzzing in CI: a bounded run of tools/fuzz_calls.py, which generates calls to
MLX kernels with hypothesis (argument kinds, dtypes, sizes, offsets, strides, threads, group
sizes, checked or not) and checks each against a torch reference or a project exception.
It runs as a child process, so a crash is a failed test. TORCH_METALLIB_CALL_FUZZ_EXAMPLES
and _SEED change the run; the script itself runs long ones.
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES = int(os.environ.get("TORCH_METALLIB_CALL_FUZZ_EXAMPLES", "400"))
SEED = int(os.environ.get("TORCH_METALLIB_CALL_FUZZ_SEED", "20"))


@pytest.mark.slow
def test_fuzzed_calls_match_torch_or_raise_project_errors(mlx_path):
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "fuzz_calls.py"), mlx_path,
                             "--examples", str(EXAMPLES), "--seed", str(SEED)],
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, f"exit {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    counts = json.loads(result.stdout.strip().splitlines()[-1])
    assert counts["calls"] == EXAMPLES
    # The run exercised each outcome: results compared with torch, out-of-bounds calls caught
    # in checked execution, bad values refused before running.
    assert counts["results equal to the reference"] >= EXAMPLES // 10, counts
    assert counts["KernelMemoryError"] >= EXAMPLES // 20, counts
    assert counts["KernelArgumentError"] + counts["DispatchError"] >= EXAMPLES // 10, counts

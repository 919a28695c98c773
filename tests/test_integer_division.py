"""Integer division by zero (and INT_MIN / -1) on user data does not kill the process:
Metal leaves the result undefined and Apple GPUs do not trap, x86-64 raises SIGFPE.
air/integer_division.py makes x / 0 = x, x % 0 = 0, INT_MIN / -1 = INT_MIN and
INT_MIN % -1 = 0. Run in a child process, so a regression is a failed test, not a dead run."""

import json
import subprocess
import sys

_CHILD = r"""
import json, sys, torch, torch_metallib as tm
lib = tm.load(sys.argv[1])
minimum = -2**31
a = torch.tensor([7, -7, 0, 5, minimum, minimum, 9, -9] * 4, dtype=torch.int32)
b = torch.tensor([0, 0, 0, 2, -1, 0, 4, 4] * 4, dtype=torch.int32)
results = {}
for op in ("Divide", "Remainder"):
    out = torch.full_like(a, 123)
    lib[f"vv_{op}int32"](a, b, out)
    results[op] = out[:8].tolist()
    out64 = torch.full((32,), 123, dtype=torch.int64)
    lib[f"vv_{op}int64"](a.long(), b.long(), out64)
    results[op + "64"] = out64[:8].tolist()
ua, ub = torch.tensor([7, -2**31, 5] * 11, dtype=torch.int32), torch.tensor([0, 0, 2] * 11, dtype=torch.int32)
out = torch.zeros_like(ua)
lib["vv_Divideuint32"](ua, ub, out)
results["udiv"] = out[:3].tolist()
print(json.dumps(results))
"""


def test_division_by_zero_and_overflow_do_not_trap(mlx_path):
    run = subprocess.run([sys.executable, "-c", _CHILD, mlx_path], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"the child died ({run.returncode}): {run.stderr[-2000:]}"
    results = json.loads(run.stdout.strip().splitlines()[-1])
    minimum = -2**31
    # x / 0 = x; INT_MIN / -1 wraps to INT_MIN; the rest is C's truncating division.
    assert results["Divide"] == [7, -7, 0, 2, minimum, minimum, 2, -2]
    assert results["Divide64"] == [7, -7, 0, 2, -minimum, minimum, 2, -2]  # no overflow in int64
    # MLX's Remainder takes the divisor's sign: r = x % y, plus y where the signs differ.
    assert results["Remainder"] == [0, 0, 0, 1, 0, 0, 1, 3]
    assert results["Remainder64"] == [0, 0, 0, 1, 0, 0, 1, 3]
    assert results["udiv"] == [7, minimum, 2]  # uint32 2**31 / 0 = 2**31, seen as int32

"""The doctor's self-test: on each available backend, three runs compared with torch.

- ``kernel``: ``vector_add_float`` called directly, against ``torch.add``;
- ``cooperative``: ``group_sum_int`` (a SIMD-group sum, threadgroup memory, a threadgroup
  barrier), against ``torch.sum`` per threadgroup;
- ``operator``: ``vector_add_float`` registered with ``ops.define`` as an operator that
  returns a new tensor and as its ``.out`` overload, both called through ``torch.ops``,
  against ``torch.add``.

Inputs are made on the CPU from a fixed seed and moved to the device; outputs are filled
with a sentinel first (NaN, -1), so a kernel that never wrote fails. Results must equal
torch's exactly: one float addition per element and integer sums have one right answer
on every backend. The kernels come from doctor_kernels.py, packed at each run.
"""

import hashlib
import threading
import time
import traceback
from dataclasses import asdict, dataclass
from typing import Callable, Dict, List, Optional, Tuple

import torch

from .. import ops
from ..library.library import load
from .doctor_kernels import self_test_library_bytes

__all__ = ["SelfTestResult", "run_self_tests", "CHECKS", "GROUP", "GROUPS", "ELEMENTS"]

ELEMENTS = 1000        # vector_add_float: not a multiple of the group size, so the edge group is short
GROUP, GROUPS = 64, 4  # group_sum_int: threadgroup size (2 SIMD-groups of 32) and count
OPERATOR_NAMESPACE = "torch_metallib_doctor"


@dataclass
class SelfTestResult:
    backend: str
    check: str             # kernel, cooperative, operator
    subject: str           # the kernel or operator run
    compared_with: str     # the torch computation it must equal
    passed: bool
    elements: int = 0      # elements compared
    mismatches: int = 0    # elements that differ from torch's
    max_abs_error: Optional[float] = None  # None where a result is NaN or infinite (e.g. never written)
    seconds: float = 0.0
    cpu_scheme: Optional[str] = None  # how the CPU backend ran a cooperative kernel
    error: str = ""        # an exception raised instead of a result

    def as_dict(self) -> dict:
        return asdict(self)


_operators: Dict[str, Tuple] = {}  # library digest -> the operators defined over it
_operators_lock = threading.Lock()


def _operator(library, digest: str) -> Tuple:
    """``torch_metallib_doctor::add_<digest>`` (returns a new tensor) and its ``.out``
    overload (writes the caller's), defined once per process and library."""
    with _operators_lock:
        defined = _operators.get(digest)
        if defined is None:
            name = f"{OPERATOR_NAMESPACE}::add_{digest}"
            kernel = {torch.float32: "vector_add_float"}
            defined = _operators[digest] = (
                ops.define(f"{name}(Tensor a, Tensor b) -> Tensor", library, kernel,
                           outputs={"out": ops.like("a")}, threads=ops.numel("a")),
                ops.define(f"{name}.out(Tensor a, Tensor b, *, Tensor(a!) out) -> ()", library, kernel,
                           outputs={"out": ops.like("a")}, threads=ops.numel("a")))
        return defined


def _inputs():
    generator = torch.Generator().manual_seed(20261128)
    a = torch.randn(ELEMENTS, generator=generator)
    b = torch.randn(ELEMENTS, generator=generator)
    x = torch.randint(-1000, 1000, (GROUP * GROUPS,), generator=generator, dtype=torch.int32)
    return a, b, x


def _kernel(library, op, device):
    a, b, _ = _inputs()
    out = torch.full((ELEMENTS,), float("nan"), device=device)
    library.vector_add_float(a.to(device), b.to(device), out)
    return "vector_add_float", "torch.add", out, a + b


def _cooperative(library, op, device):
    _, _, x = _inputs()
    out = torch.full((GROUPS,), -1, dtype=torch.int32, device=device)
    library.group_sum_int(x.to(device), out, threads=GROUP * GROUPS, group_size=GROUP,
                          threadgroup_memory={0: GROUP * 4})
    return "group_sum_int", "torch.sum per threadgroup", out, x.view(GROUPS, GROUP).sum(1, dtype=torch.int32)


def _operator_check(library, op, device):
    functional, overload = op
    a, b, _ = _inputs()
    returned = functional(a.to(device), b.to(device))
    written = torch.full((ELEMENTS,), float("nan"), device=device)  # a sentinel: the memory a new tensor
    overload(a.to(device), b.to(device), out=written)                # gets may hold an earlier a + b
    return functional.name, "torch.add (returned, and out=)", torch.cat([returned, written]), torch.cat([a + b, a + b])


# check name -> function(library, operator, device) -> (subject, compared_with, result, expected on the CPU)
CHECKS: Dict[str, Callable] = {"kernel": _kernel, "cooperative": _cooperative, "operator": _operator_check}


def _synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()
    elif device == "mps":
        torch.mps.synchronize()


def _run(check: str, library, op, device: str) -> SelfTestResult:
    start = time.perf_counter()
    try:
        subject, compared_with, got, want = CHECKS[check](library, op, device)
        _synchronize(device)
        got = got.cpu()
    except Exception as error:  # noqa: BLE001 - a failing backend is the report, not a crash
        frame = traceback.extract_tb(error.__traceback__)[-1]
        return SelfTestResult(device, check, check, "", False, seconds=round(time.perf_counter() - start, 4),
                              error=f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''} "
                                    f"({frame.filename.rsplit('/', 1)[-1]}:{frame.lineno})")
    seconds = round(time.perf_counter() - start, 4)
    same_shape = got.shape == want.shape and got.dtype == want.dtype
    differs = (got != want) if same_shape else torch.ones(want.shape, dtype=torch.bool)
    error = (got.double() - want.double()).abs() if same_shape else None
    largest = None if error is None or not bool(error.isfinite().all()) else float(error.max())  # JSON has no NaN
    scheme = None
    if device == "cpu" and check == "cooperative":
        scheme = library.group_sum_int.cpu_scheme
    return SelfTestResult(device, check, subject, compared_with, passed=same_shape and not bool(differs.any()),
                          elements=want.numel(), mismatches=int(differs.sum()),
                          max_abs_error=largest, seconds=seconds,
                          cpu_scheme=scheme, error="" if same_shape else
                          f"expected {tuple(want.shape)} {want.dtype}, got {tuple(got.shape)} {got.dtype}")


def run_self_tests(devices: List[str]) -> List[SelfTestResult]:
    """Every check on every device in `devices` (the available computing backends)."""
    data = self_test_library_bytes()
    library = load(data)
    digest = hashlib.sha256(data).hexdigest()[:12]
    results = []
    try:
        op = _operator(library, digest)
    except Exception as error:  # noqa: BLE001 - reported on each device below
        op, failure = None, f"{type(error).__name__}: {str(error).splitlines()[0]}"
    for device in devices:
        for check in CHECKS:
            if check == "operator" and op is None:
                results.append(SelfTestResult(device, check, "ops.define", "torch.add", False, error=failure))
                continue
            results.append(_run(check, library, op, device))
    return results

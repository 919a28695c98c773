"""`python -m torch_metallib doctor [--json]`: what a bug report needs in one run.

Reports versions (torch_metallib, torch, llvmlite and its LLVM, Python, OS), the CPU LLVM
compiles for and its features, the CUDA driver and GPUs, the Metal device and macOS
version where there are any; which backends are available and why not; the caches in use
and their sizes; then self-tests every available backend against torch
(doctor_selftest.py). ``--json`` prints one JSON object (schema ``torch_metallib.doctor/1``,
keys below) instead of the report.

Exit status: 0 when every self-test passed; 1 when one failed (the report says which, and
why); 2 for a command-line error (argparse).

JSON keys: ``schema``; ``versions``; ``cpu`` (name, triple, features, torch_threads);
``cuda`` (torch_built, available, driver, devices, libdevice); ``metal`` (backend_built,
torch_mps_built, available, macos, chip); ``backends`` (device type -> available, reason);
``caches`` (disk_cache, corpus, public_corpus, environment); ``self_test`` (one object per
backend and check: backend, check, subject, compared_with, passed, elements, mismatches,
max_abs_error, seconds, cpu_scheme, error); ``passed``; ``seconds``. A section whose probe
raised holds ``{"error": "..."}`` instead.
"""

import json
import time

from . import doctor_backends, doctor_caches, doctor_environment
from .doctor_report import render
from .doctor_selftest import run_self_tests

__all__ = ["add_parser", "run", "report", "SCHEMA"]

SCHEMA = "torch_metallib.doctor/1"


def _probe(function, *args):
    try:
        return function(*args)
    except Exception as error:  # noqa: BLE001 - a probe that fails is reported, the rest still runs
        return {"error": f"{type(error).__name__}: {error}"}


def report() -> dict:
    """Everything the doctor finds, self-tests included, as plain data."""
    start = time.perf_counter()
    out = {"schema": SCHEMA}
    out["versions"] = _probe(doctor_environment.versions)
    out["cpu"] = _probe(doctor_environment.cpu)
    out["cuda"] = _probe(doctor_environment.cuda)
    out["metal"] = _probe(doctor_environment.metal)
    out["backends"] = _probe(doctor_backends.backends, out["cuda"], out["metal"])
    out["caches"] = _probe(doctor_caches.caches)
    devices = [name for name in doctor_backends.COMPUTING if out["backends"].get(name, {}).get("available")]
    results = _probe(run_self_tests, devices)
    if isinstance(results, dict):  # the self-test itself could not start (e.g. packing the kernels failed)
        out["self_test"] = [{"backend": "-", "check": "setup", "passed": False, "error": results["error"]}]
    else:
        out["self_test"] = [result.as_dict() for result in results]
    out["passed"] = bool(out["self_test"]) and all(result["passed"] for result in out["self_test"])
    out["seconds"] = round(time.perf_counter() - start, 3)
    return out


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "doctor", help="versions, backends, caches, and a self-test of every available backend",
        description="Report versions, devices, available backends (and why not), caches, and self-test every "
                    "available backend against torch. Exit status 0 when every self-test passed, 1 when one "
                    "failed.")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the report")
    parser.set_defaults(run=run)


def run(args) -> int:
    found = report()
    if args.json:
        print(json.dumps(found, indent=2, allow_nan=False))
    else:
        print(render(found))
    return 0 if found["passed"] else 1

"""Which backends can run kernels here, and why not where one cannot.

A backend is *available* when this build registered it with the dispatch seam and torch
can reach its device; only available backends are self-tested. ``meta`` validates calls
and computes nothing: it is listed, never self-tested.
"""

import sys

import torch

from ..dispatch.backend import available_backends

__all__ = ["backends", "COMPUTING"]

COMPUTING = ("cpu", "cuda", "mps")  # the backends a self-test can compare with torch


def _cuda(registered: bool, cuda: dict) -> dict:
    if not registered:
        return {"available": False,
                "reason": f"torch {torch.__version__} is built without CUDA (torch.backends.cuda.is_built() is False); "
                          "install a CUDA build of torch"}
    if not cuda["available"]:
        driver = "no CUDA driver found (libcuda)" if cuda["driver"] is None else f"CUDA driver {cuda['driver']} found"
        return {"available": False, "reason": f"torch.cuda.is_available() is False: no usable NVIDIA GPU ({driver})"}
    notes = [] if cuda["libdevice"] else [
        "NVIDIA's libdevice was not found: kernels calling math functions are refused; install the CUDA toolkit "
        "or nvidia-cuda-nvcc, or set TORCH_METALLIB_LIBDEVICE"]
    return {"available": True, "reason": "", "notes": notes}


def _mps(registered: bool, metal: dict) -> dict:
    if not registered:
        if sys.platform != "darwin":
            reason = (f"the Metal backend is built on macOS only (csrc/mps); this is {sys.platform}, where mps "
                      "tensors do not exist")
        else:
            reason = ("this build of torch_metallib has no Metal backend (_C.MetalLibrary is missing); reinstall "
                      "on this Mac: pip install --no-build-isolation -e .")
        return {"available": False, "reason": reason}
    if not metal["available"]:
        return {"available": False, "reason": "torch.backends.mps.is_available() is False: no Metal device "
                                              "(torch needs macOS 12.3+ and Apple silicon or an AMD GPU)"}
    return {"available": True, "reason": ""}


def backends(cuda: dict, metal: dict) -> dict:
    """device type -> {"available": bool, "reason": str (empty when available), ...}."""
    registered = set(available_backends())
    return {
        "cpu": {"available": "cpu" in registered, "reason": "" if "cpu" in registered else "not registered"},
        "cuda": _cuda("cuda" in registered, cuda),
        "mps": _mps("mps" in registered, metal),
        "meta": {"available": "meta" in registered, "reason": "validates calls only; nothing runs, no self-test"},
    }

"""What the doctor reports about the machine: versions, the CPU LLVM compiles for, the
CUDA driver and GPUs, the Metal device. Every probe returns plain data and never raises:
what it cannot find is None (or an empty list) and, where that matters, a reason."""

import ctypes
import platform
import subprocess
import sys
from typing import Optional

import llvmlite
import llvmlite.binding as llvm
import torch

__all__ = ["versions", "cpu", "cuda", "metal"]


def versions() -> dict:
    import torch_metallib

    mac = platform.mac_ver()[0]
    return {
        "torch_metallib": torch_metallib.__version__,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "llvmlite": llvmlite.__version__,
        "llvm": ".".join(map(str, llvm.llvm_version_info)),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "os": platform.platform(),
        "system": platform.system(),
        "release": platform.release(),
        "machine": platform.machine(),
        "macos": mac or None,
    }


def cpu() -> dict:
    """The host CPU as LLVM sees it (what the CPU backend compiles for)."""
    llvm.initialize_native_target()
    features = llvm.get_host_cpu_features()
    return {
        "name": llvm.get_host_cpu_name(),
        "triple": llvm.get_process_triple(),
        "features": sorted(name for name, enabled in features.items() if enabled),
        "torch_threads": torch.get_num_threads(),
    }


def _driver_version() -> Optional[str]:
    """The CUDA driver's version (cuDriverGetVersion), or None where libcuda is absent."""
    for name in ("libcuda.so.1", "libcuda.dylib", "nvcuda.dll"):
        try:
            library = ctypes.CDLL(name)
        except OSError:
            continue
        version = ctypes.c_int()
        if library.cuDriverGetVersion(ctypes.byref(version)) == 0:
            return f"{version.value // 1000}.{version.value % 1000 // 10}"
    return None


def _libdevice() -> Optional[str]:
    try:
        from ..backends.cuda.libdevice import libdevice_path
        return libdevice_path()
    except Exception:  # noqa: BLE001 - absent is an answer here
        return None


def cuda() -> dict:
    built = torch.backends.cuda.is_built()
    available = built and torch.cuda.is_available()
    devices = []
    if available:
        for index in range(torch.cuda.device_count()):
            properties = torch.cuda.get_device_properties(index)
            devices.append({"index": index, "name": properties.name,
                            "capability": f"{properties.major}.{properties.minor}",
                            "memory_bytes": properties.total_memory})
    return {"torch_built": built, "available": available, "driver": _driver_version(), "devices": devices,
            "libdevice": _libdevice() if built else None}


def _chip() -> Optional[str]:
    """The Mac's chip ("Apple M1"): its GPU is part of it."""
    if sys.platform != "darwin":
        return None
    try:
        return subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                              timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def metal() -> dict:
    from .. import _C

    return {
        "backend_built": hasattr(_C, "MetalLibrary"),
        "torch_mps_built": torch.backends.mps.is_built(),
        "available": torch.backends.mps.is_available(),
        "macos": platform.mac_ver()[0] or None,
        "chip": _chip(),
    }

"""The backend seam: a call's backend comes from its tensors' device; devices without a
backend are refused with UnsupportedDeviceError; meta tensors are validated, not run."""

import ast
from pathlib import Path

import pytest
import torch

import torch_metallib as tm
from torch_metallib.dispatch import backend as seam


def meta(n, dtype=torch.float32):
    return torch.empty(n, dtype=dtype, device="meta")


def test_meta_call_is_validated_and_runs_nothing(mlx_lib):
    assert mlx_lib.vv_Addfloat32(meta(8), meta(8), meta(8)) is None
    with pytest.raises(tm.KernelArgumentError, match="argument 2 'c'.*torch.float32"):
        mlx_lib.vv_Addfloat32(meta(8), meta(8), meta(8, torch.float16))


@pytest.mark.parametrize("device", ["cuda:0", pytest.param("mps", marks=pytest.mark.skipif(
    "mps" in seam.available_backends(), reason="this build has the Metal backend")), "xpu:1"])
def test_device_without_backend_is_named_with_the_available_ones(device):
    with pytest.raises(tm.UnsupportedDeviceError) as caught:
        seam.backend_for(device, "vv_Addfloat32")
    error = caught.value
    assert isinstance(error, tm.UnsupportedKernelError) and isinstance(error, NotImplementedError)
    assert error.device == device and error.available == seam.available_backends()
    message = str(error)
    assert message.startswith(f"vv_Addfloat32: tensors are on {device}; expected a device with a backend "
                              f"({', '.join(seam.available_backends())}), got {device.split(':')[0]}.")
    assert "Move the tensors with .to('cpu')" in message
    assert ("Metal backend needs a macOS build" in message) == (device == "mps")


def test_call_on_a_device_without_backend_raises_and_writes_nothing(mlx_lib, monkeypatch):
    monkeypatch.delitem(seam._backends, "meta")
    with pytest.raises(tm.UnsupportedDeviceError, match=r"^vv_Addfloat32: tensors are on meta; .*\(cpu[,)]"):
        mlx_lib.vv_Addfloat32(meta(8), meta(8), meta(8))


class RecordingBackend(seam.Backend):
    """Stands in for a device's backend: records what the seam hands it."""
    device_type = "meta"
    checks = True  # it can run calls checked: the caller's wish is looked up for it

    def __init__(self):
        self.prepared, self.runs, self.checked = [], [], []

    def prepare(self, function, state, constants, checked=False):
        self.prepared.append((function.name, constants))
        self.checked.append(checked)
        return ("prepared", constants)

    def run(self, function, prepared, plan):
        self.runs.append((function.name, prepared, plan.device, plan.constants))


def test_backend_gets_constants_then_the_validated_plan(fixture_metallib, monkeypatch):
    recorder = RecordingBackend()
    monkeypatch.setitem(seam._backends, "meta", recorder)
    lib = tm.load(fixture_metallib)
    lib.function_constant_scale(meta(4), meta(4), constants={"use_bias": False, "alpha": 2.5})
    (name, constants), = recorder.prepared
    assert name == "function_constant_scale"
    assert dict(constants) == {0: False, 1: 2.5}
    assert recorder.runs == [(name, ("prepared", constants), "meta", constants)]
    lib.function_constant_scale(meta(4), meta(4), constants={"use_bias": False, "alpha": 2.5}, checked=True)
    assert recorder.checked == [False, True]  # the caller's request reaches the backend
    recorder.checks = False  # one that cannot check is not asked to
    lib.function_constant_scale(meta(4), meta(4), constants={"use_bias": False, "alpha": 2.5}, checked=True)
    assert recorder.checked == [False, True, False]
    # A refused call reaches no backend.
    with pytest.raises(tm.DispatchError):
        lib.function_constant_scale(meta(4), meta(4), constants={"use_bias": False})
    assert len(recorder.runs) == 3


def test_cpu_tensors_run_on_the_cpu_backend(mlx_lib):
    assert isinstance(seam.backend_for("cpu", "k"), tm.backends.cpu.backend.CpuBackend)
    a, b, c = torch.randn(100), torch.randn(100), torch.empty(100)
    mlx_lib.vv_Addfloat32(a, b, c)
    assert torch.equal(c, a + b)


# --- the import seam between the backends (ARCHITECTURE.md, "Where new work goes") ----

_PACKAGE = Path(tm.__file__).parent


def _imports(path: Path, source: str = None):
    """The absolute names of the modules `path` imports (top level or inside functions; its
    text, unless `source` is given)."""
    package = ".".join(("torch_metallib",) + path.relative_to(_PACKAGE).with_suffix("").parts[:-1])
    for node in ast.walk(ast.parse(path.read_text() if source is None else source, str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            yield module
            if not node.module:  # from . import x: x is a module of the package
                yield from (f"{module}.{alias.name}" for alias in node.names)


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


@pytest.mark.parametrize("stage, forbidden", [
    ("backends/cpu", ["torch_metallib.backends.cuda"]),
    ("backends/cuda", ["torch_metallib.backends.cpu"]),
    ("air", ["torch_metallib.backends"]),
])
def test_backends_share_air_semantics_not_each_other(stage, forbidden):
    """The CPU and CUDA backends each import AIR's meaning from torch_metallib/air/ and
    neither imports the other; air/ imports no backend."""
    folder = _PACKAGE / stage
    assert folder.is_dir(), f"{folder} is missing"
    offending = sorted(f"{path.relative_to(_PACKAGE)} imports {module}"
                       for path in folder.rglob("*.py") for module in _imports(path)
                       if any(_within(module, name) for name in forbidden))
    assert not offending, "\n".join(offending)


def test_the_import_parser_sees_every_way_to_reach_the_other_backend():
    """The rule above can fail: relative, package-relative, absolute and function-level
    imports of backends/cpu from backends/cuda are all seen."""
    probe = _PACKAGE / "backends" / "cuda" / "probe.py"
    source = ("from ..cpu.jit import compile_kernel\nfrom .. import cpu\nfrom ...air import target\n"
              "def f():\n    import torch_metallib.backends.cpu.lowering\n")
    found = set(_imports(probe, source))
    assert {"torch_metallib.backends.cpu.jit", "torch_metallib.backends.cpu", "torch_metallib.air",
            "torch_metallib.backends.cpu.lowering"} <= found
    assert sum(_within(module, "torch_metallib.backends.cpu") for module in found) == 3


PYTHON_HEADERS = ("pybind11/", "Python.h", "torch/csrc/", "torch/extension.h", "bindings/")


@pytest.mark.parametrize("folder", ["dispatch", "cpu", "cuda"])
def test_the_native_core_includes_no_python(folder):
    """Python values are read in csrc/bindings only: the binding plan and the backends'
    native code take plain values, so they run (and can be tested) without an interpreter."""
    csrc = Path(tm.__file__).parent / "csrc" / folder
    found = [f"{path.name}: {line.strip()}" for path in sorted(csrc.iterdir()) if path.suffix in (".h", ".cpp")
             for line in path.read_text().splitlines()
             if line.startswith("#include") and any(header in line for header in PYTHON_HEADERS)]
    assert found == []

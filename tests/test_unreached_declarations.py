"""Backends refuse a kernel for what it can call, not for what its module declares: Mojo
leaves declarations such as ``air.thread_position_in_threadgroup.x`` in every module, called
or not. A declaration of an intrinsic no backend implements, never called (or called only
from a function the kernel never reaches), runs on the CPU and lowers for CUDA; the same
intrinsic called from the kernel is refused by name on both. Reflection follows the same
rule: `intrinsics` and `uses_barriers` name what the kernel can call.
"""

import re

import pytest
import torch

import _air_modules as air
import torch_metallib as tm
from torch_metallib.backends.cuda.ptx import kernel_ptx, ptxas_path, run_ptxas

_MADE_UP = "declare float @air.made_up_op.f32(float) #1"
_BARRIER = "declare void @air.wg.barrier(i32, i32) #1"
_ADD_ONE = ["%p = getelementptr float, ptr addrspace(1) %x, i64 %gid64", "%v = load float, ptr addrspace(1) %p",
            "%w = fadd float %v, 1.0", "%q = getelementptr float, ptr addrspace(1) %out, i64 %gid64",
            "store float %w, ptr addrspace(1) %q"]
_ARGUMENTS = [("x", "float", "air.read"), ("out", "float", "air.read_write")]
# A helper the kernel never calls, calling the intrinsic: still unreachable.
_UNCALLED_HELPER = ("define internal float @helper(float %a) {\n  %r = call float @air.made_up_op.f32(float %a) #2\n"
                    "  ret float %r\n}")


def _kernel(name: str, body, declarations):
    return air.library(name, air.module_text(name, body, _ARGUMENTS, declarations, collective=False))[name]


@pytest.fixture(params=["declared", "helper"])
def unreached(request):
    declarations = [_MADE_UP, "declare i32 @air.thread_position_in_threadgroup.x() #1"]
    if request.param == "helper":
        declarations.append(_UNCALLED_HELPER)
    return _kernel(f"unreached_{request.param}", _ADD_ONE, declarations)


@pytest.fixture
def reached():
    body = _ADD_ONE[:2] + ["%w = call float @air.made_up_op.f32(float %v) #2"] + _ADD_ONE[3:]
    return _kernel("reached", body, [_MADE_UP])


@pytest.fixture(params=["declared", "helper"])
def unreached_barrier(request):
    declarations = [_BARRIER]
    if request.param == "helper":
        declarations.append("define internal void @waits() {\n  call void @air.wg.barrier(i32 2, i32 1) #2\n"
                            "  ret void\n}")
    return _kernel(f"unreached_barrier_{request.param}", _ADD_ONE, declarations)


def test_reflection_lists_only_what_the_kernel_calls(unreached, reached, unreached_barrier):
    assert unreached.intrinsics == () and reached.intrinsics == ("air.made_up_op.f32",)
    assert unreached_barrier.intrinsics == () and not unreached_barrier.uses_barriers


def test_unreached_barrier_runs_as_independent_threads(unreached_barrier):
    """A kernel that never waits runs its threads one after another, not cut at waits."""
    x = torch.randn(64)
    out = torch.zeros(64)
    unreached_barrier(x, out)
    torch.testing.assert_close(out, x + 1, rtol=0, atol=0)
    assert unreached_barrier.cpu_scheme == "threads"


def test_called_barrier_is_reflected():
    body = _ADD_ONE[:3] + ["call void @air.wg.barrier(i32 2, i32 1) #2"] + _ADD_ONE[3:]
    kernel = _kernel("waits", body, [_BARRIER])
    assert kernel.intrinsics == ("air.wg.barrier",) and kernel.uses_barriers


def test_unreached_declaration_runs_on_cpu(unreached):
    x = torch.randn(64)
    out = torch.zeros(64)
    unreached(x, out)
    torch.testing.assert_close(out, x + 1, rtol=0, atol=0)


def test_called_intrinsic_is_refused_on_cpu(reached):
    with pytest.raises(tm.UnsupportedKernelError,
                       match=r"reached: the CPU backend has no implementation of air\.made_up_op\.f32\. Run it"):
        reached(torch.randn(4), torch.zeros(4))


def test_unreached_declaration_lowers_for_cuda(unreached):
    ptx = kernel_ptx(unreached, {}, "t")
    assert "made_up" not in ptx and ".extern .func" not in ptx
    if ptxas_path() is None:
        pytest.skip("ptxas not found (CUDA's compiler)")
    for arch in ("sm_80", "sm_90"):
        result = run_ptxas(ptx, arch)
        assert result.returncode == 0, f"ptxas {arch}: {result.stderr[:1000]}"


def test_called_intrinsic_is_refused_for_cuda(reached):
    with pytest.raises(tm.UnsupportedKernelError,
                       match=re.escape("reached: the CUDA backend has no implementation of air.made_up_op.f32")):
        kernel_ptx(reached, {}, "t")

"""The Metal backend on a Mac: kernels on ``mps`` tensors against the CPU backend,
ordering with torch's own ops in the same MPS stream, operators under autograd and
``torch.compile``. Run by .github/workflows/macos.yml; skipped only where
``torch.backends.mps.is_available()`` is false (every Linux machine, where
tests/test_metal_sim.py runs the same Objective-C++ against a simulated Metal).

The conformance families run unchanged with every call mirrored on ``mps``
(tests/_device_mirror.py): the CPU results are checked against torch as usual, and the
GPU's must match them.
"""

import pytest
import torch

import torch_metallib as tm
import _argument_buffers as argument_buffers
import _conformance as conformance
import _cooperative as cooperative
import _mlx_matmul as matmul
from _device_mirror import assert_same, mirrored_calls
from _ops_examples import check_sigmoid_on

MPS = torch.backends.mps.is_available()
on_mac = pytest.mark.skipif(not MPS, reason="torch.backends.mps.is_available() is False: no Metal device")


@pytest.fixture
def on_mps():
    with mirrored_calls("mps") as names:
        yield names
    assert names, "no kernel call was mirrored on mps"


# --- the mirror itself, on any machine --------------------------------------------------------

def test_the_mirror_keeps_aliasing_and_catches_a_difference(mlx_lib):
    """Mirrored on cpu (the harness alone): views of one storage stay views of one copy, so
    an in-place call through two aliasing views matches; a result the second run changes
    is reported."""
    base = torch.arange(12, dtype=torch.float32)
    a = base[:6]
    with mirrored_calls("cpu") as names:
        mlx_lib.vv_Addfloat32(a, a, base[6:], 6)
    assert names == ["vv_Addfloat32"] and torch.equal(base[6:], 2 * base[:6])
    with pytest.raises(AssertionError, match="vv_Addfloat32"):
        assert_same("vv_Addfloat32", base, base + 1)


# --- conformance families on mps, against the CPU backend -------------------------------------

@on_mac
@pytest.mark.parametrize("case", conformance.params(conformance.UNARY_CASES[::3]))
def test_unary(mlx_lib, case, on_mps):
    conformance.check_unary(mlx_lib, case)


@on_mac
@pytest.mark.parametrize("case", conformance.params(conformance.BINARY_CASES[::6]))
def test_binary(mlx_lib, case, on_mps):
    conformance.check_binary_contiguous(mlx_lib, case)


@on_mac
@pytest.mark.parametrize("case", conformance.params(conformance.STRIDED_BINARY_CASES[::10]))
def test_binary_strided(mlx_lib, case, on_mps):
    conformance.check_binary_strided(mlx_lib, case)


@on_mac
@pytest.mark.parametrize("case", conformance.params(conformance.COPY_CASES[::8]))
def test_copy(mlx_lib, case, on_mps):
    conformance.check_copy_contiguous(mlx_lib, case)


@on_mac
@pytest.mark.parametrize("case", conformance.params(conformance.STRIDED_COPY_CASES[::5]))
def test_copy_strided(mlx_lib, case, on_mps):
    conformance.check_copy_strided(mlx_lib, case)


@on_mac
def test_fixture_kernels(fixtures_lib, on_mps):
    conformance.check_fixture_vector_add_float(fixtures_lib)
    conformance.check_fixture_scale_shift_float(fixtures_lib, True)
    conformance.check_fixture_struct_arg_axpy(fixtures_lib)


@on_mac
@pytest.mark.parametrize("use_bias, alpha", [(True, 1.5), (False, -2.25)])
def test_function_constants(fixtures_lib, use_bias, alpha, on_mps):
    conformance.check_fixture_function_constant_scale(fixtures_lib, use_bias, alpha)


@on_mac
@pytest.mark.parametrize("group", [32, 128])
def test_threadgroup_memory(fixtures, group, on_mps):
    cooperative.check_threadgroup_sum_with_threadgroup_memory(fixtures, group)


@on_mac
@pytest.mark.parametrize("dtype", cooperative.DTYPES)
@pytest.mark.parametrize("variant", ["block", "looped"])
def test_softmax(mlx_lib, variant, dtype, on_mps):
    cooperative.check_softmax(mlx_lib, variant, dtype)


@on_mac
@pytest.mark.parametrize("looped", [False, True])
def test_layer_norm(mlx_lib, looped, on_mps):
    cooperative.check_layer_norm(mlx_lib, looped)


@on_mac
@pytest.mark.parametrize("transpose,dtype", [("nt", "float16"), ("tn", "float32"), ("nn", "bfloat16")])
def test_steel_gemm(mlx_lib, transpose, dtype, on_mps):
    matmul.check_steel_gemm_unaligned(mlx_lib, (32, 32, 16, 2, 2), transpose, dtype)


@on_mac
def test_argument_buffers(mlx002, on_mps):
    argument_buffers.check_gather_rows_matches_torch(mlx002, "dict")
    argument_buffers.check_gather_with_two_index_arrays_matches_torch(mlx002)


# --- the MPS stream, limits and operators ------------------------------------------------------

@on_mac
def test_kernels_order_with_torch_ops_in_the_stream_without_a_synchronize(mlx_lib):
    """torch op -> kernel -> torch op -> kernel, all queued on the MPS stream; only the
    final .cpu() waits."""
    n = 1 << 20
    x = torch.randn(n, device="mps")
    y = x * 2
    out = torch.empty_like(y)
    mlx_lib.vv_Addfloat32(y, y, out, n)
    z = out + 1
    mlx_lib.vv_Addfloat32(z, y, out, n)
    want = (x.cpu() * 2) * 2 + 1 + x.cpu() * 2
    torch.testing.assert_close(out.cpu(), want)


@on_mac
def test_pipeline_limits_and_group_checks(mlx_lib):
    kernel = mlx_lib.vv_Addfloat32
    limits = kernel.pipeline_limits()
    assert limits["max_total_threads_per_threadgroup"] >= 256 and limits["thread_execution_width"] == 32
    a = torch.zeros(8, device="mps")
    with pytest.raises(tm.DispatchError, match="group_size"):
        kernel(a, a, a, 8, threads=4096, group_size=limits["max_total_threads_per_threadgroup"] * 2)


@on_mac
def test_operator_eager_autograd_and_compile_on_mps(mlx_ops):
    check_sigmoid_on("mps", mlx_ops)

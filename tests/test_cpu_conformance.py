"""CPU conformance: Apple-built MLX kernels, JIT-compiled from their AIR bitcode and run on
CPU tensors, against torch on the CPU. Plus the project's own fixture kernels.

Every kernel runs on inputs inside its op's domain (deterministic, seeded by the kernel
name), over sizes that are not multiples of 32 or of the threadgroup size (partial
threadgroups at the grid's edge, on every axis of 2-D/3-D grids), into an output whose
bytes start as 0xA5, with one element after the grid and one before the output (a storage
offset): every element the kernel should write must match torch, those two must keep 0xA5.
Strided kernels read transposed, permuted, sliced (storage offset), broadcast (stride 0) and
backwards (negative stride) inputs. The ops' semantics, domains and references are in
_mlx_families.py.

Left out on purpose (one line each):
* complex64 kernels: MLX's complex conventions (ordering in Maximum, branch cuts) need their own references.
* kernels with threadgroup barriers or SIMD-group functions: test_cpu_cooperative.py covers
  those, simdgroup matrices test_cpu_collectives.py, test_simdgroup_matrix_strided.py and
  test_cpu_mlx_matmul.py.
"""

import pytest
import torch

import torch_metallib as tm
from _conformance import (ARANGE_CASES, BINARY_CASES, COPY_CASES, Case, SELECT_CASES, STRIDED_BINARY_CASES,
                          STRIDED_COPY_CASES, UNARY_CASES, _exact_floats, check, check_arange, check_binary_contiguous,
                          check_binary_strided, check_copy_contiguous, check_copy_strided,
                          check_fixture_function_constant_scale, check_fixture_scale_shift_float,
                          check_fixture_struct_arg_axpy, check_fixture_vector_add_float, check_select, check_tail,
                          check_unary, params)
from _mlx_families import DTYPES, FLOAT_TYPES, SIZE_1D, generator, sentinel_like, work_per_thread


# --- parametrization ------------------------------------------------------------------------

FP8_CASES = (
    [Case(f, f"{f}_FromFP8uint8{t}", "FromFP8", "uint8", t) for f in ("v", "vn") for t in FLOAT_TYPES]
    + [Case(f, f"{f}_ToFP8{t}uint8", "ToFP8", t, "uint8") for f in ("v", "vn") for t in FLOAT_TYPES]
)
FIXTURE_KERNELS_RUN = ("vector_add_float", "scale_shift_float", "struct_arg_axpy", "function_constant_scale")

MLX_CASES = (UNARY_CASES + FP8_CASES + SELECT_CASES + BINARY_CASES + STRIDED_BINARY_CASES + COPY_CASES
             + STRIDED_COPY_CASES + ARANGE_CASES)
MLX_KERNELS = sorted({case.kernel for case in MLX_CASES})


# --- bookkeeping tests ------------------------------------------------------------------------

def test_covers_at_least_300_distinct_kernels():
    kernels = set(MLX_KERNELS) | set(FIXTURE_KERNELS_RUN)
    assert len(MLX_CASES) == len(MLX_KERNELS), "a kernel is parametrized twice"
    assert len(kernels) >= 300, f"only {len(kernels)} distinct kernels"


def test_parametrized_kernels_exist_and_run_on_cpu(mlx_lib):
    missing = [k for k in MLX_KERNELS if k not in mlx_lib]
    assert not missing, f"not in mlx.metallib: {missing[:20]}"
    cooperative = [k for k in MLX_KERNELS if mlx_lib[k].uses_barriers or mlx_lib[k].uses_simdgroup_ops]
    assert not cooperative


# --- unary ------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", params(UNARY_CASES))
def test_unary(mlx_lib, case):
    check_unary(mlx_lib, case)


@pytest.mark.parametrize("case", params(FP8_CASES))
def test_fp8(mlx_lib, case):
    k = mlx_lib[case.kernel]
    size = SIZE_1D
    per_thread = 1 if case.family == "v" else work_per_thread(case.tag)
    if case.op == "FromFP8":  # every byte value, NaN codes 0x7f/0xff included
        x = (torch.arange(size) * 37 % 256).to(torch.uint8)
        want = x.view(torch.float8_e4m3fn).to(DTYPES[case.out])
    else:  # in range: MLX saturates at 448 where torch gives NaN
        gen = generator(case.kernel)
        x = (torch.rand(size, generator=gen, dtype=torch.float64) * 2 - 1)
        x = (x * torch.pow(2.0, torch.randint(-12, 9, (size,), generator=gen).double())).clamp(-440, 440)
        x = x.to(DTYPES[case.tag])
        want = x.float().to(torch.float8_e4m3fn).view(torch.uint8)
    out = sentinel_like(size, case.out)
    k(x, out, size, threads=-(-size // per_thread))
    check(case.kernel, out[:size], want)
    check_tail(case.kernel, out, size)


@pytest.mark.parametrize("case", params(SELECT_CASES))
def test_select(mlx_lib, case):
    check_select(mlx_lib, case)


# --- binary -----------------------------------------------------------------------------------

@pytest.mark.parametrize("case", params(BINARY_CASES))
def test_binary_contiguous(mlx_lib, case):
    check_binary_contiguous(mlx_lib, case)


@pytest.mark.parametrize("case", params(STRIDED_BINARY_CASES))
def test_binary_strided(mlx_lib, case):
    check_binary_strided(mlx_lib, case)


# --- copies -----------------------------------------------------------------------------------

@pytest.mark.parametrize("case", params(COPY_CASES))
def test_copy_contiguous(mlx_lib, case):
    check_copy_contiguous(mlx_lib, case)


@pytest.mark.parametrize("case", params(STRIDED_COPY_CASES))
def test_copy_strided(mlx_lib, case):
    check_copy_strided(mlx_lib, case)


# --- arange -----------------------------------------------------------------------------------

@pytest.mark.parametrize("case", params(ARANGE_CASES))
def test_arange(mlx_lib, case):
    check_arange(mlx_lib, case)


# --- the project's fixture kernels ----------------------------------------------------------

def test_fixture_vector_add_float(fixtures_lib):
    check_fixture_vector_add_float(fixtures_lib)


@pytest.mark.parametrize("as_tensor", [False, True], ids=["python-numbers", "0d-tensors"])
def test_fixture_scale_shift_float(fixtures_lib, as_tensor):
    check_fixture_scale_shift_float(fixtures_lib, as_tensor)


def test_fixture_struct_arg_axpy(fixtures_lib):
    check_fixture_struct_arg_axpy(fixtures_lib)


@pytest.mark.parametrize("use_bias, alpha", [(True, 1.5), (False, -2.25), (True, 0.0)],
                         ids=["bias-alpha1.5", "nobias-alpha-2.25", "bias-alpha0"])
def test_fixture_function_constant_scale(fixtures_lib, use_bias, alpha):
    check_fixture_function_constant_scale(fixtures_lib, use_bias, alpha)


def test_fixture_function_constant_guarded_argument_rejected(fixtures_lib):
    x = _exact_floats(8, 8)
    off = {"use_bias": False, "alpha": 1.0}
    with pytest.raises(tm.DispatchError, match="use_bias"):  # by name: exists only with use_bias
        fixtures_lib.function_constant_scale(x, torch.empty(8), bias=x, threads=8, constants=off)
    with pytest.raises(tm.KernelArgumentError, match="at most 2 arguments"):  # by position: one too many
        fixtures_lib.function_constant_scale(x, torch.empty(8), x, threads=8, constants=off)

"""MLX reductions on the CPU against torch: Apple-built kernels from mlx.metallib
(mlx/backend/metal/kernels/reduction/reduce_{all,row,col,init}.h, arg_reduce.metal),
launched the way mlx/backend/metal/reduce.cpp and ArgReduce::eval_gpu launch them.

Families: all_reduce (one threadgroup, and the first pass of the multi-threadgroup
reduction), row_reduce_small (both code paths: a thread per output, a SIMD-group per
output), row_reduce_looped, row_reduce_simple, col_reduce_small, col_reduce_longcolumn
and col_reduce_2pass (their per-block partial results, then the col_reduce_looped second
pass MLX runs on them), col_reduce_looped, init_reduce, argmin/argmax. The `_1_`, `_2_`
and `_5_` variants (how many reduction axes besides the row/column one the looped index
handles: 1, 2, any) run with 1, 2 and 3 such axes; `_large` variants (64-bit indexing)
run on small inputs too. The column offset argument of col_reduce_looped/2pass (newer
than the MLX sources we could read) is passed as 0.

Every output buffer has a guard element after it whose bytes start as 0xA5 and must keep
them; bool outputs must be bytes 0 or 1. Random data decides a max/min/and/or from a few
of its elements, so the inputs also plant, per output, one element the result hinges on
(plant(): the first or last of its group, or one in between; for the single-output
all_reduce, several positions in turn). Every kernel name under test is in KERNELS (308).

Tolerances: none. Integer results are exact. Float inputs are built so that the exact
result is representable and every order of accumulation reaches it (MLX accumulates in
the output type, half for float16, and in an order of its own: per-thread runs, then
simd_sum and a threadgroup tree), so float results are compared bit for bit too:
* sum: integer values with, per output, the sum of the positive ones and the sum of the
  negative ones at most 2**p (p = 24 / 11 / 8 significand bits for float32 / float16 /
  bfloat16): every partial sum, in any order, is an integer of at most 2**p in magnitude,
  hence exact. The tests assert this precondition on the data they run.
* prod: +-1 with at most 14 factors 2 and at most 14 factors 0.5 per output (integers: 2
  only): every partial product is +-2**k with |k| <= 14, exact in all three float types
  (float16 normals reach 2**-14, its largest value is 65504).
* max/min/argmax/argmin/and/or pick or test elements: no rounding at all.
test_sum_of_random_floats adds realistic data (normal values, inexact sums) for float32,
float16 and bfloat16 with a tolerance that holds for any summation order: an element goes
through at most h additions (those of its thread, then at most 31 in simd_sum and 31 across
SIMD-groups, whatever order they use), so |error| <= gamma_h * sum(|x_i|), gamma_h =
h*u / (1 - h*u), u = 2**-24 / 2**-11 / 2**-8 (MLX adds in the output type), plus u * |sum|
for rounding the float64 reference. Tight for float32; loose for the half types, which the
exact data above covers.

col_reduce_small as MLX dispatches it for more than 128 columns has lanes that return
before a threadgroup barrier (Apple GPUs let finished threads pass it); the default
("parallel") CPU schedule does too, the sequential / permuted debug schedules report it,
so that launch runs in the parallel schedule whatever TORCH_METALLIB_CPU_SCHEDULE says.

Left out (one line each):
* complex64 kernels: MLX orders complex numbers its own way; they need their own references.
* NaN in max/min/argmax/argmin inputs: MLX's NaN handling differs between versions of
  reduction/ops.h and arg_reduce.metal (this corpus's version is not in the sources we have).
"""

import pytest
import torch

from _mlx_reductions import (ALL_CASES, ALL_REDUCE_CASES, ARG_CASES, COL_CASES, FLOATS, INIT_CASES, Layout, ROW_CASES,
                             SIGNIFICAND_BITS, _generator, _ids, _roundup, check_all_reduce, check_arg_reduce,
                             check_col_reduce, check_init_reduce, check_row_reduce, out_dtype_of, run)


# --- types ---------------------------------------------------------------------------------

UNIT_ROUNDOFF = {dtype: 2.0 ** -bits for dtype, bits in SIGNIFICAND_BITS.items()}


# --- the kernels under test ----------------------------------------------------------------

KERNELS = sorted({case.kernel for case in ALL_CASES})


def test_every_kernel_under_test_is_in_the_corpus(mlx_lib):
    missing = [name for name in KERNELS if name not in mlx_lib]
    assert not missing, missing
    assert len(KERNELS) >= 80


# --- all_reduce ----------------------------------------------------------------------------

@pytest.mark.parametrize("case", ALL_REDUCE_CASES, ids=_ids(ALL_REDUCE_CASES))
def test_all_reduce(mlx_lib, case):
    check_all_reduce(mlx_lib, case)


# --- row reductions ------------------------------------------------------------------------

@pytest.mark.parametrize("case", ROW_CASES, ids=_ids(ROW_CASES))
def test_row_reduce(mlx_lib, case):
    check_row_reduce(mlx_lib, case)


# --- column reductions ---------------------------------------------------------------------

@pytest.mark.parametrize("case", COL_CASES, ids=_ids(COL_CASES))
def test_col_reduce(mlx_lib, case):
    check_col_reduce(mlx_lib, case)


# --- init_reduce ---------------------------------------------------------------------------

@pytest.mark.parametrize("case", INIT_CASES, ids=_ids(INIT_CASES))
def test_init_reduce(mlx_lib, case):
    check_init_reduce(mlx_lib, case)


# --- argmin / argmax -----------------------------------------------------------------------

@pytest.mark.parametrize("case", ARG_CASES, ids=_ids(ARG_CASES))
def test_arg_reduce(mlx_lib, case):
    check_arg_reduce(mlx_lib, case)


# --- realistic data: inexact float sums ----------------------------------------------------

# (kernel prefix, input shape, reduced axes, launch, additions one thread makes before the
# SIMD-group reductions). Any element goes through at most that many additions in its
# thread, 31 in simd_sum (whatever order it uses) and 31 across SIMD-groups: h additions.
# Summing in any such order in a type of unit roundoff u is off the exact sum by at most
# gamma_h * sum(|x_i|), gamma_h = h * u / (1 - h * u); the result is then compared with the
# float64 sum rounded to the output type (one more u * |sum|).
RANDOM_SUMS = [
    ("all_reduce_sum", (3001,), (0,), "all", 4),                     # 768 threads, 4 elements each
    ("row_reduce_simple_sum", (37, 150), (1,), "simple", 8),         # 32 threads, 4 + up to 4
    ("col_reduce_looped_1_32_32_reduce_sum", (3, 100, 70), (1,), "col_looped", 4),  # rows 32 apart
]
RANDOM_SUM_CASES = [(prefix + tag, shape, axes, launch, per_thread)
                    for prefix, shape, axes, launch, per_thread in RANDOM_SUMS for tag in FLOATS]


@pytest.mark.parametrize("kernel, shape, axes, launch, per_thread", RANDOM_SUM_CASES,
                         ids=[c[0] for c in RANDOM_SUM_CASES])
def test_sum_of_random_floats(mlx_lib, kernel, shape, axes, launch, per_thread):
    fn = mlx_lib[kernel]
    dtype = out_dtype_of(fn)
    x = (torch.randn(shape, generator=_generator(kernel, 99)) * 4).to(dtype)
    layout = Layout(shape, axes)
    if launch == "all":
        n = x.numel()
        group = _roundup((n + 3) // 4, 32)
        got = run(fn, x, 1, n, n, threads=group, group_size=group)
    elif launch == "simple":
        got = run(fn, x, layout.n_out, shape[-1], layout.n_out, threads=(32, (layout.n_out + 3) // 4, 1),
                  group_size=32)
    else:
        got = run(fn, x, layout.n_out, *layout.col_args(), 0, threads=(256 * 3, shape[0], 1), group_size=256)
    exact = x.double().sum(dim=axes).flatten()
    u = UNIT_ROUNDOFF[dtype]
    h = per_thread + 31 + 31
    bound = h * u / (1 - h * u) * x.double().abs().sum(dim=axes).flatten() + u * exact.abs()
    error = (got.double() - exact).abs()
    assert bool((error <= bound).all()), \
        f"{kernel}: error {error.max().item():.3g} above the bound {bound[error.argmax()].item():.3g}"
    # For float32 the bound is below the size of a typical term, so a term left out or
    # counted twice fails; for float16 / bfloat16 it is loose (the exact-data tests above
    # are the strict ones for those types).
    if dtype == torch.float32:
        assert bool((bound < x.double().abs().mean() / 4).all())

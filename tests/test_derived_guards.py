"""Arguments guarded by predicates the kernel derives from its function constants.

diffusion-rs's Metal FlashAttention GEMM declares ``D [[function_constant(use_activation)]]``
and ``table [[visible_function_table(11), function_constant(use_activation_function)]]``,
where (MFA's GEMM.metal) use_activation_function = fused_activation && !fused_bias,
use_bias = fused_bias (when defined), use_activation = use_activation_function || use_bias,
and batched_activation_function = batched && use_activation_function. Reflection reads
these back from the module's static initializer; the binding plan evaluates them per call.
"""

import pytest
import torch

import torch_metallib as tm
from _public_corpus import subset_files

BASE = dict(M=8, N=8, K=8, A_trans=False, B_trans=False, alpha=1.0, beta=0.0, batched=False,
            fused_activation=False, block_sparse=False, triangular=False, grouped_query=False,
            M_simd=8, N_simd=8, K_simd=8, M_splits=1, N_splits=1, masked=False)


@pytest.fixture(scope="module")
def sgemm():
    return tm.load(next(p for p in subset_files() if p.name.startswith("diffusion-rs"))).sgemm


def call(kernel, **changes):
    a, b, c = torch.ones(8, 8), torch.ones(8, 8), torch.zeros(8, 8)
    d = changes.pop("D", None)
    extra = {"D": d} if d is not None else {}
    kernel(a, b, c, threads=(32, 1, 1), group_size=(32, 1, 1), constants={**BASE, **changes},
           threadgroup_memory={0: 512}, **extra)
    return c


def test_reflection_reads_every_derived_predicate(sgemm):
    predicates = dict(sgemm.reflection.derived_predicates)
    assert set(predicates) == {"use_activation", "use_activation_function", "batched_activation_function"}
    assert all(expression is not None for expression in predicates.values())
    assert {a.name: a.function_constant for a in sgemm.arguments if a.function_constant} == {
        "D": "use_activation", "matrix_offsets": "batched", "table": "use_activation_function",
        "activation_function_offsets": "batched_activation_function"}


def test_derived_guard_false_leaves_the_argument_out(sgemm):
    assert torch.equal(call(sgemm), torch.full((8, 8), 8.0))
    with pytest.raises(tm.DispatchError, match=r"argument 3 'D' .* is left out because use_activation "
                                               r"\(which the kernel derives from its function constants\) is false"):
        call(sgemm, D=torch.zeros(8))


def test_derived_guard_true_requires_the_argument(sgemm):
    # fused_bias: use_bias, so use_activation, while use_activation_function stays false.
    with pytest.raises(tm.KernelArgumentError, match=r"missing argument 3 'D'"):
        call(sgemm, fused_activation=True, fused_bias=True)


@pytest.mark.parametrize("batched", [False, True])
def test_function_table_refused_only_when_present(sgemm, batched):
    with pytest.raises(tm.UnsupportedKernelError, match=r"argument 6 'table' .*present because "
                                                        r"use_activation_function is true.* visible_function_table"):
        call(sgemm, fused_activation=True, batched=batched, D=torch.zeros(8))


"""Shared by tests/test_ops_define.py and the child process one of its tests starts: the
operators' namespace, and an operator on a kernel that lacks a barrier."""

import torch

import torch_metallib as tm
from conftest import fixture_bitcode
from torch_metallib import ops

NS = "tm_define_tests"
F32 = [torch.float32]
GROUP, GROUPS = 64, 6                # the missing_barrier fixture's threadgroups


def left_neighbours(x: torch.Tensor) -> torch.Tensor:
    """What missing_barrier means to compute: each thread's left neighbour in its group
    (thread 0 its own value)."""
    groups = x.view(-1, GROUP)
    return torch.cat([groups[:, :1], groups[:, :-1]], 1).reshape(-1)


def define_left_neighbour(qualname: str):
    """An operator on tests/fixtures/cooperative/missing_barrier.ll, a kernel that lacks a
    barrier: right in index order (parallel, sequential), wrong in permuted order.
    Also used by the child process of test_environment_schedule_reaches_the_operator."""
    lib = tm.load(tm.pack([tm.FunctionSource("missing_barrier", fixture_bitcode("cooperative/missing_barrier"))]))
    return ops.define(f"{qualname}(Tensor x) -> Tensor", lib, "missing_barrier", dtypes=F32, bind={"in": "x"},
                      outputs={"out": ops.like("x")}, threads=ops.numel("x"), group_size=GROUP,
                      threadgroup_memory={0: GROUP * 4})


def ramp() -> torch.Tensor:
    return torch.arange(1.0, GROUPS * GROUP + 1)

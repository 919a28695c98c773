"""Cooperative kernels become one coroutine per thread with every function inlined into it
(torch_metallib/backends/cpu/coroutine.py): waits in helper functions, including ones the
kernel's compiler marked noinline, and the error for a wait that cannot be inlined."""

import llvmlite.binding as llvm
import pytest
import torch

import torch_metallib as tm
from conftest import FIXTURES

# simdgroup_barrier_threadgroup.ll, with its barrier moved into a helper function.
_BARRIER = "  tail call void @air.simdgroup.barrier(i32 2, i32 1) #2\n"
_HELPER = """
define internal void @wait_for_lanes(i32 %depth) #{attributes} {{
  {body}
  ret void
}}
"""


def _kernel(helper_body: str, helper_attributes: str):
    text = (FIXTURES / "collectives" / "simdgroup_barrier_threadgroup.ll").read_text()
    assert _BARRIER in text
    text = text.replace(_BARRIER, "  call void @wait_for_lanes(i32 2)\n")
    text += _HELPER.format(attributes=7, body=helper_body) + f"attributes #7 = {{ {helper_attributes} }}\n"
    module = llvm.parse_assembly(text, context=llvm.create_context())
    module.verify()
    name = "simdgroup_barrier_threadgroup"
    return tm.load(tm.pack([tm.FunctionSource(name, module.as_bitcode())]))[name]


@pytest.mark.parametrize("attributes", ["convergent nounwind", "convergent noinline nounwind",
                                        "convergent noinline optnone nounwind"])
def test_waits_in_helper_functions_are_inlined(attributes):
    kernel = _kernel("tail call void @air.simdgroup.barrier(i32 2, i32 1)", attributes)
    threads, group = 96, 32
    v = torch.arange(threads, dtype=torch.int32) * 7
    out = torch.full((threads,), -1, dtype=torch.int32)
    with tm.cpu_schedule("permuted", seed=5):  # neighbours' stores are seen only after a real wait
        kernel(v, out, threads=threads, group_size=group, threadgroup_memory={0: group * 4})
    assert torch.equal(out, v[torch.arange(threads) ^ 1])


def test_a_wait_in_a_recursive_function_is_refused():
    recursive = """%more = icmp ugt i32 %depth, 0
  br i1 %more, label %again, label %done
again:
  %next = sub i32 %depth, 1
  call void @wait_for_lanes(i32 %next)
  tail call void @air.simdgroup.barrier(i32 2, i32 1)
  br label %done
done:"""
    kernel = _kernel(recursive, "convergent nounwind")
    v = torch.zeros(32, dtype=torch.int32)
    with pytest.raises(tm.UnsupportedKernelError, match="could not be inlined"):
        kernel(v, torch.empty_like(v), threads=32, group_size=32, threadgroup_memory={0: 128})

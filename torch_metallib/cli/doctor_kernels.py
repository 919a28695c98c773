"""The doctor's self-test library: two small AIR kernels, written here as LLVM IR text,
assembled with llvmlite and packed with the package's own ``pack`` (so the installed
package needs nothing from tests/).

``vector_add_float`` is tests/fixtures/vector_add_float.ll without its TBAA and alias
metadata. ``group_sum_int`` is new: a SIMD-group reduction, a threadgroup barrier and
threadgroup memory in one kernel:

    kernel void group_sum_int(device const int* in       [[buffer(0)]],
                              device int*       out      [[buffer(1)]],
                              threadgroup int*  partial  [[threadgroup(0)]],
                              uint gid   [[thread_position_in_grid]],
                              uint group [[threadgroup_position_in_grid]],
                              uint lane  [[thread_index_in_simdgroup]],
                              uint sg    [[simdgroup_index_in_threadgroup]],
                              uint nsg   [[simdgroups_per_threadgroup]])
    {
        int s = simd_sum(in[gid]);
        if (lane == 0) partial[sg] = s;
        threadgroup_barrier(mem_flags::mem_threadgroup);
        if (sg == 0 && lane == 0) {
            int total = 0;
            for (uint i = 0; i < nsg; ++i) total += partial[i];
            out[group] = total;
        }
    }

Both are written in the fixtures' module layout (triple, datalayout, module flags,
``!air.kernel`` nodes as Apple's compiler writes them) by ``reflection.kernel_module``.
"""

import llvmlite.binding as llvm

from ..reflection.kernel_module import buffer_node, builtin_node, kernel_module

__all__ = ["KERNELS", "module_text", "self_test_library_bytes"]

_VECTOR_ADD = """
define weak_odr void @vector_add_float(ptr addrspace(1) noundef "air-buffer-no-alias" %a, ptr addrspace(1) noundef "air-buffer-no-alias" %b, ptr addrspace(1) noundef "air-buffer-no-alias" %out, i32 noundef %index) local_unnamed_addr #0 {
  %i = zext i32 %index to i64
  %pa = getelementptr inbounds float, ptr addrspace(1) %a, i64 %i
  %va = load float, ptr addrspace(1) %pa, align 4
  %pb = getelementptr inbounds float, ptr addrspace(1) %b, i64 %i
  %vb = load float, ptr addrspace(1) %pb, align 4
  %sum = fadd float %va, %vb
  %po = getelementptr inbounds float, ptr addrspace(1) %out, i64 %i
  store float %sum, ptr addrspace(1) %po, align 4
  ret void
}
"""

_GROUP_SUM = """
define weak_odr void @group_sum_int(ptr addrspace(1) noundef "air-buffer-no-alias" %in, ptr addrspace(1) noundef "air-buffer-no-alias" %out, ptr addrspace(3) noundef "air-buffer-no-alias" %partial, i32 noundef %gid, i32 noundef %group, i32 noundef %lane, i32 noundef %sg, i32 noundef %nsg) local_unnamed_addr #0 {
entry:
  %gi = zext i32 %gid to i64
  %pin = getelementptr inbounds i32, ptr addrspace(1) %in, i64 %gi
  %v = load i32, ptr addrspace(1) %pin, align 4
  %s = tail call i32 @air.simd_sum.s.i32(i32 %v) #2
  %first_lane = icmp eq i32 %lane, 0
  br i1 %first_lane, label %publish, label %wait

publish:
  %si = zext i32 %sg to i64
  %pp = getelementptr inbounds i32, ptr addrspace(3) %partial, i64 %si
  store i32 %s, ptr addrspace(3) %pp, align 4
  br label %wait

wait:
  tail call void @air.wg.barrier(i32 2, i32 1) #2
  %either = or i32 %lane, %sg
  %first_thread = icmp eq i32 %either, 0
  br i1 %first_thread, label %loop, label %done

loop:
  %i = phi i32 [ 0, %wait ], [ %next, %body ]
  %total = phi i32 [ 0, %wait ], [ %added, %body ]
  %more = icmp ult i32 %i, %nsg
  br i1 %more, label %body, label %store

body:
  %ii = zext i32 %i to i64
  %pi = getelementptr inbounds i32, ptr addrspace(3) %partial, i64 %ii
  %part = load i32, ptr addrspace(3) %pi, align 4
  %added = add i32 %total, %part
  %next = add i32 %i, 1
  br label %loop

store:
  %g = zext i32 %group to i64
  %po = getelementptr inbounds i32, ptr addrspace(1) %out, i64 %g
  store i32 %total, ptr addrspace(1) %po, align 4
  br label %done

done:
  ret void
}

declare i32 @air.simd_sum.s.i32(i32) local_unnamed_addr #1

declare void @air.wg.barrier(i32, i32) local_unnamed_addr #1
"""

# name -> (function IR, argument nodes in parameter order, convergent)
KERNELS = {
    "vector_add_float": (_VECTOR_ADD, [
        buffer_node(0, "a", "float", 4, slot=0, access="air.read"),
        buffer_node(1, "b", "float", 4, slot=1, access="air.read"),
        buffer_node(2, "out", "float", 4, slot=2, access="air.read_write"),
        builtin_node(3, "air.thread_position_in_grid", "index"),
    ], False),
    "group_sum_int": (_GROUP_SUM, [
        buffer_node(0, "in", "int", 4, slot=0, access="air.read"),
        buffer_node(1, "out", "int", 4, slot=1, access="air.read_write"),
        buffer_node(2, "partial", "int", 4, slot=0, access="air.read_write", space=3),
        builtin_node(3, "air.thread_position_in_grid", "gid"),
        builtin_node(4, "air.threadgroup_position_in_grid", "group"),
        builtin_node(5, "air.thread_index_in_simdgroup", "lane"),
        builtin_node(6, "air.simdgroup_index_in_threadgroup", "sg"),
        builtin_node(7, "air.simdgroups_per_threadgroup", "nsg"),
    ], True),
}
# Attribute groups #1 (the intrinsics' declarations) and #2 (their calls).
_INTRINSIC_ATTRIBUTES = ["convergent mustprogress nounwind willreturn", "convergent nounwind willreturn"]


def module_text(name: str) -> str:
    """The complete AIR module (LLVM IR text) of kernel `name`."""
    function, arguments, convergent = KERNELS[name]
    return kernel_module(name, function, arguments, convergent, _INTRINSIC_ATTRIBUTES)


def self_test_library_bytes() -> bytes:
    """Both kernels assembled (llvmlite) and packed into one .metallib by ``tm.pack``."""
    from ..container.pack import FunctionSource, pack

    sources = []
    for name in KERNELS:
        module = llvm.parse_assembly(module_text(name), context=llvm.create_context())
        module.verify()
        sources.append(FunctionSource(name, module.as_bitcode()))
    return pack(sources)

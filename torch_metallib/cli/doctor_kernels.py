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

Both follow the module layout of the fixtures (triple, datalayout, module flags,
``!air.kernel`` nodes as Apple's compiler writes them; see tests/fixtures/README.md).
"""

import llvmlite.binding as llvm

__all__ = ["KERNELS", "module_text", "self_test_library_bytes"]

_PROLOGUE = """source_filename = "{name}"
target datalayout = "e-p:64:64:64-i1:8:8-i8:8:8-i16:16:16-i32:32:32-i64:64:64-f32:32:32-f64:64:64-v16:16:16-v24:32:32-v32:32:32-v48:64:64-v64:64:64-v96:128:128-v128:128:128-v192:256:256-v256:256:256-v512:512:512-v1024:1024:1024-n8:16:32"
target triple = "air64_v26-apple-macosx14.0.0"

@llvm.global_ctors = appending global [0 x {{ i32, ptr, ptr }}] zeroinitializer
"""

_EPILOGUE = """
attributes #0 = {{ {convergent}mustprogress nounwind "frame-pointer"="all" "min-legal-vector-width"="0" "no-builtins" "no-trapping-math"="true" "stack-protector-buffer-size"="8" }}
attributes #1 = {{ convergent mustprogress nounwind willreturn }}
attributes #2 = {{ convergent nounwind willreturn }}

!llvm.module.flags = !{{!0, !1, !2, !3, !4, !5, !6, !7, !8}}
!llvm.ident = !{{!9}}
!air.version = !{{!10}}
!air.language_version = !{{!11}}
!air.compile_options = !{{!12, !13, !14}}
!air.kernel = !{{!15}}

!0 = !{{i32 2, !"SDK Version", [2 x i32] [i32 26, i32 5]}}
!1 = !{{i32 1, !"wchar_size", i32 4}}
!2 = !{{i32 7, !"frame-pointer", i32 2}}
!3 = !{{i32 7, !"air.max_device_buffers", i32 31}}
!4 = !{{i32 7, !"air.max_constant_buffers", i32 31}}
!5 = !{{i32 7, !"air.max_threadgroup_buffers", i32 31}}
!6 = !{{i32 7, !"air.max_textures", i32 128}}
!7 = !{{i32 7, !"air.max_read_write_textures", i32 8}}
!8 = !{{i32 7, !"air.max_samplers", i32 16}}
!9 = !{{!"Apple metal version 32023.883 (metalfe-32023.883)"}}
!10 = !{{i32 2, i32 6, i32 0}}
!11 = !{{!"Metal", i32 3, i32 1, i32 0}}
!12 = !{{!"air.compile.denorms_disable"}}
!13 = !{{!"air.compile.fast_math_disable"}}
!14 = !{{!"air.compile.framebuffer_fetch_enable"}}
!15 = !{{ptr @{name}, !16, !17}}
!16 = !{{}}
!17 = !{{{argument_refs}}}
"""


def _buffer(position, slot, access, space, type_name, name):
    return (f'!{{i32 {position}, !"air.buffer", !"air.location_index", i32 {slot}, i32 1, !"air.{access}", '
            f'!"air.address_space", i32 {space}, !"air.arg_type_size", i32 4, !"air.arg_type_align_size", i32 4, '
            f'!"air.arg_type_name", !"{type_name}", !"air.arg_name", !"{name}"}}')


def _builtin(position, builtin, name):
    return f'!{{i32 {position}, !"air.{builtin}", !"air.arg_type_name", !"uint", !"air.arg_name", !"{name}"}}'


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
        _buffer(0, 0, "read", 1, "float", "a"),
        _buffer(1, 1, "read", 1, "float", "b"),
        _buffer(2, 2, "read_write", 1, "float", "out"),
        _builtin(3, "thread_position_in_grid", "index"),
    ], False),
    "group_sum_int": (_GROUP_SUM, [
        _buffer(0, 0, "read", 1, "int", "in"),
        _buffer(1, 1, "read_write", 1, "int", "out"),
        _buffer(2, 0, "read_write", 3, "int", "partial"),
        _builtin(3, "thread_position_in_grid", "gid"),
        _builtin(4, "threadgroup_position_in_grid", "group"),
        _builtin(5, "thread_index_in_simdgroup", "lane"),
        _builtin(6, "simdgroup_index_in_threadgroup", "sg"),
        _builtin(7, "simdgroups_per_threadgroup", "nsg"),
    ], True),
}


def module_text(name: str) -> str:
    """The complete AIR module (LLVM IR text) of kernel `name`."""
    function, arguments, convergent = KERNELS[name]
    first = 18
    nodes = "".join(f"!{first + i} = {node}\n" for i, node in enumerate(arguments))
    refs = ", ".join(f"!{first + i}" for i in range(len(arguments)))
    return (_PROLOGUE.format(name=name) + function
            + _EPILOGUE.format(name=name, argument_refs=refs, convergent="convergent " if convergent else "")
            + nodes)


def self_test_library_bytes() -> bytes:
    """Both kernels assembled (llvmlite) and packed into one .metallib by ``tm.pack``."""
    from ..container.pack import FunctionSource, pack

    sources = []
    for name in KERNELS:
        module = llvm.parse_assembly(module_text(name), context=llvm.create_context())
        module.verify()
        sources.append(FunctionSource(name, module.as_bitcode()))
    return pack(sources)

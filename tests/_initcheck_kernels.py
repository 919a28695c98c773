"""AIR kernels for the threadgroup initcheck (checked execution), hand-written as Apple's
compiler writes them (module flags and argument nodes as tests/fixtures/cooperative/
missing_barrier.ll). Every kernel has the same signature:

    kernel void NAME(device const float* in [[buffer(0)]], device float* out [[buffer(1)]],
                     threadgroup float* scratch [[threadgroup(0)]],
                     uint lid [[thread_position_in_threadgroup]], uint gid [[thread_position_in_grid]])

and a threadgroup variable ``threadgroup float tile[64]`` (mangled as MSL mangles a
function-local array), and differs only in its body (KERNELS, with the Metal source each
mirrors)."""

import llvmlite.binding as llvm

import torch_metallib as tm

_TILE = "@_ZZ9initcheckE4tile"

_PROLOGUE = """  %g = zext i32 %gid to i64
  %l = zext i32 %lid to i64
  %in.at = getelementptr inbounds float, ptr addrspace(1) %in, i64 %g
  %x = load float, ptr addrspace(1) %in.at, align 4
  %out.at = getelementptr inbounds float, ptr addrspace(1) %out, i64 %g
  %s.at = getelementptr inbounds float, ptr addrspace(3) %scratch, i64 %l
  %t.at = getelementptr inbounds [64 x float], ptr addrspace(3) @TILE, i64 0, i64 %l
  %n32 = xor i32 %lid, 1
  %n = zext i32 %n32 to i64
  %t.next = getelementptr inbounds [64 x float], ptr addrspace(3) @TILE, i64 0, i64 %n
  %s.next = getelementptr inbounds float, ptr addrspace(3) %scratch, i64 %n
"""
_BARRIER = "  tail call void @air.wg.barrier(i32 2, i32 1) #2\n"

KERNELS = {
    # out[gid] = scratch[lid];  (nothing wrote scratch)
    "read_before_write": """  %v = load float, ptr addrspace(3) %s.at, align 4
  store float %v, ptr addrspace(1) %out.at, align 4
  ret void
""",
    # tile[lid] = in[gid]; barrier; out[gid] = tile[lid ^ 1];
    "write_barrier_read": """  store float %x, ptr addrspace(3) %t.at, align 4
""" + _BARRIER + """  %v = load float, ptr addrspace(3) %t.next, align 4
  store float %v, ptr addrspace(1) %out.at, align 4
  ret void
""",
    # scratch[lid] = in[gid]; barrier; out[gid] = scratch[lid ^ 1];
    "write_barrier_read_argument": """  store float %x, ptr addrspace(3) %s.at, align 4
""" + _BARRIER + """  %v = load float, ptr addrspace(3) %s.next, align 4
  store float %v, ptr addrspace(1) %out.at, align 4
  ret void
""",
    # if (lid % 2 == 0) tile[lid] = in[gid]; barrier; out[gid] = tile[lid ^ 1];  (odd slots unwritten)
    "even_threads_write": """  %odd = and i32 %lid, 1
  %even = icmp eq i32 %odd, 0
  br i1 %even, label %write, label %join
write:
  store float %x, ptr addrspace(3) %t.at, align 4
  br label %join
join:
""" + _BARRIER + """  %v = load float, ptr addrspace(3) %t.next, align 4
  store float %v, ptr addrspace(1) %out.at, align 4
  ret void
""",
    # ((threadgroup ushort*)&scratch[lid])[0] = 0; barrier; out[gid] = scratch[lid];  (bytes 2-3 unwritten)
    "low_half_written": """  store i16 0, ptr addrspace(3) %s.at, align 4
""" + _BARRIER + """  %v = load float, ptr addrspace(3) %s.at, align 4
  store float %v, ptr addrspace(1) %out.at, align 4
  ret void
""",
    # both ushort halves of scratch[lid] written (0x0000, 0x3f80: 1.0f); barrier; out[gid] = scratch[lid];
    "both_halves_written": """  store i16 0, ptr addrspace(3) %s.at, align 4
  %hi = getelementptr inbounds i8, ptr addrspace(3) %s.at, i64 2
  store i16 16256, ptr addrspace(3) %hi, align 2
""" + _BARRIER + """  %v = load float, ptr addrspace(3) %s.at, align 4
  store float %v, ptr addrspace(1) %out.at, align 4
  ret void
""",
    # atomic_store(&scratch[lid], in[gid]) as an atomic exchange; barrier; out[gid] = scratch[lid ^ 1];
    "atomic_write_barrier_read": """  %bits = bitcast float %x to i32
  %old = atomicrmw xchg ptr addrspace(3) %s.at, i32 %bits monotonic, align 4
""" + _BARRIER + """  %v = load float, ptr addrspace(3) %s.next, align 4
  store float %v, ptr addrspace(1) %out.at, align 4
  ret void
""",
}

_MODULE = """source_filename = "{name}"
target datalayout = "e-p:64:64:64-i1:8:8-i8:8:8-i16:16:16-i32:32:32-i64:64:64-f32:32:32-f64:64:64-v16:16:16-v24:32:32-v32:32:32-v48:64:64-v64:64:64-v96:128:128-v128:128:128-v192:256:256-v256:256:256-v512:512:512-v1024:1024:1024-n8:16:32"
target triple = "air64_v26-apple-macosx14.0.0"

@llvm.global_ctors = appending global [0 x {{ i32, ptr, ptr }}] zeroinitializer
@_ZZ9initcheckE4tile = internal unnamed_addr addrspace(3) global [64 x float] undef, align 4

define weak_odr void @{name}(ptr addrspace(1) noundef "air-buffer-no-alias" %in, ptr addrspace(1) noundef "air-buffer-no-alias" %out, ptr addrspace(3) noundef "air-buffer-no-alias" %scratch, i32 noundef %lid, i32 noundef %gid) local_unnamed_addr #0 {{
entry:
{body}}}

declare void @air.wg.barrier(i32, i32) local_unnamed_addr #1

attributes #0 = {{ convergent mustprogress nounwind "frame-pointer"="all" "min-legal-vector-width"="0" "no-builtins" "no-trapping-math"="true" "stack-protector-buffer-size"="8" }}
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
!17 = !{{!18, !19, !20, !21, !22}}
!18 = !{{i32 0, !"air.buffer", !"air.location_index", i32 0, i32 1, !"air.read", !"air.address_space", i32 1, !"air.arg_type_size", i32 4, !"air.arg_type_align_size", i32 4, !"air.arg_type_name", !"float", !"air.arg_name", !"in"}}
!19 = !{{i32 1, !"air.buffer", !"air.location_index", i32 1, i32 1, !"air.read_write", !"air.address_space", i32 1, !"air.arg_type_size", i32 4, !"air.arg_type_align_size", i32 4, !"air.arg_type_name", !"float", !"air.arg_name", !"out"}}
!20 = !{{i32 2, !"air.buffer", !"air.location_index", i32 0, i32 1, !"air.read_write", !"air.address_space", i32 3, !"air.arg_type_size", i32 4, !"air.arg_type_align_size", i32 4, !"air.arg_type_name", !"float", !"air.arg_name", !"scratch"}}
!21 = !{{i32 3, !"air.thread_position_in_threadgroup", !"air.arg_type_name", !"uint", !"air.arg_name", !"lid"}}
!22 = !{{i32 4, !"air.thread_position_in_grid", !"air.arg_type_name", !"uint", !"air.arg_name", !"gid"}}
"""


def module_text(name: str) -> str:
    return _MODULE.format(name=name, body=_PROLOGUE.replace("@TILE", _TILE) + KERNELS[name])


def library() -> tm.Library:
    """Every kernel of KERNELS in one library."""
    sources = []
    for name in KERNELS:
        module = llvm.parse_assembly(module_text(name), context=llvm.create_context())
        module.verify()
        sources.append(tm.FunctionSource(name, module.as_bitcode()))
    return tm.load(tm.pack(sources))

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
from _air_modules import _FOOTER, _HEADER

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

_ARGUMENT_NODES = """!18 = !{i32 0, !"air.buffer", !"air.location_index", i32 0, i32 1, !"air.read", !"air.address_space", i32 1, !"air.arg_type_size", i32 4, !"air.arg_type_align_size", i32 4, !"air.arg_type_name", !"float", !"air.arg_name", !"in"}
!19 = !{i32 1, !"air.buffer", !"air.location_index", i32 1, i32 1, !"air.read_write", !"air.address_space", i32 1, !"air.arg_type_size", i32 4, !"air.arg_type_align_size", i32 4, !"air.arg_type_name", !"float", !"air.arg_name", !"out"}
!20 = !{i32 2, !"air.buffer", !"air.location_index", i32 0, i32 1, !"air.read_write", !"air.address_space", i32 3, !"air.arg_type_size", i32 4, !"air.arg_type_align_size", i32 4, !"air.arg_type_name", !"float", !"air.arg_name", !"scratch"}
!21 = !{i32 3, !"air.thread_position_in_threadgroup", !"air.arg_type_name", !"uint", !"air.arg_name", !"lid"}
!22 = !{i32 4, !"air.thread_position_in_grid", !"air.arg_type_name", !"uint", !"air.arg_name", !"gid"}"""

# The module around a body: tests/_air_modules.py's header and metadata (Apple's module
# flags), this kernel's signature, threadgroup variable and argument nodes.
_MODULE = _HEADER + """@_ZZ9initcheckE4tile = internal unnamed_addr addrspace(3) global [64 x float] undef, align 4

define weak_odr void @{name}(ptr addrspace(1) noundef "air-buffer-no-alias" %in, ptr addrspace(1) noundef "air-buffer-no-alias" %out, ptr addrspace(3) noundef "air-buffer-no-alias" %scratch, i32 noundef %lid, i32 noundef %gid) local_unnamed_addr #0 {{
entry:
{body}}}

declare void @air.wg.barrier(i32, i32) local_unnamed_addr #1
attributes #2 = {{ convergent nounwind willreturn }}
""" + _FOOTER

def module_text(name: str) -> str:
    return _MODULE.format(name=name, body=_PROLOGUE.replace("@TILE", _TILE) + KERNELS[name],
                          intrinsic_attributes="convergent mustprogress nounwind willreturn",
                          argument_refs="!18, !19, !20, !21, !22", argument_nodes=_ARGUMENT_NODES)


def library() -> tm.Library:
    """Every kernel of KERNELS in one library."""
    sources = []
    for name in KERNELS:
        module = llvm.parse_assembly(module_text(name), context=llvm.create_context())
        module.verify()
        sources.append(tm.FunctionSource(name, module.as_bitcode()))
    return tm.load(tm.pack(sources))

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
from torch_metallib.reflection.kernel_module import buffer_node, builtin_node, kernel_module

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

_ARGUMENT_NODES = [
    buffer_node(0, "in", "float", 4, slot=0, access="air.read"),
    buffer_node(1, "out", "float", 4, slot=1, access="air.read_write"),
    buffer_node(2, "scratch", "float", 4, slot=0, access="air.read_write", space=3),
    builtin_node(3, "air.thread_position_in_threadgroup", "lid"),
    builtin_node(4, "air.thread_position_in_grid", "gid"),
]

# This kernel's threadgroup variable and signature around a body.
_DEFINITIONS = """@_ZZ9initcheckE4tile = internal unnamed_addr addrspace(3) global [64 x float] undef, align 4

define weak_odr void @{name}(ptr addrspace(1) noundef "air-buffer-no-alias" %in, ptr addrspace(1) noundef "air-buffer-no-alias" %out, ptr addrspace(3) noundef "air-buffer-no-alias" %scratch, i32 noundef %lid, i32 noundef %gid) local_unnamed_addr #0 {{
entry:
{body}}}

declare void @air.wg.barrier(i32, i32) local_unnamed_addr #1
"""
# Attribute groups #1 (the barrier's declaration) and #2 (its calls).
_BARRIER_ATTRIBUTES = ["convergent mustprogress nounwind willreturn", "convergent nounwind willreturn"]


def module_text(name: str) -> str:
    definitions = _DEFINITIONS.format(name=name, body=_PROLOGUE.replace("@TILE", _TILE) + KERNELS[name])
    return kernel_module(name, definitions, _ARGUMENT_NODES, True, _BARRIER_ATTRIBUTES)


def library() -> tm.Library:
    """Every kernel of KERNELS in one library."""
    sources = []
    for name in KERNELS:
        module = llvm.parse_assembly(module_text(name), context=llvm.create_context())
        module.verify()
        sources.append(tm.FunctionSource(name, module.as_bitcode()))
    return tm.load(tm.pack(sources))

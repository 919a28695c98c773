# Mojo GPU kernels that tests/test_mojo_kernels.py runs through torch_metallib.
# tools/build_mojo_kernels.py compiles them to AIR (one module per kernel) into
# tests/fixtures/mojo/; the tests read those modules, so Mojo is not needed to run them.
# Kernels index with whole threadgroups (Mojo launches grid_dim x block_dim threads):
# callers pass a grid that is a multiple of the threadgroup size.

from max.gpu import barrier, block_idx, global_idx, lane_id, thread_idx
from max.gpu.memory import AddressSpace
from max.gpu.host import DeviceContext
from max.gpu.primitives import warp
from std.memory import stack_allocation
from std.atomic import Atomic
from std.math import exp, log

comptime BLOCK = 64
comptime TILE = 16


# c[i] = a[i] + b[i] for i < n.
def vector_add(a: UnsafePointer[Float32, MutAnyOrigin], b: UnsafePointer[Float32, MutAnyOrigin],
               c: UnsafePointer[Float32, MutAnyOrigin], n: Int):
    var i = Int(global_idx.x)
    if i < n:
        c[i] = a[i] + b[i]


# result[group] = sum of x[group * BLOCK ..][:BLOCK] (zero past n): a tree in threadgroup memory.
def block_sum(x: UnsafePointer[Float32, MutAnyOrigin], result: UnsafePointer[Float32, MutAnyOrigin], n: Int):
    var shared = stack_allocation[BLOCK, Float32, address_space=AddressSpace.SHARED]()
    var t = Int(thread_idx.x)
    var i = Int(global_idx.x)
    shared[t] = x[i] if i < n else 0.0
    barrier()
    var stride = BLOCK // 2
    while stride > 0:
        if t < stride:
            shared[t] += shared[t + stride]
        barrier()
        stride //= 2
    if t == 0:
        result[Int(block_idx.x)] = shared[0]


# total[0] += sum of x[:n]: each SIMD-group sums its lanes, its first lane adds atomically.
def simd_sum_atomic(x: UnsafePointer[Float32, MutAnyOrigin], total: UnsafePointer[Float32, MutAnyOrigin], n: Int):
    var i = Int(global_idx.x)
    var v = x[i] if i < n else Float32(0)
    var s = warp.sum(v)
    if lane_id() == 0:
        _ = Atomic.fetch_add(total, s)


# y[i] = log(1 + exp(x[i])) in float16 (computed in float32).
def softplus_f16(x: UnsafePointer[Float16, MutAnyOrigin], y: UnsafePointer[Float16, MutAnyOrigin], n: Int):
    var i = Int(global_idx.x)
    if i < n:
        var v = x[i].cast[DType.float32]()
        y[i] = log(1.0 + exp(v)).cast[DType.float16]()


# out = x transposed (x: rows x cols, row-major), through a TILE x TILE tile in threadgroup memory.
def transpose_tiled(x: UnsafePointer[Float32, MutAnyOrigin], result: UnsafePointer[Float32, MutAnyOrigin],
                    rows: Int, cols: Int):
    var tile = stack_allocation[TILE * (TILE + 1), Float32, address_space=AddressSpace.SHARED]()
    var tx = Int(thread_idx.x)
    var ty = Int(thread_idx.y)
    var c = Int(block_idx.x) * TILE + tx
    var r = Int(block_idx.y) * TILE + ty
    if r < rows and c < cols:
        tile[ty * (TILE + 1) + tx] = x[r * cols + c]
    barrier()
    var oc = Int(block_idx.y) * TILE + tx
    var orow = Int(block_idx.x) * TILE + ty
    if orow < cols and oc < rows:
        result[orow * rows + oc] = tile[tx * (TILE + 1) + ty]


def main() raises:
    var ctx = DeviceContext()
    _ = ctx.compile_function[vector_add]()
    _ = ctx.compile_function[block_sum]()
    _ = ctx.compile_function[simd_sum_atomic]()
    _ = ctx.compile_function[softplus_f16]()
    _ = ctx.compile_function[transpose_tiled]()

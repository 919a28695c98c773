"""Reflection on Apple-built mlx.metallib: every kernel, cross-checked, and hand-checked
expectations for kernels whose Metal source is public (ml-explore/mlx, mlx/backend/metal/
kernels/: binary.h, softmax.h, arange.h, steel/gemm/kernels/steel_gemm_fused.h, params.h)."""

import concurrent.futures
import random

import pytest

import torch_metallib as tm
from _parallel import cores
from _reflection_checks import check_kernels, decoder_problems, unused_flag_problems
from torch_metallib import Argument, StructField

GEMM = "steel_gemm_fused_nn_float32_float32_bm64_bn64_bk16_wm2_wn2"


def _sample(lib, count: int, seed: int) -> list:
    return random.Random(seed).sample(lib.function_names, count)


@pytest.mark.slow
def test_every_mlx_kernel_reflects_consistently(mlx_path, mlx_lib):
    """All 17,248 kernels reflect with zero errors, and every argument agrees with its IR
    parameter type, its function-constant guard and the container's CNST tag."""
    names = list(mlx_lib.function_names)
    workers = cores()  # ~18 s on one core, ~9 s on two
    chunks = [names[i::workers] for i in range(workers)]
    with concurrent.futures.ProcessPoolExecutor(len(chunks)) as pool:
        results = list(pool.map(check_kernels, [mlx_path] * len(chunks), chunks))
    assert sum(r["count"] for r in results) == 17_248
    failures = {name: error for r in results for name, error in r["failures"].items()}
    assert failures == {}, f"{len(failures)} kernels failed, e.g. {list(failures.items())[:3]}"
    problems = [p for r in results for p in r["problems"]]
    assert problems == [], f"{len(problems)} problems, e.g. {problems[:5]}"


def test_fast_decoder_matches_the_general_one(mlx_lib):
    """Apple's standard node layouts take the fast path; it must agree with the general
    decoder node for node (and actually be taken, or the check would be empty)."""
    problems, hits = [], 0
    for name in _sample(mlx_lib, 1500, seed=1) + [GEMM, "s_copybool_complex64"]:
        found, fast = decoder_problems(name, mlx_lib[name].bitcode)
        problems += found
        hits += fast
    assert problems == []
    assert hits > 10_000


def test_unused_flags_match_the_function_bodies(mlx_lib):
    problems = []
    for name in _sample(mlx_lib, 500, seed=2) + ["vv_Addfloat32", GEMM]:
        function = mlx_lib[name]
        problems += unused_flag_problems(name, function.bitcode, function.arguments)
    assert problems == []


# --- hand-checked kernels ------------------------------------------------------------

def _buffer(name, position, access, type_name, size, space="device", buffer_size=None, **more):
    return Argument(name=name, position=position, kind="buffer", binding=position, binding_count=1,
                    address_space=space, access=access, type_name=type_name, type_size=size,
                    type_align=more.pop("align", size), buffer_size=buffer_size,
                    ir_type="ptr addrspace(1)" if space == "device" else "ptr addrspace(2)", **more)


def _builtin(name, position, builtin, type_name="uint", unused=False):
    components = {"uint": 1, "uint2": 2, "uint3": 3}[type_name]
    ir_type = "i32" if components == 1 else f"<{components} x i32>"
    return Argument(name=name, position=position, kind="builtin", type_name=type_name,
                    unused=unused, builtin=builtin, components=components, component_bits=32,
                    ir_type=ir_type)


def test_vv_add_float32(mlx_lib):
    # binary.h: binary_vv(device const T* a, device const T* b, device U* c,
    #                     constant uint& size, uint index [[thread_position_in_grid]])
    # with c[index] = Op()(a[index], b[index]): `size` is never read.
    k = mlx_lib.vv_Addfloat32
    assert k.arguments == (
        _buffer("a", 0, "read", "float", 4),
        _buffer("b", 1, "read", "float", 4),
        _buffer("c", 2, "read_write", "float", 4),
        _buffer("size", 3, "read", "uint", 4, space="constant", buffer_size=4, unused=True),
        _builtin("index", 4, "thread_position_in_grid"),
    )
    assert k.signature == (
        "kernel void vv_Addfloat32(device const float* a [[buffer(0)]], "
        "device const float* b [[buffer(1)]], device float* c [[buffer(2)]], "
        "constant uint& size [[buffer(3)]], uint index [[thread_position_in_grid]])")
    assert [a.name for a in k.buffers] == ["a", "b", "c", "size"]
    assert [a.name for a in k.builtins] == ["index"]
    assert k.function_constants == ()
    assert (k.max_total_threads_per_threadgroup, k.threadgroup_memory_static) == (None, 0)
    assert (k.intrinsics, k.uses_barriers, k.uses_simdgroup_ops) == ((), False, False)


def test_block_softmax_float32(mlx_lib):
    # softmax.h: softmax_single_row<float>(const device T* in, device T* out,
    #   constant int& axis_size, uint gid [[threadgroup_position_in_grid]],
    #   uint _lid [[thread_position_in_threadgroup]], uint simd_lane_id [[thread_index_in_simdgroup]],
    #   uint simd_group_id [[simdgroup_index_in_threadgroup]]);
    # body: threadgroup AccT local_max[32], local_normalizer[32]; simd_max, simd_sum,
    # fast::exp and threadgroup_barrier.
    k = mlx_lib.block_softmax_float32
    assert k.signature == (
        "kernel void block_softmax_float32(device const float* in [[buffer(0)]], "
        "device float* out [[buffer(1)]], constant int& axis_size [[buffer(2)]], "
        "uint gid [[threadgroup_position_in_grid]], uint _lid [[thread_position_in_threadgroup]], "
        "uint simd_lane_id [[thread_index_in_simdgroup]], "
        "uint simd_group_id [[simdgroup_index_in_threadgroup]])")
    assert k.builtins == (
        _builtin("gid", 3, "threadgroup_position_in_grid"),
        _builtin("_lid", 4, "thread_position_in_threadgroup"),
        _builtin("simd_lane_id", 5, "thread_index_in_simdgroup"),
        _builtin("simd_group_id", 6, "simdgroup_index_in_threadgroup"),
    )
    assert sorted(v.name.rsplit("E", 1)[-1] for v in k.threadgroup_variables) == \
        ["16local_normalizer", "9local_max"]  # mangled names end in <length><name>
    assert [(v.size, v.align) for v in k.threadgroup_variables] == [(32 * 4, 4)] * 2
    assert k.threadgroup_memory_static == 2 * 32 * 4
    assert k.intrinsics == ("air.fast_exp.f32", "air.simd_max.f32", "air.simd_sum.f32", "air.wg.barrier")
    assert k.uses_barriers and k.uses_simdgroup_ops
    assert k.max_total_threads_per_threadgroup is None


def test_arange_float32(mlx_lib):
    # arange.h: arange<float>(constant const T& start, constant const T& step,
    #                         device T* out, uint index [[thread_position_in_grid]])
    k = mlx_lib.arangefloat32
    assert k.arguments == (
        _buffer("start", 0, "read", "float", 4, space="constant", buffer_size=4),
        _buffer("step", 1, "read", "float", 4, space="constant", buffer_size=4),
        _buffer("out", 2, "read_write", "float", 4),
        _builtin("index", 3, "thread_position_in_grid"),
    )
    assert k.intrinsics == ("air.convert.f.f32.u.i32",)  # float(index)
    assert not (k.uses_barriers or k.uses_simdgroup_ops)


def _c_layout(members):
    """Offsets of (type, name) members under C rules (int 4 bytes, long 8, float 4)."""
    sizes = {"int": 4, "long": 8, "float": 4}
    offset, fields = 0, []
    for type_name, name in members:
        size = sizes[type_name]
        offset = -(-offset // size) * size
        fields.append(StructField(offset, size, 0, type_name, name))
        offset += size
    return tuple(fields), -(-offset // 8) * 8


def test_steel_gemm_fused(mlx_lib):
    # steel_gemm_fused.h, gemm<float, 64, 64, 16, 2, 2, nn>:
    #   [[kernel, max_total_threads_per_threadgroup(WM * WN * 32)]] void gemm(
    #     const device T* A [[buffer(0)]], const device T* B [[buffer(1)]],
    #     const device T* C [[buffer(2), function_constant(use_out_source)]],
    #     device T* D [[buffer(3)]], const constant GEMMParams* params [[buffer(4)]],
    #     const constant GEMMAddMMParams* addmm_params [[buffer(5), function_constant(use_out_source)]],
    #     const constant int* batch_shape [[buffer(6), function_constant(has_batch)]],
    #     const constant int64_t* batch_strides [[buffer(7), function_constant(has_batch)]],
    #     uint simd_lane_id [[thread_index_in_simdgroup]],
    #     uint simd_group_id [[simdgroup_index_in_threadgroup]],
    #     uint3 tid [[threadgroup_position_in_grid]], uint3 lid [[thread_position_in_threadgroup]])
    k = mlx_lib[GEMM]
    assert k.signature == (
        f"kernel void {GEMM}(device const float* A [[buffer(0)]], device const float* B [[buffer(1)]], "
        "device const float* C [[buffer(2), function_constant(use_out_source)]], "
        "device float* D [[buffer(3)]], constant mlx::steel::GEMMParams* params [[buffer(4)]], "
        "constant mlx::steel::GEMMAddMMParams* addmm_params [[buffer(5), function_constant(use_out_source)]], "
        "constant int* batch_shape [[buffer(6), function_constant(has_batch)]], "
        "constant long* batch_strides [[buffer(7), function_constant(has_batch)]], "
        "uint simd_lane_id [[thread_index_in_simdgroup]], "
        "uint simd_group_id [[simdgroup_index_in_threadgroup]], "
        "uint3 tid [[threadgroup_position_in_grid]], uint3 lid [[thread_position_in_threadgroup]])")
    assert k.max_total_threads_per_threadgroup == 2 * 2 * 32
    # steel_gemm_fused.metal: has_batch(10), use_out_source(100), do_axpby(110), align_M/N/K(200-202)
    assert k.function_constants == tuple(
        tm.FunctionConstant(name, "bool", index, True) for name, index in
        [("has_batch", 10), ("use_out_source", 100), ("do_axpby", 110),
         ("align_M", 200), ("align_N", 201), ("align_K", 202)])
    # params.h GEMMParams / GEMMAddMMParams, laid out by C rules.
    gemm_fields, gemm_size = _c_layout(
        [("int", n) for n in ("M", "N", "K", "lda", "ldb", "ldd", "tiles_n", "tiles_m")]
        + [("long", n) for n in ("batch_stride_a", "batch_stride_b", "batch_stride_d")]
        + [("int", n) for n in ("swizzle_log", "gemm_k_iterations_aligned", "batch_ndim")])
    addmm_fields, addmm_size = _c_layout(
        [("int", "ldc"), ("int", "fdc"), ("long", "batch_stride_c"), ("float", "alpha"), ("float", "beta")])
    params, addmm = k.arguments[4], k.arguments[5]
    assert (params.struct_fields, params.type_size, params.type_align) == (gemm_fields, gemm_size, 8)
    assert (addmm.struct_fields, addmm.type_size) == (addmm_fields, addmm_size)
    assert k.arguments[11].unused  # lid is declared but never read
    # Threadgroup tiles (mma.h): As is BM x (BK + 16/sizeof(T)), Bs is BK x (BN + 16/sizeof(T)).
    assert sorted(v.size for v in k.threadgroup_variables) == [16 * (64 + 4) * 4, 64 * (16 + 4) * 4]
    assert k.threadgroup_memory_static == (16 * 68 + 64 * 20) * 4
    assert k.uses_barriers and k.uses_simdgroup_ops
    assert any(i.startswith("air.simdgroup_matrix_8x8_multiply_accumulate") for i in k.intrinsics)


def test_nested_struct_members(mlx_lib):
    """mlx_atomic<float> { metal::_atomic<float> val; } nests a struct member."""
    name = next(n for n in mlx_lib.function_names if n.startswith("seq_gated_delta_vjp_float"))
    dq = next(a for a in mlx_lib[name].arguments if a.name == "dq")
    assert dq.type_name == "mlx_atomic" and dq.type_size == 4
    (val,) = dq.struct_fields
    assert (val.name, val.type_name, val.offset, val.size) == ("val", "metal::_atomic", 0, 4)
    assert val.fields == (StructField(0, 4, 0, "float", "__s"),)


def test_reflection_is_cached_per_function(mlx_lib):
    k = mlx_lib.arangefloat32
    assert k.reflection is k.reflection
    assert mlx_lib["arangefloat32"] is k

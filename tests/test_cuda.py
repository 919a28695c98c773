"""The CUDA backend on an NVIDIA GPU: kernels on ``cuda`` tensors against the CPU
backend, ordering with torch's own ops on the current stream, launch limits, operators
under autograd and ``torch.compile``. Marked ``cuda``; skipped only where
``torch.cuda.is_available()`` is false (CI has no GPU: test_cuda_lowering.py checks the
PTX there). Run on a GPU machine with ``python -m pytest tests/test_cuda.py``.

The conformance, cooperative, reduction, scan, collective and matrix families run
unchanged with every call mirrored on ``cuda`` (tests/_device_mirror.py): the CPU results
are checked against torch as usual, and the GPU's must match them (exactly for integers,
within a few ulp for floats).
"""

import os
import subprocess
import sys

import pytest
import torch

import torch_metallib as tm
import _argument_buffers as argument_buffers
import _collectives as collectives
import _conformance as conformance
import _cooperative as cooperative
import _mlx_matmul as matmul
import _mlx_reductions as reductions
import _mlx_scans as scans
import _simdgroup_matrix as strided
from _device_mirror import mirrored_calls
from _ops_examples import check_sigmoid_on

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(),
                                                   reason="torch.cuda.is_available() is False: no CUDA device")]


@pytest.fixture
def on_cuda():
    with mirrored_calls("cuda") as names:
        yield names
    assert names, "no kernel call was mirrored on cuda"


# --- conformance families ------------------------------------------------------------------------

@pytest.mark.parametrize("case", conformance.params(conformance.UNARY_CASES))
def test_unary(mlx_lib, case, on_cuda):
    conformance.check_unary(mlx_lib, case)


@pytest.mark.parametrize("case", conformance.params(conformance.BINARY_CASES))
def test_binary(mlx_lib, case, on_cuda):
    conformance.check_binary_contiguous(mlx_lib, case)


@pytest.mark.parametrize("case", conformance.params(conformance.STRIDED_BINARY_CASES))
def test_binary_strided(mlx_lib, case, on_cuda):
    conformance.check_binary_strided(mlx_lib, case)


@pytest.mark.parametrize("case", conformance.params(conformance.COPY_CASES))
def test_copy(mlx_lib, case, on_cuda):
    conformance.check_copy_contiguous(mlx_lib, case)


@pytest.mark.parametrize("case", conformance.params(conformance.STRIDED_COPY_CASES))
def test_copy_strided(mlx_lib, case, on_cuda):
    conformance.check_copy_strided(mlx_lib, case)


@pytest.mark.parametrize("case", conformance.params(conformance.SELECT_CASES))
def test_select(mlx_lib, case, on_cuda):
    conformance.check_select(mlx_lib, case)


@pytest.mark.parametrize("case", conformance.params(conformance.ARANGE_CASES))
def test_arange(mlx_lib, case, on_cuda):
    conformance.check_arange(mlx_lib, case)


def test_fixture_kernels(fixtures_lib, on_cuda):
    conformance.check_fixture_vector_add_float(fixtures_lib)
    conformance.check_fixture_scale_shift_float(fixtures_lib, False)  # scalar tensors: the test below
    conformance.check_fixture_struct_arg_axpy(fixtures_lib)


def test_cpu_scalar_tensors_beside_cuda_tensors_are_values(fixtures_lib):
    """As torch takes CPU scalars in CUDA ops: a 0-d CPU tensor for a constant float& is
    read as its value (float64 converted); a 0-d CUDA tensor of another dtype is refused."""
    x = torch.randn(1000, device="cuda")
    out = torch.empty_like(x)
    for scale in (torch.tensor(0.75), torch.tensor(0.75, dtype=torch.float64)):
        out.fill_(0)
        fixtures_lib.scale_shift_float(x, out, scale, torch.tensor(-1.25), threads=1000)
        torch.testing.assert_close(out, x * 0.75 - 1.25, rtol=1e-6, atol=1e-6)  # the kernel rounds once (fma)
    with pytest.raises(tm.KernelArgumentError, match="expected a tensor of torch.float32, got torch.float64"):
        fixtures_lib.scale_shift_float(x, out, torch.tensor(0.75, dtype=torch.float64, device="cuda"), 1.0,
                                       threads=1000)


@pytest.mark.parametrize("use_bias, alpha", [(True, 1.5), (False, -2.25)])
def test_function_constants(fixtures_lib, use_bias, alpha, on_cuda):
    conformance.check_fixture_function_constant_scale(fixtures_lib, use_bias, alpha)


# --- cooperative kernels: threadgroup memory, barriers, SIMD-group functions ----------------------

@pytest.mark.parametrize("group", [32, 64, 128, 256])
def test_threadgroup_memory(fixtures, group, on_cuda):
    cooperative.check_threadgroup_sum_with_threadgroup_memory(fixtures, group)


@pytest.mark.parametrize("dtype", cooperative.DTYPES)
@pytest.mark.parametrize("variant", ["block", "looped"])
def test_softmax(mlx_lib, variant, dtype, on_cuda):
    cooperative.check_softmax(mlx_lib, variant, dtype)


@pytest.mark.parametrize("dtype", cooperative.DTYPES)
@pytest.mark.parametrize("variant", ["block", "looped"])
def test_logsumexp(mlx_lib, variant, dtype, on_cuda):
    cooperative.check_logsumexp(mlx_lib, variant, dtype)


@pytest.mark.parametrize("dtype", cooperative.DTYPES)
@pytest.mark.parametrize("looped", [False, True])
def test_rms_norm(mlx_lib, looped, dtype, on_cuda):
    cooperative.check_rms_norm(mlx_lib, looped, dtype)


@pytest.mark.parametrize("looped", [False, True])
def test_layer_norm(mlx_lib, looped, on_cuda):
    cooperative.check_layer_norm(mlx_lib, looped)


# PyTorch's layer_norm_looped and radix_scan on the device named by argv[1], in a process of their own.
_LAYER_NORM_LOOPED = """
import sys
import _cooperative as cooperative
kernel = cooperative.layer_norm_looped_kernel()
for rows, size, group in [(3, 1000, 256), (2, 37, 64), (4, 4096, 1024), (1, 5, 32), (64, 8192, 1024)]:
    cooperative.check_layer_norm_looped(kernel, rows, size, group, device=sys.argv[1])
cooperative.check_layer_norm_looped(kernel, 2, 300, 128, affine=False, device=sys.argv[1])
print("finished")
"""
_RADIX_SCAN = """
import sys
import _cooperative as cooperative
kernel = cooperative.radix_scan_kernel()
for n_entries in cooperative.RADIX_SCAN_SIZES:
    cooperative.check_radix_scan(kernel, 3, n_entries, device=sys.argv[1])
print("finished")
"""


def run_in_child(script: str, what: str, device: str, timeout: float = 240) -> None:
    """A kernel's check (`script`, given `device` as argv[1]) in a child process: a kernel
    that never finishes fails the test when `timeout` has passed, rather than hanging pytest."""
    tests = os.path.dirname(os.path.abspath(__file__))
    path = [tests, os.path.dirname(os.path.dirname(tm.__file__)), os.environ.get("PYTHONPATH", "")]
    try:
        result = subprocess.run([sys.executable, "-c", script, device], cwd=tests, capture_output=True,
                                text=True, timeout=timeout, env={**os.environ, "PYTHONPATH": os.pathsep.join(path)})
    except subprocess.TimeoutExpired:
        pytest.fail(f"{what} did not finish on {device} within {timeout} s (threads of a warp waiting at "
                    f"different barriers?)")
    assert result.returncode == 0 and "finished" in result.stdout, result.stderr[-4000:]


def run_layer_norm_looped(device: str, timeout: float = 240) -> None:
    run_in_child(_LAYER_NORM_LOOPED, "layer_norm_looped", device, timeout)


def test_layer_norm_looped_finishes_and_matches_torch():
    """PyTorch's layer_norm_looped tests the same lane on both sides of a barrier, which LLVM
    threaded through the barrier while barriers were not convergent: a warp's lanes then
    waited at two ``bar.sync`` and the kernel never finished (test_cuda_lowering.py checks
    the PTX without a GPU)."""
    run_layer_norm_looped("cuda")

def _mlx_row_group(axis: int, n_reads: int) -> int:
    """The threadgroup MLX's host code gives a one-row kernel: whole SIMD-groups, just enough
    threads for the row at `n_reads` elements each."""
    return -(-axis // (n_reads * 32)) * 32


def test_radix_scan_prefix_sum_after_a_divergent_loop():
    """PyTorch's radix_scan runs simd_prefix_exclusive_sum right after a loop whose trip
    count differs per lane. A warp need not have reconverged there, and with the lanes from
    activemask() the prefix sums missed lanes; the lowering gives such a top-level call the
    lanes still running (converged_masks.py)."""
    run_in_child(_RADIX_SCAN, "radix_scan", "cuda")


@pytest.mark.parametrize("size, x_offset, out_offset", [(1024, 0, 0), (1027, 0, 0), (1024, 1, 1), (1024, 0, 2),
                                                        (4094, 3, 3), (4096, 2, 0)])
def test_runs_of_accesses_at_every_alignment(mlx_lib, size, x_offset, out_offset):
    """The lowering reads and writes MLX's runs of 4 or 8 floats per thread as 16-byte
    accesses where they are aligned at run time, element by element elsewhere
    (backends/cuda/vector_accesses.py): rows whose length is no multiple of 4, tensors that
    start off a 16-byte boundary, an input and an output aligned differently. Each matches
    torch."""
    rows = 6
    generator = torch.Generator().manual_seed(size + x_offset)

    def at(offset: int, values: torch.Tensor) -> torch.Tensor:
        found = torch.empty(rows * size + offset, device="cuda")[offset:].view(rows, size)
        return found.copy_(values)
    x = at(x_offset, torch.randn(rows, size, generator=generator) * 3)
    out = at(out_offset, torch.zeros(rows, size))
    assert x.data_ptr() % 16 == 4 * x_offset and out.data_ptr() % 16 == 4 * out_offset
    w, b = torch.randn(size, device="cuda"), torch.randn(size, device="cuda")
    group = _mlx_row_group(size, 4)
    mlx_lib.block_softmax_float32(x, out, size, threads=rows * group, group_size=group)
    torch.testing.assert_close(out, torch.softmax(x, -1))
    out.zero_()
    # The pipeline's maximum, as MLX's host code: the looped kernel reduces all 32 entries of
    # its threadgroup arrays, which fewer SIMD-groups leave partly unwritten.
    mlx_lib.looped_softmax_float32(x, out, size, threads=rows * 1024, group_size=1024)
    torch.testing.assert_close(out, torch.softmax(x, -1))
    mlx_lib.rmsfloat32(x, w, out, 1e-5, size, 1, threads=rows * group, group_size=group)
    torch.testing.assert_close(out, torch.nn.functional.rms_norm(x, (size,), w, 1e-5))
    group = _mlx_row_group(size, 8)
    mlx_lib.layer_normfloat32(x, w, b, out, 1e-5, size, 1, 1, threads=rows * group, group_size=group)
    torch.testing.assert_close(out, torch.nn.functional.layer_norm(x, (size,), w, b, 1e-5))
    n = rows * size
    mlx_lib.vn_Expfloat32float32(x.view(-1), out.view(-1), n, threads=-(-n // 2), group_size=256)
    torch.testing.assert_close(out, torch.exp(x))


@pytest.mark.parametrize("size", [1, 3, 4, 5, 1027, (1 << 20) + 3])
@pytest.mark.parametrize("offset", [0, 1, 2])
def test_coarsened_elementwise_at_every_edge_and_alignment(mlx_lib, size, offset):
    """Straight-line grid-only kernels run 4 grid positions per CUDA thread, 16-byte accesses
    where aligned (backends/cuda/coarsening.py): the grid's last partial run, tensors that
    start off a 16-byte boundary (the versioned runs' scalar copy), an output that is an
    input (in place), half precision. Each matches torch; nothing past the grid is written."""
    generator = torch.Generator().manual_seed(size * 3 + offset)

    def at(start: int, values: torch.Tensor):
        """(`values` in a cuda tensor `start` elements into its storage, the 4 sentinels after it)."""
        storage = torch.full((start + size + 4,), 7.0, dtype=values.dtype, device="cuda")
        return storage[start:start + size].copy_(values), storage[start + size:]

    for dtype, add in ((torch.float32, mlx_lib.vv_Addfloat32), (torch.float16, mlx_lib.vv_Addfloat16)):
        a, after_a = at(offset, torch.randn(size, generator=generator).to(dtype))
        b, _ = at(0, torch.randn(size, generator=generator).to(dtype))
        out, after = at((offset + 1) % 4, torch.zeros(size, dtype=dtype))
        add(a, b, out, size, threads=size, group_size=1024)
        assert torch.equal(out, a + b) and bool((after == 7).all())
        expected = a + b
        add(a, b, a, size, threads=size, group_size=1024)
        assert torch.equal(a, expected) and bool((after_a == 7).all())
    x, _ = at(offset, torch.randn(size, generator=generator) * 4)
    out, after = at(0, torch.zeros(size))
    mlx_lib.v_Expfloat32float32(x, out, size, threads=size, group_size=1024)
    torch.testing.assert_close(out, torch.exp(x))  # libdevice's expf: within Metal's bounds
    assert bool((after == 7).all())


@pytest.mark.parametrize("case", reductions.ALL_CASES, ids=reductions._ids(reductions.ALL_CASES))
def test_reductions(mlx_lib, case, on_cuda):
    run = {"all_reduce": reductions.check_all_reduce, "init_reduce": reductions.check_init_reduce,
           "arg_reduce": reductions.check_arg_reduce}.get(case.family)
    if run is None:
        run = reductions.check_row_reduce if case in reductions.ROW_CASES else reductions.check_col_reduce
    run(mlx_lib, case)


@pytest.mark.parametrize("case", scans.FULL_CASES + scans.OTHER_CASES, ids=scans._case_id)
def test_scan(mlx_lib, case, on_cuda):
    scans.check_scan_exact(mlx_lib, case)


@pytest.mark.parametrize("d", [1, 5, 31])
def test_shuffles(d, on_cuda):
    collectives.check_shuffle_up_down_xor_broadcast(d)


@pytest.mark.parametrize("transpose,dtype", [("nn", "float32"), ("nt", "float16"), ("tn", "bfloat16")])
def test_steel_gemm(mlx_lib, transpose, dtype, on_cuda):
    matmul.check_steel_gemm_unaligned(mlx_lib, (32, 32, 16, 2, 2), transpose, dtype)


@pytest.mark.parametrize("transpose,dtype,tile,shape", [
    ("nt", "float16", (64, 32, 32, 2, 2), (128, 128, 64)),   # aligned: the unguarded main loop
    ("nn", "bfloat16", (64, 32, 32, 2, 2), (100, 64, 96)),   # ragged M
    ("tn", "float16", (64, 64, 16, 2, 2), (75, 70, 37)),     # ragged everywhere, the benchmark's tile
])
def test_steel_gemm_half_paths(mlx_lib, transpose, dtype, tile, shape, on_cuda):
    """Half and bfloat GEMMs (float fragments loaded from half tiles) through their main
    loop and edge paths."""
    matmul._run_steel_gemm(mlx_lib, transpose, dtype, tile, shape, seed=sum(shape))


@pytest.mark.parametrize("tile", matmul.TILES, ids=lambda t: "bm{}_bn{}_bk{}_wm{}_wn{}".format(*t))
@pytest.mark.parametrize("transpose", matmul.TRANSPOSES)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_steel_gemm_every_variant(mlx_lib, dtype, transpose, tile, on_cuda):
    """Every tile, transpose and dtype, ragged in M, N and K: half and bfloat products on
    tensor cores (float sums), float ones exact."""
    matmul.check_steel_gemm_unaligned(mlx_lib, tile, transpose, dtype)


@pytest.mark.parametrize("transpose", matmul.TRANSPOSES)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("shape", matmul.ALIGNMENT_CASES, ids=lambda s: "x".join(map(str, s)))
def test_steel_gemm_aligned_and_ragged(mlx_lib, shape, transpose, dtype, on_cuda):
    matmul.check_steel_gemm_alignment_paths(mlx_lib, shape, transpose, dtype)


@pytest.mark.parametrize("dtype,transpose,addmm", [
    ("float32", "nn", (0.5, -2.0, True, False)), ("float16", "nt", (1.5, 0.25, True, True)),
    ("bfloat16", "tn", (3.0, 5.0, False, False)), ("float16", "tt", (3.0, 5.0, False, True))])
def test_steel_gemm_addmm_and_batches(mlx_lib, dtype, transpose, addmm, on_cuda):
    matmul._run_steel_gemm(mlx_lib, transpose, dtype, (64, 32, 32, 2, 2), (70, 45, 66), batch=2, addmm=addmm, seed=7)
    matmul._run_steel_gemm(mlx_lib, transpose, dtype, (32, 32, 16, 2, 2), (36, 50, 29), nd_batch=(2, 3), seed=5)


def test_steel_gemm_half_tensor_cores_match_float_sums(mlx_lib):
    """On the GPU alone (no mirror): a 256^3 float16 GEMM whose products run on tensor
    cores agrees with torch's float sums of the same halves to within half rounding."""
    g = torch.Generator(device="cuda").manual_seed(0)
    n = 256
    a = torch.randn(n, n, device="cuda", generator=g).half()
    b = torch.randn(n, n, device="cuda", generator=g).half()
    d = torch.empty(n, n, device="cuda", dtype=torch.half)
    params = matmul._pack_struct(mlx_lib[matmul._steel_name("nn", "float16", (64, 64, 16, 2, 2))], "params",
                                 M=n, N=n, K=n, lda=n, ldb=n, ldd=n, tiles_n=n // 64, tiles_m=n // 64,
                                 batch_stride_a=n * n, batch_stride_b=n * n, batch_stride_d=n * n, swizzle_log=0,
                                 gemm_k_iterations_aligned=n // 16, batch_ndim=1)
    fn = mlx_lib[matmul._steel_name("nn", "float16", (64, 64, 16, 2, 2))]
    fn(A=a, B=b, D=d, params=params, threads=(n // 64 * 32, n // 64 * 2, 2), group_size=(32, 2, 2),
       constants=matmul._constants_needed(fn, dict(has_batch=False, use_out_source=False, do_axpby=False,
                                                   align_M=True, align_N=True, align_K=True)))
    want = (a.float() @ b.float()).half()
    torch.testing.assert_close(d, want, rtol=2e-3, atol=2e-3)


def test_steel_gemm_half_exact_fallback_is_the_cpus(mlx_path, monkeypatch):
    """On the GPU alone: with the lanes not relabelled (forced here; launches of partial
    warps take this path) the tensor-core GEMM's products take the exact path, fragments
    read again from threadgroup memory and products done through memory, and agree bit for
    bit with the CPU backend's."""
    from torch_metallib.backends.cuda import lowering
    from torch_metallib.backends.cuda.lane_relabeling import relabeled_definition
    monkeypatch.setenv("TORCH_METALLIB_CACHE", "0")  # neither read nor keep this lowering
    monkeypatch.setattr(lowering, "relabeled_definition", lambda enabled: relabeled_definition(False))
    lib = tm.load(mlx_path)  # fresh functions: nothing prepared yet
    m, n, k = 128, 64, 48
    tile = (64, 64, 16, 2, 2)
    fn = lib[matmul._steel_name("nn", "float16", tile)]
    params = matmul._pack_struct(fn, "params", M=m, N=n, K=k, lda=k, ldb=n, ldd=n, tiles_n=n // 64, tiles_m=m // 64,
                                 batch_stride_a=m * k, batch_stride_b=k * n, batch_stride_d=m * n, swizzle_log=0,
                                 gemm_k_iterations_aligned=k // 16, batch_ndim=1)
    constants = matmul._constants_needed(fn, dict(has_batch=False, use_out_source=False, do_axpby=False,
                                                  align_M=True, align_N=True, align_K=True))
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(m, k, generator=g).half(), torch.randn(k, n, generator=g).half()
    results = []
    for device in ("cpu", "cuda"):
        d = torch.empty(m, n, device=device, dtype=torch.half)
        fn(A=a.to(device), B=b.to(device), D=d, params=params, threads=(n // 64 * 32, m // 64 * 2, 2),
           group_size=(32, 2, 2), constants=constants)
        results.append(d.cpu())
    assert torch.equal(results[0], results[1])
    torch.testing.assert_close(results[1], (a.float() @ b.float()).half(), rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("tile", [(32, 32, 16, 2, 2), (64, 64, 16, 2, 2)], ids=lambda t: "bm{}".format(t[0]))
@pytest.mark.parametrize("shape", [(128, 192, 96), (70, 90, 50)], ids=lambda s: "x".join(map(str, s)))
def test_steel_gemm_float_is_the_cpus(mlx_lib, tile, shape):
    """On the GPU alone (each device run here, not mirrored): float32 steel GEMM, each lane
    reading its products' rows of A and columns of B from the tiles (aligned shapes) or
    taking the exact products (ragged edges), bit for bit the CPU backend's (no TF32, the
    same fused multiply-adds in the same order)."""
    m, n, k = shape
    bm, bn, bk, wm, wn = tile
    fn = mlx_lib[matmul._steel_name("nn", "float32", tile)]
    tiles_n, tiles_m = -(-n // bn), -(-m // bm)
    params = matmul._pack_struct(fn, "params", M=m, N=n, K=k, lda=k, ldb=n, ldd=n, tiles_n=tiles_n, tiles_m=tiles_m,
                                 batch_stride_a=m * k, batch_stride_b=k * n, batch_stride_d=m * n, swizzle_log=0,
                                 gemm_k_iterations_aligned=k // bk, batch_ndim=1)
    constants = matmul._constants_needed(fn, dict(has_batch=False, use_out_source=False, do_axpby=False,
                                                  align_M=m % bm == 0, align_N=n % bn == 0, align_K=k % bk == 0))
    g = torch.Generator().manual_seed(sum(shape))
    a, b = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)
    results = []
    for device in ("cpu", "cuda"):
        d = torch.empty(m, n, device=device)
        fn(A=a.to(device), B=b.to(device), D=d, params=params, threads=(tiles_n * 32, tiles_m * wn, wm),
           group_size=(32, wn, wm), constants=constants)
        results.append(d.cpu())
    assert torch.equal(results[0], results[1])


@pytest.mark.parametrize("operands, accumulator", strided.PRODUCT_TYPES)
@pytest.mark.parametrize("lanes", [32, 16])
def test_simdgroup_matrix_product_types(operands, accumulator, lanes, on_cuda):
    """Each operand type's product, in a whole warp and in half of one."""
    strided.check_product_of_each_type(operands, accumulator, lanes)


def test_argument_buffers(mlx002, on_cuda):
    argument_buffers.check_gather_rows_matches_torch(mlx002, "dict")
    argument_buffers.check_gather_with_two_index_arrays_matches_torch(mlx002)


# --- the stream, limits and operators --------------------------------------------------------------

def test_kernels_order_with_torch_ops_on_the_current_stream(mlx_lib):
    """torch op -> kernel -> torch op -> kernel on a side stream made current; only the
    final .cpu() waits."""
    n = 1 << 20
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        x = torch.randn(n, device="cuda")
        y = x * 2
        out = torch.empty_like(y)
        mlx_lib.vv_Addfloat32(y, y, out, n)
        z = out + 1
        mlx_lib.vv_Addfloat32(z, y, out, n)
    stream.synchronize()
    want = (x.cpu() * 2) * 2 + 1 + x.cpu() * 2
    torch.testing.assert_close(out.cpu(), want)


def test_group_size_past_the_kernel_limit_is_refused(mlx_lib):
    a = torch.zeros(8, device="cuda")
    with pytest.raises(tm.DispatchError, match="group_size"):
        mlx_lib.vv_Addfloat32(a, a, a, 8, threads=4096, group_size=2048)


def test_operator_eager_autograd_and_compile_on_cuda(mlx_ops):
    check_sigmoid_on("cuda", mlx_ops)

"""The Metal backend on Linux, against a simulated Metal (`pytest -m metal_sim`).

csrc/mps's Objective-C++ (library from bytes, pipeline cache, command-list replay) is
compiled with clang and GCC's Objective-C runtime against fake Metal headers
(tests/metal_sim) and runs each call; the encoder's recording is replayed on the CPU
backend and must leave every bound buffer bit-identical to a direct CPU run
(_metal_sim.SimulatedMetal). The conformance families run unchanged through it, then the
recorded calls are checked exactly per argument kind, the pipeline cache under 8 threads,
and the limit checks. What only a Mac can confirm: docs/backends/metal.md.
"""

import concurrent.futures
import struct
import sys

import pytest
import torch

import torch_metallib as tm
import _conformance as conformance
import _cooperative as cooperative
import _mlx_matmul as matmul
import _argument_buffers as argument_buffers
import _mojo as mojo
from _metal_sim import native, simulated_metal
from torch_metallib.backends.mps_backend import MpsBackend

# The simulation builds with GCC's Objective-C runtime (Linux); a Mac runs tests/test_mps.py.
pytestmark = [pytest.mark.metal_sim,
              pytest.mark.skipif(sys.platform == "darwin", reason="the simulated Metal is built on Linux only")]


@pytest.fixture(autouse=True)
def compile_every_pipeline(monkeypatch):
    """Pipelines compiled, not taken from a binary archive left by an earlier run, so the
    counts below are exact (test_metal_sim_archive.py covers the archive)."""
    monkeypatch.setenv("TORCH_METALLIB_METAL_ARCHIVE", "0")


@pytest.fixture
def metal():
    with simulated_metal() as simulated:
        yield simulated
    assert simulated.runs > 0, "no call went through the simulated Metal"


# --- conformance families through the simulated Metal: bit-identical to the CPU backend ---

@pytest.mark.parametrize("case", conformance.params(conformance.UNARY_CASES[::18]))
def test_unary(mlx_lib, case, metal):
    conformance.check_unary(mlx_lib, case)


@pytest.mark.parametrize("case", conformance.params(conformance.BINARY_CASES[::36]))
def test_binary(mlx_lib, case, metal):
    conformance.check_binary_contiguous(mlx_lib, case)


@pytest.mark.parametrize("case", conformance.params(conformance.STRIDED_BINARY_CASES[::50]))
def test_binary_strided(mlx_lib, case, metal):
    conformance.check_binary_strided(mlx_lib, case)


@pytest.mark.parametrize("case", conformance.params(conformance.COPY_CASES[::40]))
def test_copy(mlx_lib, case, metal):
    conformance.check_copy_contiguous(mlx_lib, case)


@pytest.mark.parametrize("case", conformance.params(conformance.STRIDED_COPY_CASES[::23]))
def test_copy_strided(mlx_lib, case, metal):
    conformance.check_copy_strided(mlx_lib, case)


@pytest.mark.parametrize("case", conformance.params(conformance.SELECT_CASES[::3]))
def test_select(mlx_lib, case, metal):
    conformance.check_select(mlx_lib, case)


@pytest.mark.parametrize("case", conformance.params(conformance.ARANGE_CASES[::2]))
def test_arange(mlx_lib, case, metal):
    conformance.check_arange(mlx_lib, case)


def test_fixture_kernels(fixtures_lib, metal):
    conformance.check_fixture_vector_add_float(fixtures_lib)
    conformance.check_fixture_scale_shift_float(fixtures_lib, True)
    conformance.check_fixture_struct_arg_axpy(fixtures_lib)


@pytest.mark.parametrize("use_bias, alpha", [(True, 1.5), (False, -2.25), (True, 0.0)])
def test_function_constants(fixtures_lib, use_bias, alpha, metal):
    conformance.check_fixture_function_constant_scale(fixtures_lib, use_bias, alpha)
    assert metal.last["constants"], "the pipeline was made without its constant values"


@pytest.mark.parametrize("group", [32, 128])
def test_threadgroup_memory(fixtures, group, metal):
    cooperative.check_threadgroup_sum_with_threadgroup_memory(fixtures, group)
    assert metal.last["threadgroup"], "no threadgroup memory was set"


@pytest.mark.parametrize("dtype", cooperative.DTYPES)
@pytest.mark.parametrize("variant", ["block", "looped"])
def test_softmax(mlx_lib, variant, dtype, metal):
    cooperative.check_softmax(mlx_lib, variant, dtype)


@pytest.mark.parametrize("looped", [False, True])
def test_layer_norm(mlx_lib, looped, metal):
    cooperative.check_layer_norm(mlx_lib, looped)


@pytest.mark.parametrize("transpose,dtype", [("nt", "float16"), ("tn", "float32"), ("nn", "bfloat16")])
def test_steel_gemm(mlx_lib, transpose, dtype, metal):
    matmul.check_steel_gemm_alignment_paths(mlx_lib, matmul.ALIGNMENT_CASES[0], transpose, dtype)


@pytest.mark.parametrize("form", ["dict", "sequence"])
def test_argument_buffer_gather(mlx002, form, metal):
    argument_buffers.check_gather_rows_matches_torch(mlx002, form)


def test_argument_buffer_gather_two_index_arrays(mlx002, metal):
    argument_buffers.check_gather_with_two_index_arrays_matches_torch(mlx002)


def test_argument_buffer_scatter_with_atomics(mlx002, metal):
    argument_buffers.check_scatter_prod_with_repeated_indices_matches_torch(mlx002)


# --- the recorded calls, exactly ------------------------------------------------------------

def test_recorded_calls_per_argument_kind(mlx_lib, metal):
    """Sliced tensors' buffer (the storage's start) and byte offset, strides packed as
    int64 bytes, the grid and the group, as the encoder was told them."""
    kernel = mlx_lib["g2_Addfloat32"]  # a, b, c (float*), a_strides, b_strides (constant int64*)
    base = torch.arange(40, dtype=torch.float32)
    a, b = base[3:23].view(4, 5), base[10:30].view(4, 5)
    out = torch.zeros(6, 5)[1:5]
    args = {arg.name: arg for arg in kernel.arguments if arg.kind == "buffer"}
    strides = [5, 1]
    kernel(a, b, out, strides, strides, threads=(5, 4, 1), group_size=(4, 2, 1))
    record = metal.last
    names = {arg.binding: name for name, arg in args.items()}
    buffers, data = record["buffers"], record["bytes"]
    # Tensors: the storage's buffer (its start address) and offset = storage_offset * itemsize.
    assert buffers[args["a"].binding][:2] == (base.untyped_storage().data_ptr(), 3 * 4)
    assert buffers[args["b"].binding][:2] == (base.untyped_storage().data_ptr(), 10 * 4)
    assert buffers[args["c"].binding][1] == 5 * 4
    assert buffers[args["a"].binding][3] != buffers[args["c"].binding][3]
    # The strides, packed as int64[2] by value (setBytes).
    packed = [index for index in data if names[index] in ("a_strides", "b_strides")]
    assert packed and all(data[index] == struct.pack("<2q", 5, 1) for index in packed)
    assert record["dispatches"] == [((5, 4, 1), (4, 2, 1))]
    assert torch.equal(out, a + b)


def test_argument_buffer_holds_gpu_addresses_of_resident_buffers(mlx002, metal):
    """Metal 3 argument buffers: the struct goes by setBytes with each pointer slot
    rewritten as its tensor's gpuAddress plus byte offset, and every tensor it points to is
    made resident (useResource, read and write: the members are `device` pointers); values
    stay as packed."""
    storage = torch.arange(12, dtype=torch.int32)
    rows, cols = storage[2:5], storage[7:10] % 4
    src, out = torch.randn(12, 4), torch.zeros(3)
    argument_buffers.gather(mlx002.gatherfloat32int32_2, src, [rows, cols], [0, 1], out, [1, 1])
    record, tag = metal.last, metal.native.GPU_ADDRESS_TAG
    pointers = struct.unpack_from("<4Q", record["bytes"][1])
    members = [rows, cols]
    assert [p ^ tag for p in pointers[:2]] == [t.data_ptr() for t in members]
    assert pointers[0] - pointers[1] == rows.data_ptr() - cols.data_ptr() and pointers[0] != rows.data_ptr()
    assert struct.unpack_from("<i", record["bytes"][1], 32) == (1,)  # ndim
    resident = {address: (length, usage) for address, length, usage, _ in record["resources"]}
    assert len(record["resources"]) == 4 and set(usage for _, usage in resident.values()) == {3}
    assert resident[storage.untyped_storage().data_ptr()] == (48, 3)
    assert torch.equal(out, src[rows.long(), cols.long()])


def test_mojo_pointer_arguments_hold_gpu_addresses_of_resident_buffers(metal):
    """Mojo's pointer arguments: each buffer holding a pointer goes by setBytes, 8 bytes
    holding its tensor's gpuAddress plus byte offset; the tensor is made resident, read and
    write only where the kernel writes through the pointer. Barriers and threadgroup memory
    run as recorded, bit-identical to the CPU backend."""
    kernels = mojo.mojo_kernels()
    storage, b, c = torch.randn(300), torch.randn(200), torch.zeros(256)
    a = storage[7:207]
    kernels["vector_add"](a, b, c, 200, threads=256, group_size=64)
    record, tag = metal.last, metal.native.GPU_ADDRESS_TAG
    assert [struct.unpack("<Q", record["bytes"][i])[0] ^ tag for i in range(3)] == [a.data_ptr(), b.data_ptr(),
                                                                                   c.data_ptr()]
    usage = {address: used for address, _, used, _ in record["resources"]}
    assert [usage[t.untyped_storage().data_ptr()] for t in (a, b, c)] == [1, 1, 3]
    assert struct.unpack("<q", record["bytes"][3]) == (200,)
    assert torch.equal(c[:200], a + b)
    x, sums = torch.randn(1000), torch.zeros(16)
    kernels["block_sum"](x, sums, 1000, threads=1024, group_size=64)
    torch.testing.assert_close(sums, torch.nn.functional.pad(x, (0, 24)).view(16, 64).sum(1), rtol=1e-5, atol=1e-5)


def test_values_over_4_kilobytes_go_in_a_buffer_of_their_own(mlx_lib, metal):
    """setBytes takes at most 4 KB: a longer value (strides given as 600 int64s, of which the
    kernel reads 2) is copied into a buffer of its own, released once the command buffer
    has completed; a short one stays inline."""
    before = metal.native.counts()["released_copies"]
    a, b = torch.randn(4, 5), torch.randn(4, 5)
    out = torch.zeros(4, 5)
    long_strides = [5, 1] + [0] * 598
    mlx_lib["g2_Addfloat32"](a, b, out, long_strides, [5, 1], threads=(5, 4, 1), group_size=(5, 4, 1))
    record = metal.last
    assert record["buffers"][3][1:3] == (0, 600 * 8) and 3 not in record["bytes"]
    assert record["bytes"][4] == struct.pack("<2q", 5, 1)
    assert metal.native.counts()["released_copies"] == before + 1
    assert torch.equal(out, a + b)


def test_pipeline_cache_builds_each_function_and_constants_once_under_8_threads(fixtures_lib):
    """Eight threads asking at once for the pipelines of two constant sets (the native
    cache, GIL released): one Metal function and one pipeline per (function, constants)."""
    sim = native()
    kernel = fixtures_lib["function_constant_scale"]
    state = kernel._dispatch_state()
    x, out = torch.randn(100), torch.zeros(100)
    plans = [state.spec.bind((x, out), {}, 100, None, {"use_bias": False, "alpha": alpha}, None)
             for alpha in (0.5, 0.25)]
    backend = MpsBackend(sim)
    before = sim.counts()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        limits = list(pool.map(lambda plan: backend.limits(kernel, plan), plans * 32))
    after = sim.counts()
    assert after["functions"] - before["functions"] == 2
    assert after["pipelines"] - before["pipelines"] == 2
    assert limits[0] == {"max_total_threads_per_threadgroup": 1024, "thread_execution_width": 32,
                         "static_threadgroup_memory_length": 0}


def test_group_and_threadgroup_memory_limits_are_checked_before_encoding(fixtures_lib, fixtures):
    sim = native()
    kernel = fixtures_lib["vector_add_float"]
    a, b = torch.randn(256), torch.randn(256)
    out = torch.full((256,), -7.0)
    try:
        sim.set_limits(max_total_threads=64)
        with simulated_metal(), pytest.raises(tm.DispatchError, match=r"at most 64 \(maxTotalThreadsPerThreadgroup"):
            kernel(a, b, out, threads=256, group_size=128)
        assert not sim.take_recording() and (out == -7.0).all()
        sim.set_limits(device_threadgroup_memory=1024, static_threadgroup_memory=512)
        with simulated_metal(), pytest.raises(tm.DispatchError, match="exceeds the device's 1024"):
            cooperative.check_threadgroup_sum_with_threadgroup_memory(fixtures, 256)  # 1024 bytes + 512
        assert not sim.take_recording()
    finally:
        sim.set_limits()


def test_kernel_function_shows_its_pipeline_limits(fixtures_lib):
    """KernelFunction.pipeline_limits: the Metal pipeline's limits for given constants (the
    pipeline built once and cached with the calls'); without a Metal backend, a clear
    UnsupportedDeviceError; constants are checked as a call checks them."""
    from torch_metallib.dispatch import backend as seam

    kernel = fixtures_lib["function_constant_scale"]
    with pytest.raises(tm.UnsupportedDeviceError, match="function_constant_scale: .*macOS build"):
        kernel.pipeline_limits({"use_bias": True, "alpha": 1.0})
    sim = native()
    seam.register_backend(MpsBackend(sim))
    try:
        sim.set_limits(max_total_threads=896, execution_width=32, static_threadgroup_memory=48)
        before = sim.counts()["pipelines"]
        limits = kernel.pipeline_limits({"use_bias": True, "alpha": 3.0})
        assert kernel.pipeline_limits({"use_bias": True, "alpha": 3.0}) == limits == {
            "max_total_threads_per_threadgroup": 896, "thread_execution_width": 32,
            "static_threadgroup_memory_length": 48}
        assert sim.counts()["pipelines"] == before + 1
        with pytest.raises(tm.DispatchError, match="missing function constants: alpha"):
            kernel.pipeline_limits({"use_bias": True})
    finally:
        sim.set_limits()
        seam._backends.pop("mps")


# --- operators (ops.define) on the MPS dispatch key -------------------------------------------

MPS_KEY = torch._C.DispatchKeySet(torch._C.DispatchKey.MPS)


def test_defined_operators_have_an_mps_kernel(mlx_ops):
    for name in ("tm_examples::sigmoid", "tm_examples::sigmoid_", "tm_examples::softmax"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(name, "MPS"), name
        assert torch._C._dispatch_has_kernel_for_dispatch_key(name, "CPU"), name


def test_operator_dispatched_for_mps_encodes_through_the_metal_backend(mlx_ops):
    """An operator's MPS kernel: bound natively (outputs allocated on the tensors' device,
    non-contiguous inputs made dense, in-place results written back), then encoded by the
    Metal backend through the seam. No Linux torch makes mps tensors, so the call is
    dispatched for the MPS key with cpu tensors and the simulated Metal stands for mps."""
    torch.manual_seed(3)
    x = torch.randn(100, 24).t()  # not contiguous
    with simulated_metal("mps") as metal:
        y = torch.ops.tm_examples.softmax.default.redispatch(MPS_KEY, x)
        assert metal.runs == 1 and metal.last["function"] == "block_softmax_float32"
        z = torch.randn(5, 7)
        want = torch.sigmoid(z)
        torch.ops.tm_examples.sigmoid_.default.redispatch(MPS_KEY, z)
        assert metal.runs == 2 and metal.last["function"] == "v_Sigmoidfloat32float32"
    torch.testing.assert_close(y, torch.softmax(x, -1))
    torch.testing.assert_close(z, want)


def test_operator_dispatched_for_mps_without_a_metal_backend_says_so(mlx_ops):
    with pytest.raises(tm.UnsupportedDeviceError, match="v_Sigmoidfloat32float32: .*macOS build"):
        torch.ops.tm_examples.sigmoid.default.redispatch(MPS_KEY, torch.zeros(3))


@pytest.mark.slow
def test_every_csrc_mps_file_compiles():
    """-fsyntax-only of csrc/mps: the simulated files against the fake Metal, and the one
    that includes PyTorch's MPS headers against torch's own ATen/mps/MPSStream.h."""
    from metal_sim.build import syntax_check

    syntax_check()

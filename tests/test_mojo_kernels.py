"""Kernels written in Mojo (tests/mojo/kernels.mojo), compiled by Mojo's compiler to AIR on
Linux (tools/build_mojo_kernels.py; the modules are committed in tests/fixtures/mojo/),
packed into a library, reflected and run on the CPU backend against torch.

Mojo passes each pointer in a buffer of its own holding the address (reflection marks it
``holds_pointer``); a tensor passed there is bound by its address. Mojo's kernels index
whole threadgroups (``global_idx = block_idx * block_dim + thread_idx``), so every call
dispatches a grid that is a multiple of its threadgroup size.
"""

import io

import llvmlite.binding as llvm
import pytest
import torch

import torch_metallib as tm
from torch_metallib.backends.cuda.ptx import kernel_ptx, ptxas_path, run_ptxas
from torch_metallib.cli.inspect_reflection import print_reflection
from torch_metallib.lint import lint_path
from torch_metallib.reflection.reflect import reflect
from _mojo import FOLDER, KERNELS, mojo_kernels, mojo_modules


@pytest.fixture(scope="module")
def kernels():
    return mojo_kernels()


# --- packing and lint ---------------------------------------------------------------------------


def test_packed_from_the_modules_alone(kernels):
    """pack_modules takes each kernel's name, type and versions from its module, as Apple's
    metallib tool does, and the header's platform from the triple."""
    library = tm.load(tm.pack_modules(mojo_modules()))
    assert len(library.function_names) == len(KERNELS)
    assert all(name.startswith("kernels_") for name in library.function_names)
    assert {library[name].type for name in library.function_names} == {"kernel"}


def test_lint_finds_no_errors_in_mojos_modules():
    """Mojo's modules have typed pointers and Apple's metadata shape; what lint reports
    are warnings (its producer string, nameless buffers, llvm.fma and llvm.copysign where
    Apple writes air.fma), none that Metal refuses."""
    findings = [f for path in mojo_modules() for f in lint_path(str(path))]
    assert findings and not [f for f in findings if f.severity == "error"], findings
    assert {f.rule for f in findings} == {"AIR003", "AIR015", "AIR024"}, findings


# --- reflection -----------------------------------------------------------------------------------

def test_pointer_arguments_are_reflected_as_such(kernels):
    arguments = kernels["vector_add"].reflection.buffers
    held = [(a.holds_pointer, a.pointee_address_space, a.pointee_type, a.pointee_access) for a in arguments]
    assert held == [(True, "device", "float", "read"), (True, "device", "float", "read"),
                    (True, "device", "float", "write"), (False, None, None, None)]
    assert arguments[3].address_space == "constant" and arguments[3].type_name == "long"  # Int n, by value
    assert kernels["softplus_f16"].reflection.buffers[0].pointee_type == "half"
    total = kernels["simd_sum_atomic"].reflection.buffers[1]
    assert (total.pointee_type, total.pointee_access) == ("float", "read_write")  # an atomic add


def test_intrinsics_are_those_the_kernel_calls(kernels):
    """Mojo declares ``air.thread_position_in_threadgroup.x`` and its kin in every module,
    called or not; reflection lists only what a kernel calls."""
    assert kernels["vector_add"].intrinsics == ()
    assert kernels["softplus_f16"].intrinsics == ("air.convert.f.f32.s.i32", "air.exp2.f32")
    assert kernels["block_sum"].intrinsics == ("air.wg.barrier",) and kernels["block_sum"].uses_barriers
    assert kernels["simd_sum_atomic"].intrinsics == ("air.atomic.global.add.f32", "air.simd_shuffle_xor.f32.i16")
    assert kernels["simd_sum_atomic"].uses_simdgroup_ops


def test_inspect_shows_pointer_arguments(kernels):
    kernel = kernels["vector_add"]
    assert "device float* device*  [[buffer(2)]]" in kernel.signature
    out = io.StringIO()
    print_reflection(kernel, out)
    assert "holds a pointer to device float (write)" in out.getvalue()


def test_apple_kernels_hold_no_pointers(fixtures):
    assert not any(a.holds_pointer for a in fixtures.vector_add_float.reflection.arguments)


# --- runs on the CPU against torch ------------------------------------------------------------------

def test_vector_add(kernels):
    storage = torch.randn(300)
    a, b = storage[7:207], torch.randn(200)  # a view: bound at its first element, not its storage's
    c = torch.zeros(256)
    kernels["vector_add"](a, b, c, 200, threads=256, group_size=64)
    assert torch.equal(c[:200], a + b)
    assert not c[200:].any()  # threads past n write nothing


def test_block_sum_with_barriers(kernels):
    x = torch.randn(1000)
    out = torch.zeros(16)
    kernels["block_sum"](x, out, 1000, threads=1024, group_size=64)
    expected = torch.nn.functional.pad(x, (0, 24)).view(16, 64).sum(1)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_simd_group_sum_with_atomic_add(kernels):
    x = torch.randn(1000)
    total = torch.zeros(1)
    kernels["simd_sum_atomic"](x, total, 1000, threads=1024, group_size=256)
    torch.testing.assert_close(total[0], x.sum(), rtol=1e-4, atol=1e-3)


def test_softplus_float16(kernels):
    x = (torch.randn(500) * 6).half()
    y = torch.zeros(512, dtype=torch.half)
    kernels["softplus_f16"](x, y, 500, threads=512, group_size=128)
    torch.testing.assert_close(y[:500], torch.nn.functional.softplus(x.float()).half(), rtol=2e-3, atol=2e-3)


def test_tiled_transpose_with_threadgroup_memory(kernels):
    x = torch.randn(37, 50)
    out = torch.zeros(50, 37)
    kernels["transpose_tiled"](x, out, 37, 50, threads=(64, 48), group_size=(16, 16))
    assert torch.equal(out, x.t())


# --- binding pointer arguments ----------------------------------------------------------------------

def test_pointer_argument_takes_the_dtype_it_reads(kernels):
    a, b, c = torch.randn(64), torch.randn(64), torch.zeros(64)
    with pytest.raises(tm.KernelArgumentError, match=r"argument 0 '' \(buffer\(0\) holding a device float\*\): "
                                                     r"expected a tensor of torch\.float32, got torch\.float64"):
        kernels["vector_add"](a.double(), b, c, 64, threads=64, group_size=64)
    with pytest.raises(tm.KernelArgumentError, match=r"argument 2 .*: expected a tensor \(its address is bound\), "
                                                     r"got 5"):
        kernels["vector_add"](a, b, 5, 64, threads=64, group_size=64)
    assert not c.any()


def test_written_pointer_argument_refuses_overlapping_elements(kernels):
    a, b = torch.randn(64), torch.randn(64)
    with pytest.raises(tm.KernelArgumentError, match="overlap"):
        kernels["vector_add"](a, b, torch.zeros(1).expand(64), 64, threads=64, group_size=64)


def test_checked_call_bounds_a_pointer_by_the_tensors_view(kernels):
    """The kernel's own bounds are not known (n is just a number): checked, an access past
    the tensor's view is reported, naming the argument holding the pointer."""
    storage = torch.randn(300)
    a, b, c = storage[100:200], torch.randn(100), torch.zeros(100)
    kernels["vector_add"](a, b, c, 100, threads=128, group_size=64, checked=True)
    assert torch.equal(c, a + b)
    with pytest.raises(tm.KernelMemoryError, match=r"thread \(100, 0, 0\) reads 4 bytes .* of the tensor argument 0 '' "
                                                   r"\(buffer\(0\) holding a device float\*\) points to; expected "
                                                   r"byte offsets 0 to 400"):
        kernels["vector_add"](a, b, c, 101, threads=128, group_size=64, checked=True)


# --- CUDA: lowered and assembled without a GPU; run where one is -----------------------------------

@pytest.mark.parametrize("name", KERNELS)
def test_lowers_and_assembles_for_cuda(kernels, name):
    ptx = kernel_ptx(kernels[name], {}, "t")
    if ptxas_path() is None:
        pytest.skip("ptxas not found (CUDA's compiler)")
    for arch in ("sm_80", "sm_90"):
        result = run_ptxas(ptx, arch)
        assert result.returncode == 0, f"ptxas {arch}: {result.stderr[:1000]}"


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch.cuda.is_available() is False: no CUDA device")
def test_runs_on_cuda(kernels):
    """Pointers bound as CUDA device addresses: each kernel's results on cuda tensors."""
    x, y = torch.randn(1000, device="cuda"), torch.randn(1000, device="cuda")
    c = torch.zeros(1024, device="cuda")
    kernels["vector_add"](x, y, c, 1000, threads=1024, group_size=128)
    assert torch.equal(c[:1000], x + y)
    sums = torch.zeros(16, device="cuda")
    kernels["block_sum"](x, sums, 1000, threads=1024, group_size=64)
    torch.testing.assert_close(sums, torch.nn.functional.pad(x, (0, 24)).view(16, 64).sum(1), rtol=1e-5, atol=1e-5)
    total = torch.zeros(1, device="cuda")
    kernels["simd_sum_atomic"](x, total, 1000, threads=1024, group_size=256)
    torch.testing.assert_close(total[0], x.sum(), rtol=1e-4, atol=1e-3)
    h, soft = (x * 6).half(), torch.zeros(1024, dtype=torch.half, device="cuda")
    kernels["softplus_f16"](h, soft, 1000, threads=1024, group_size=128)
    torch.testing.assert_close(soft[:1000], torch.nn.functional.softplus(h.float()).half(), rtol=2e-3, atol=2e-3)
    m, t = torch.randn(37, 50, device="cuda"), torch.zeros(50, 37, device="cuda")
    kernels["transpose_tiled"](m, t, 37, 50, threads=(64, 48), group_size=(16, 16))
    assert torch.equal(t, m.t())


# --- what is not a pointer argument -----------------------------------------------------------------

@pytest.mark.parametrize("edit", [
    # the address read 8 bytes in: not at the buffer's start
    ("  %11 = load ptr addrspace(1), ptr addrspace(1) %10, align 8",
     "  %at = getelementptr i8, ptr addrspace(1) %10, i64 8\n  %11 = load ptr addrspace(1), ptr addrspace(1) %at, align 8"),
    # the buffer read as data besides: not only a pointer
    ("  %11 = load ptr addrspace(1), ptr addrspace(1) %10, align 8",
     "  %11 = load ptr addrspace(1), ptr addrspace(1) %10, align 8\n  %data = load float, ptr addrspace(1) %10, align 4"),
])
def test_a_buffer_used_otherwise_is_not_a_pointer_argument(edit):
    module = llvm.parse_bitcode((FOLDER / "vector_add.air").read_bytes(), context=llvm.create_context())
    symbol = next(f.name for f in module.functions if not f.is_declaration)
    text = str(module)
    assert edit[0] in text
    edited = llvm.parse_assembly(text.replace(edit[0], edit[1]), context=llvm.create_context())
    held = [a.holds_pointer for a in reflect(symbol, edited.as_bitcode()).buffers]
    assert held == [False, True, True, False]

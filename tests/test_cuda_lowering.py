"""The CUDA backend's lowering, checked without a GPU: AIR -> NVVM IR -> PTX, and CUDA's
``ptxas`` accepting the PTX for sm_80 and sm_90.

* One kernel of every family of Apple-built mlx.metallib and of the public corpus subset
  (cli/cuda_coverage.py groups them; the subset's once per distinct bitcode) lowers and
  assembles for both architectures.
* Each class of intrinsic is lowered from small hand-written AIR into the PTX instructions
  that implement it (shuffles, votes, barriers, atomics, libdevice math, shared memory).
* The launch split (edge threadgroups on their own) covers every threadgroup once with the
  size ``dispatchThreads`` gives it.
* What the backend cannot run is refused with an UnsupportedKernelError that names it.
* Small private arrays indexed at run time (MLX's layer_norm) use no local memory.
* Barriers and SIMD-group functions are convergent: none is copied into divergent branches
  (PyTorch's layer_norm_looped, whose copied barrier hung).
* Grid-only kernels (elementwise) are recognised and launch in blocks of the backend's size;
  straight-line ones run 4 grid positions per thread with 16-byte accesses, the others not.
* A launch's parameters are packed at the offsets the PTX ABI gives them.
* Runs of consecutive global accesses (MLX's rms, layer_norm, softmax: 4 or 8 floats per
  thread) become 16-byte accesses behind a run-time test of their alignment; the rewrite
  keeps what a function computes (hand-written IR run both ways on the CPU) and leaves
  kernels without such runs as they were.

CI has ptxas (CUDA's compiler, /usr/local/cuda*/bin); where it is missing the assembling
tests skip, except in CI, where that is a failure. test_cuda.py runs kernels on a GPU.
"""

import collections
import ctypes
import itertools
import re
import struct
import subprocess

import llvmlite.binding as llvm
import pytest

import _air_modules as air
import _cooperative
import torch_metallib as tm
import torch_metallib.backends.cuda.ptx as ptx_module
from torch_metallib.backends.cuda.backend import GRID_ONLY_BLOCK, _launches, _parameter_layout, grid_only, launch_group
from torch_metallib.backends.cuda.lowering import lower
from torch_metallib.backends.cuda.ptx import kernel_ptx, ptxas_path, run_ptxas
from torch_metallib.backends.cuda.vector_accesses import vector_accesses
from torch_metallib.cli.cuda_coverage import check_kernels, compute_kernels, families
from torch_metallib.dispatch.calls import dispatch_state
from conftest import unavailable
from _collectives import collective_kernel
from _parallel import cores
from _public_corpus import subset_files

ARCHS = ("sm_80", "sm_90")


@pytest.fixture(scope="module")
def ptxas():
    path = ptxas_path()
    if path is None:
        unavailable("ptxas not found (CUDA's compiler): the CUDA lowering cannot be assembled")
    return path


def _assembled(ptx: str) -> None:
    for arch in ARCHS:
        result = run_ptxas(ptx, arch)
        assert result.returncode == 0, f"ptxas {arch}: {result.stderr[:1000]}"


# --- the corpus: every family ---------------------------------------------------------------

@pytest.mark.slow
def test_every_mlx_family_lowers_and_assembles(mlx_path, ptxas):
    names = [members[0] for members in families(compute_kernels(tm.load(mlx_path))).values()]
    assert len(names) > 900  # 17,248 kernels in 933 families
    outcomes = check_kernels([(mlx_path, name) for name in names], ARCHS, jobs=cores())
    failed = [(o.name, o.outcome, o.detail[:300]) for o in outcomes if o.outcome != "ptx"]
    assert not failed, f"{len(failed)} of {len(names)} families: {failed[:5]}"


@pytest.mark.slow
def test_public_corpus_families_lower_and_assemble(ptxas):
    # One kernel per family and file; a family's kernel that another release of the same
    # project ships byte for byte (same HASH: a tenth of them) would lower the same, once more.
    kernels, seen = [], set()
    for path in subset_files():
        library = tm.load(str(path))
        for members in families(compute_kernels(library)).values():
            if library[members[0]].hash not in seen:
                seen.add(library[members[0]].hash)
                kernels.append((str(path), members[0]))
    checked = check_kernels(kernels, ARCHS, jobs=cores())
    outcomes = [(path.rsplit("/", 1)[-1], o) for (path, _), o in zip(kernels, checked)]
    counts = collections.Counter(o.outcome for _, o in outcomes)
    bugs = [(file, o.name, o.outcome, o.detail[:300]) for file, o in outcomes if o.outcome in ("ptxas", "error")]
    assert not bugs, bugs[:5]
    # What is refused names what the backend lacks.
    for file, o in outcomes:
        if o.outcome == "unsupported":
            assert re.search(r"no implementation of|binds buffers and threadgroup memory only|provide on the CPU|"
                             r"is not supported",
                             o.detail), (file, o.detail)
    assert counts["ptx"] >= 0.9 * len(outcomes), counts


# --- each intrinsic class, from hand-written AIR ----------------------------------------------

def _ptx(kernel) -> str:
    return kernel_ptx(kernel, {}, "t")


@pytest.mark.parametrize("intrinsic, ret, params, instruction", [
    ("air.simd_sum.f32", "float", ["float"], r"shfl\.sync\.idx\.b32"),
    ("air.simd_max.s.i32", "i32", ["i32"], r"shfl\.sync\.idx\.b32"),
    ("air.simd_prefix_exclusive_sum.f32", "float", ["float"], r"shfl\.sync\.idx\.b32"),
    ("air.simd_shuffle_xor.f32.i16", "float", ["float", "i16"], r"shfl\.sync\.idx\.b32"),
    ("air.simd_sum.s.i64", "i64", ["i64"], r"shfl\.sync\.idx\.b32"),  # in two 32-bit halves
    ("air.simd_ballot", "i64", ["i1"], r"shfl\.sync\.idx\.b32"),
])
def test_simd_group_functions_are_warp_shuffles(ptxas, intrinsic, ret, params, instruction):
    ptx = _ptx(air.simd_kernel(intrinsic, ret, params))
    assert re.search(instruction, ptx) and "activemask.b32" in ptx
    assert ".extern .func" not in ptx  # nothing left for the runtime
    _assembled(ptx)


def test_math_is_libdevice_and_fully_linked(ptxas):
    """libdevice's functions are linked in (ptxas, compiling the whole program, refuses a
    call of anything not defined in the module)."""
    for intrinsic in ("air.exp.f32", "air.tanh.f32", "air.erf.f32", "air.fast_exp.f32", "air.pow.f32"):
        params = ["float", "float"] if intrinsic == "air.pow.f32" else ["float"]
        ptx = _ptx(air.lane_kernel(intrinsic, "float", params))
        assert ".extern .func" not in ptx, intrinsic
        _assembled(ptx)


def test_atomics_and_barriers(ptxas):
    body = ["%p = getelementptr float, ptr addrspace(1) %out, i64 0",
            "%old = call float @air.atomic.global.add.f32(ptr addrspace(1) %p, float 1.0, i32 0, i32 2, i1 true) #2",
            "call void @air.wg.barrier(i32 2, i32 1) #2"]
    text = air.module_text("atomics", body, [("out", "float", "air.read_write")],
                           ["declare float @air.atomic.global.add.f32(ptr addrspace(1), float, i32, i32, i1) #1",
                            "declare void @air.wg.barrier(i32, i32) #1"], collective=True)
    ptx = _ptx(air.library("atomics", text)["atomics"])
    assert re.search(r"atom(\.relaxed)?\.global\.add\.f32|red(\.relaxed)?\.global\.add\.f32", ptx)
    assert re.search(r"bar\.sync\s+0|barrier\.sync\s+0", ptx)
    _assembled(ptx)


def test_threadgroup_memory_is_dynamic_shared(fixtures_lib, ptxas):
    ptx = _ptx(fixtures_lib["threadgroup_sum_float"])
    assert ".extern .shared" in ptx and "ld.shared" in ptx and "st.shared" in ptx
    _assembled(ptx)


def test_function_constants_are_specialized(fixtures_lib, ptxas):
    kernel = fixtures_lib["function_constant_scale"]
    with_bias = kernel_ptx(kernel, {0: True, 1: 2.5}, "t")
    without = kernel_ptx(kernel, {0: False, 1: 2.5}, "t")
    assert with_bias != without
    assert "0f40200000" in with_bias  # 2.5 folded in
    _assembled(with_bias)


def test_simdgroup_matrix_products_are_shuffles_and_fmas(mlx_lib, ptxas):
    ptx = _ptx(mlx_lib["steel_gemm_fused_nn_float32_float32_bm32_bn32_bk16_wm2_wn2"])
    assert ptx.count("fma.rn.f32") >= 16 and "shfl.sync.idx.b32" in ptx
    _assembled(ptx)


_ALIGNED = {10: False, 100: False, 110: False, 200: True, 201: True, 202: True}  # steel GEMM, aligned


@pytest.mark.parametrize("dtype, mma", [("float16", "f16"), ("bfloat16", "bf16")])
def test_half_gemm_products_run_on_tensor_cores(mlx_lib, ptxas, dtype, mma):
    """steel GEMM's float fragments loaded from half (bfloat) tiles: each 8x8 product is one
    mma.sync m16n8k8 with float sums (the exact product, one called function, stays for
    launches that are not whole warps, called once per run of products)."""
    kernel = mlx_lib[f"steel_gemm_fused_nn_{dtype}_{dtype}_bm64_bn64_bk16_wm2_wn2"]
    for arch in ARCHS:
        ptx = kernel_ptx(kernel, _ALIGNED, "t", arch)
        products = re.findall(r"mma\.sync\.aligned\.m16n8k8\.row\.col\.f32\.(\w+)\.\w+\.f32", ptx)
        # 4 x 4 fragments per SIMD-group, two 8-deep steps per 16-deep tile (unrolled): 32
        # products, two sharing B per m16n8k8.
        assert products == [mma] * 16, products[:4]
        # Two shuffles per fragment check (A's tile and B's), none per step; the exact
        # product (24 shuffles and 16 FMAs) once.
        assert ptx.count("shfl.sync.idx.b32") == 24 + 4
        assert ptx.count("fma.rn.f32") == 16 and "tf32" not in ptx
        # The exact products of each of the two runs: one call, calling the product 16 times.
        assert len(re.findall(r"call\.uni[^\n]*product8x8", ptx)) == 2 + 16
        assert run_ptxas(ptx, arch).returncode == 0, run_ptxas(ptx, arch).stderr[:1000]


def _blocks(ptx: str):
    return re.split(r"^\$L__BB\w+:", ptx, flags=re.M)


@pytest.mark.parametrize("tile, fragments, registers", [((32, 32, 16, 2, 2), 2, 64), ((64, 64, 16, 2, 2), 4, 129)],
                         ids=["bm32", "bm64"])
def test_float_gemm_operands_are_read_from_tiles(mlx_lib, ptxas, tmp_path, tile, fragments, registers):
    """float32 steel GEMM (exact, never TF32): per 8-deep step each lane reads the rows of A
    its products need with two 16-byte loads per A fragment and the column pairs of B with
    eight 8-byte loads per B fragment, straight from the tiles, with no shuffle: the
    addresses are exchanged once per tile (1 shuffle for A's, 8 for B's) where the tile's
    address is computed. The exact products (24 shuffles each), one called function per run,
    stay for warps that are not whole or tiles of another form. Per SIMD-group `fragments`
    A and as many B fragments, fragments^2 products per step (was 24 shuffles each, 72
    registers for bm32)."""
    bm, bn, bk, wm, wn = tile
    kernel = mlx_lib[f"steel_gemm_fused_nn_float32_float32_bm{bm}_bn{bn}_bk{bk}_wm{wm}_wn{wn}"]
    ptx = kernel_ptx(kernel, _ALIGNED, "t", "sm_90")
    assert "mma.sync" not in ptx and "tf32" not in ptx
    steps = [block for block in _blocks(ptx) if "ld.shared.v4.f32" in block or "ld.shared.v4.b32" in block]
    assert len(steps) == 2  # two 8-deep steps per 16-deep tile, unrolled
    for block in steps:
        assert block.count("fma.rn.f32") == 16 * fragments ** 2 and "shfl" not in block
        assert block.count("ld.shared.v4.b32") == 2 * fragments and block.count("ld.shared.v2.b32") == 8 * fragments
    assert ptx.count("shfl.sync.idx.b32") == 1 + 8 + 24 and ptx.count("vote.sync.all.pred") == 2
    assert ptx.count("fma.rn.f32") == 2 * 16 * fragments ** 2 + 16
    source = tmp_path / "kernel.ptx"
    source.write_text(ptx)
    result = subprocess.run([ptxas, "-v", "-arch=sm_90", str(source), "-o", str(tmp_path / "kernel.cubin")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[:1000]
    assert re.search(r"Used (\d+) registers", result.stderr).group(1) == str(registers), result.stderr
    assert run_ptxas(kernel_ptx(kernel, _ALIGNED, "t", "sm_80"), "sm_80").returncode == 0


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_gemm_fragments_are_read_by_ldmatrix(mlx_lib, ptxas, tmp_path, dtype):
    """Per 8-deep step a SIMD-group's four A fragments are one ldmatrix.x4 and its four B
    fragments one ldmatrix.x4.trans (mma.sync's column fragments: no shuffles); the blocks
    with the products read nothing else from shared memory. The rows the lanes' addresses
    imply are checked once, where each tile's address is computed (a vote per tile). Each
    thread's 16 bytes of a tile are copied from global memory with one 16-byte load and
    store where the source is aligned at run time (the 2-byte copy, called, stays for the
    other launches). The exact products, one call per run, keep the kernel at 80 registers (96
    with one call per product, 64 without the exact path)."""
    ptx = kernel_ptx(mlx_lib[f"steel_gemm_fused_nn_{dtype}_{dtype}_bm64_bn64_bk16_wm2_wn2"], _ALIGNED, "t", "sm_90")
    assert ptx.count("ldmatrix.sync.aligned.m8n8.x4.shared.b16") == 2
    assert ptx.count("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16") == 2
    assert ptx.count("vote.sync.all.pred") == 2
    with_products = [block for block in _blocks(ptx) if "mma.sync" in block]
    assert len(with_products) == 2 and all("ldmatrix" in block for block in with_products)
    assert not any("ld.shared" in block or "shfl" in block for block in with_products)
    assert ptx.count("ld.global.v4.b32") == 2 and ptx.count("st.shared.v4.b32") == 2  # A's and B's
    # The unaligned copies: one function, called; not inlined, where ptxas would predicate
    # its 16 two-byte loads and stores into every step.
    assert ptx.count("st.shared.b16") == 8 and len(re.findall(r"call\.uni\s+tm_\$_cuda_\$_copy", ptx)) == 2
    source = tmp_path / "kernel.ptx"
    source.write_text(ptx)
    result = subprocess.run([ptxas, "-v", "-arch=sm_90", str(source), "-o", str(tmp_path / "kernel.cubin")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[:1000]
    assert re.search(r"Used (\d+) registers", result.stderr).group(1) == "80", result.stderr


_RUN = """define void @k(ptr addrspace(3) %tile, i32 %x, ptr addrspace(1) %out) {{
  %o = shl i32 %x, 1
  %i = zext i32 %o to i64
  %base = getelementptr inbounds i8, ptr addrspace(3) %tile, i64 %i
  %a1p = getelementptr inbounds i8, ptr addrspace(3) %base, i64 {a}
  %a2p = getelementptr inbounds i8, ptr addrspace(3) %base, i64 {a2}
  %b1p = getelementptr inbounds i8, ptr addrspace(3) %base, i64 {b}
  %b2p = getelementptr inbounds i8, ptr addrspace(3) %base, i64 {b2}
  %a1 = load half, ptr addrspace(3) %a1p, align 2
  %a2 = load half, ptr addrspace(3) %a2p, align 2
  %b1 = load half, ptr addrspace(3) %b1p, align 2
  %b2 = load half, ptr addrspace(3) %b2p, align 2{between}
  %fa1 = fpext half %a1 to float
  %fa2 = fpext half %a2 to float
  %fb1 = fpext half %b1 to float
  %fb2 = fpext half %b2 to float
  %va0 = insertelement <2 x float> poison, float %fa1, i64 0
  %va = insertelement <2 x float> %va0, float %fa2, i64 1
  %vb0 = insertelement <2 x float> poison, float %fb1, i64 0
  %vb = insertelement <2 x float> %vb0, float %fb2, i64 1
  %d = call <2 x float> @tm.cuda.product8x8(<2 x float> %va, <2 x float> %vb, <2 x float> zeroinitializer, i1 true)
  store <2 x float> %d, ptr addrspace(1) %out, align 8
  ret void
}}
declare <2 x float> @tm.cuda.product8x8(<2 x float>, <2 x float>, <2 x float>, i1)
"""


@pytest.mark.parametrize("a, b, between, ldmatrix", [
    (0, 64, "", ["x1", "x1.trans"]),  # both fragments from 16-byte rows of one tile
    (8, 64, "", ["x1.trans"]),        # A 8 bytes into a row: A packed by the caller, B still read by ldmatrix
    (0, 72, "", ["x1"]),              # and the other way round
    (0, 64, "\n  store half %a1, ptr addrspace(3) %b1p, align 2", []),  # written in between: the loads stay
])
def test_fragments_take_ldmatrix_only_where_their_form_is_plain(a, b, between, ldmatrix):
    """A run's fragments are read by ldmatrix only where both halves come from one tile
    register plus a constant multiple of 16 bytes and nothing writes memory between the
    loads and the product; the rows themselves are checked at run time."""
    from torch_metallib.backends.cuda.tensor_core_products import tensor_core_products
    text = tensor_core_products(_RUN.format(a=a, a2=a + 2, b=b, b2=b + 2, between=between))
    assert re.findall(r"call (?:i32|\{[^}]*\}) @llvm\.nvvm\.ldmatrix\.sync\.aligned\.m8n8\.(x\d(?:\.trans)?)\.b16", text) == ldmatrix
    assert text.count("call i1 @llvm.nvvm.vote.all.sync(") == (1 if ldmatrix else 0)  # one check: one tile register
    # Each call matches its function (LLVM's verifier accepts a call of another type, then
    # neither inlines it nor calls it correctly): optimized, no product function is left.
    module = llvm.parse_assembly(f'target triple = "{ptx_module.TRIPLE}"\n' + text)
    module.verify()
    machine = ptx_module._machine("sm_80")
    builder = llvm.create_pass_builder(machine, llvm.create_pipeline_tuning_options(speed_level=3))
    builder.getModulePassManager().run(module, builder)
    assert "@tm.cuda.products" not in str(module)


def test_shared_alignment_claims_only_what_the_address_proves():
    """An offset with an odd term keeps its 2-byte alignment; through a loop's phi only what
    every way in proves; an even offset of a 16-byte array becomes 4."""
    from torch_metallib.backends.cuda.shared_alignment import proven_shared_alignment
    text = ("@t = internal addrspace(3) global [64 x half] undef, align 16\n"
            "define void @k(i32 %x, i1 %c) {\n"
            "  %even = shl i32 %x, 1\n  %odd = or disjoint i32 %even, 1\n  %i = zext nneg i32 %even to i64\n"
            "  %j = zext nneg i32 %odd to i64\n  %p = getelementptr inbounds half, ptr addrspace(3) @t, i64 %i\n"
            "  %q = getelementptr inbounds half, ptr addrspace(3) @t, i64 %j\n"
            "  %a = load half, ptr addrspace(3) %p, align 2\n  %b = load half, ptr addrspace(3) %q, align 2\n"
            "  br label %loop\nloop:\n  %r = phi ptr addrspace(3) [ %p, %0 ], [ %s, %loop ]\n"
            "  %s = getelementptr inbounds i8, ptr addrspace(3) %r, i64 2\n"
            "  store half %a, ptr addrspace(3) %r, align 2\n  br i1 %c, label %loop, label %out\nout:\n  ret void\n}\n")
    aligned = re.findall(r"(load half|store half \S+), ptr addrspace\(3\) (%\w+), align (\d+)",
                         proven_shared_alignment(text))
    assert aligned == [("load half", "%p", "4"), ("load half", "%q", "2"), ("store half %a", "%r", "2")]


def _lanes(lines, flag: str):
    """The function of a lane index that `lines` (leaving %out) compute, run on the host."""
    text = (f"define i32 @f(i32 %in) {{\n  %flag = icmp eq i32 {flag}, 1\n  "
            + "\n  ".join(lines) + "\n  ret i32 %out\n}\n")
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    module = llvm.parse_assembly(text)
    engine = llvm.create_mcjit_compiler(module, llvm.Target.from_default_triple().create_target_machine())
    engine.finalize_object()
    f = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_int32)(engine.get_function_address("f"))
    return [f(lane) for lane in range(32)]


def test_relabelled_lanes_hold_mma_fragments():
    """CUDA lane l plays the Metal lane whose elements of an 8x8 matrix are mma.sync's for l
    (row l/4, columns 2(l%4) and 2(l%4)+1); the inverse maps back; unrelabelled, lanes stay."""
    from torch_metallib.backends.cuda.lane_relabeling import physical_lane, virtual_lane
    playing = _lanes(virtual_lane("%in", "%flag", "out"), "1")
    for lane, metal in enumerate(playing):
        row, column = ((metal >> 4) << 2) | ((metal >> 1) & 3), ((metal >> 3) & 1) * 4 + (metal & 1) * 2
        assert (row, column) == (lane >> 2, 2 * (lane & 3)), (lane, metal)
    assert _lanes(physical_lane("%in", "%flag", "out"), "1") == [playing.index(v) for v in range(32)]
    assert _lanes(virtual_lane("%in", "%flag", "out"), "0") == list(range(32))


def test_kernels_with_other_simd_functions_keep_their_lanes():
    """Only kernels whose SIMD-group functions name no lane are relabelled: a shuffle or a
    reduction beside a product keeps every lane where Metal has it."""
    from torch_metallib.backends.cuda.lane_relabeling import relabel_safe
    from torch_metallib.backends.cuda.lowering import _names_lanes
    product = ("<64 x float>", "air.simdgroup_matrix_8x8_multiply_accumulate.v64f32.v64f32.v64f32.v64f32",
               ["<64 x float>"] * 3)
    barrier = ("void", "air.simdgroup.barrier", ["i32", "i32"])
    shuffle = ("float", "air.simd_shuffle.f32.i16", ["float", "i16"])
    exp = ("float", "air.fast_exp.f32", ["float"])
    declared = lambda *fs: {f[1]: f for f in fs}  # noqa: E731
    assert relabel_safe(declared(product, barrier, exp), _names_lanes)
    assert not relabel_safe(declared(product, barrier, shuffle), _names_lanes)
    assert not relabel_safe(declared(barrier, exp), _names_lanes)  # no product: nothing to gain


@pytest.mark.parametrize("name", ["layer_normfloat32", "layer_normbfloat16", "vjp_layer_normfloat32"])
def test_small_private_arrays_stay_in_registers(mlx_lib, ptxas, name, tmp_path):
    """layer_norm's ``float thread_x[8]``, indexed at run time where a row ends mid-thread,
    uses no local memory: none in the PTX, and ptxas (-v) gives the kernel no stack frame."""
    ptx = kernel_ptx(mlx_lib[name], {}, "t", "sm_90")
    assert ".local" not in ptx and "ld.local" not in ptx and "st.local" not in ptx
    source = tmp_path / "kernel.ptx"
    source.write_text(ptx)
    result = subprocess.run([ptxas, "-v", "-arch=sm_90", str(source), "-o", str(tmp_path / "kernel.cubin")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[:1000]
    assert re.search(r"\b0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads", result.stderr), result.stderr
    assert "lmem" not in result.stderr


# --- which lanes take part in a SIMD-group function ------------------------------------------

def test_top_level_collectives_take_the_lanes_still_running(ptxas):
    """PyTorch's radix_scan: its first prefix sum and sum follow a loop whose trip count
    differs per lane, where a warp need not have reconverged. They are top-level (every lane
    that has not returned reaches them), so their lanes are a vote of the warp's lanes as the
    kernel started, which waits for the lanes still looping; the prefix sum inside ``if
    (simd_id == 0)`` keeps the lanes that run it together (activemask)."""
    kernel = _cooperative.radix_scan_kernel()
    text = _nvvm(kernel)
    body = re.search(r"^define [^\n]*@radix_scan\(.*?^\}$", text, re.M | re.S).group(0)
    converged = re.findall(r"call i32 @(air\.simd_[\w.]+)\.tm_converged\([^\n]*, i32 %tm\.mask\.\d+\)", body)
    assert converged == ["air.simd_prefix_exclusive_sum.u.i32", "air.simd_sum.u.i32"]
    assert len(re.findall(r"call i32 @air\.simd_prefix_exclusive_sum\.u\.i32\(", body)) == 1
    assert body.count("@llvm.nvvm.vote.ballot.sync(i32 %tm.entry.mask, i1 true)") == 2
    ptx = _ptx(kernel)
    # One activemask at the entry, one in the `if`; two votes.
    assert ptx.count("vote.sync.ballot.b32") == 2 and ptx.count("activemask.b32") == 2
    _assembled(ptx)


def test_collectives_in_loops_and_branches_keep_the_active_lanes():
    """simd_sum_loop_reconverge: the simd_sum inside the loop acts over the lanes still in
    it (activemask); the one after the loop over every lane (a vote)."""
    kernel = collective_kernel("simd_sum_loop_reconverge")
    body = re.search(r"^define [^\n]*@simd_sum_loop_reconverge\(.*?^\}$", _nvvm(kernel), re.M | re.S).group(0)
    assert len(re.findall(r"@air\.simd_sum\.f32\.tm_converged\(", body)) == 1
    assert len(re.findall(r"@air\.simd_sum\.f32\(", body)) == 1


# --- barriers and SIMD-group functions stay where the kernel has them --------------------------

def _nvvm(kernel) -> str:
    """The kernel's NVVM IR as lowered, before LLVM optimizes it."""
    return lower(ptx_module.air_text(kernel), kernel.name, kernel.arguments, {}, "t", str(ptx_module._machine("sm_80").target_data))[0]


def test_barriers_are_never_copied_into_divergent_branches(ptxas):
    """PyTorch's layer_norm_looped (tests/fixtures/norms/layer_norm_looped.ll) tests
    ``simd_lane_id == 0`` on both sides of a barrier. Were the barrier not convergent, LLVM
    would thread that test through it, a copy of the barrier on each path: the lanes of a
    warp then wait at two ``bar.sync`` (an aligned barrier: the kernel hangs). The
    definitions of the barrier and of simd_sum are convergent, as is every function that
    reaches them (the entry too, as clang's CUDA kernels): the PTX has the source's three
    barriers and four reductions (two top-level, with the lanes a vote finds; two inside
    an ``if``, with the active lanes; converged_masks.py)."""
    kernel = _cooperative.layer_norm_looped_kernel()
    ptx = _ptx(kernel)
    barriers = re.findall(r"\b(?:bar|barrier)\.sync\b", ptx)
    assert len(barriers) == 3, f"{len(barriers)} barriers"
    assert ptx.count("vote.sync.ballot") == 2 and ptx.count("activemask.b32") == 1 + 2
    _assembled(ptx)
    text = _nvvm(kernel)
    for name in ("air.wg.barrier", "air.simd_sum.f32", "__tm_cuda_t"):
        header = re.search(rf"^define [^\n]*@{re.escape(name)}\([^\n]*$", text, re.M).group(0)
        assert re.search(r"\)[^()]*\bconvergent\b[^()]*\{$", header), header


# --- runs of accesses as vector accesses, where aligned at run time ---------------------------

@pytest.mark.parametrize("name, loads, stores", [("rmsfloat32", 1, 1), ("layer_normfloat32", 2, 2),
                                                 ("block_softmax_float32", 1, 1), ("looped_softmax_float32", 2, 1)])
def test_row_kernels_read_and_write_aligned_runs_as_vectors(mlx_lib, ptxas, monkeypatch, name, loads, stores):
    """MLX's row kernels read and write N_READS consecutive floats per thread at an offset
    known at run time (gid * axis_size + lid * N_READS): 16-byte accesses behind a test of
    the address's low 4 bits, and the scalar accesses for other rows (vector_accesses.py).
    Without the rewrite there are none (LLVM cannot know the alignment)."""
    ptx = _ptx(mlx_lib[name])
    assert ptx.count("ld.global.v4.b32") >= loads and ptx.count("st.global.v4.b32") >= stores, name
    assert re.search(r"and\.b64\s+%rd\d+, %rd\d+, 15;", ptx)
    assert "ld.global.b32" in ptx and "st.global.b32" in ptx  # the scalar copy
    _assembled(ptx)
    monkeypatch.setattr(ptx_module, "vector_accesses", lambda text: text)
    assert ".v4" not in _ptx(mlx_lib[name])


@pytest.mark.parametrize("name", ["vv_Addfloat32", "v_Expfloat32float32", "gn2_Addfloat32", "arangefloat32"])
def test_kernels_without_runs_are_unchanged(mlx_lib, monkeypatch, name):
    ptx = _ptx(mlx_lib[name])
    monkeypatch.setattr(ptx_module, "vector_accesses", lambda text: text)
    assert _ptx(mlx_lib[name]) == ptx


_RUNS = """
define void @k(ptr addrspace(1) %x, ptr addrspace(1) %y, i64 %n, i1 %full) {
entry:
  %p = getelementptr float, ptr addrspace(1) %x, i64 %n
  %q = getelementptr float, ptr addrspace(1) %y, i64 %n
  br i1 %full, label %fast, label %edge

fast:
  %0 = load float, ptr addrspace(1) %p, align 4
  %1 = getelementptr inbounds i8, ptr addrspace(1) %p, i64 4
  %2 = load float, ptr addrspace(1) %1, align 4
  %3 = getelementptr inbounds i8, ptr addrspace(1) %p, i64 8
  %4 = load float, ptr addrspace(1) %3, align 4
  %5 = fadd float %0, %2
  store float %5, ptr addrspace(1) %q, align 4
  %6 = getelementptr inbounds i8, ptr addrspace(1) %q, i64 4
  store float %4, ptr addrspace(1) %6, align 4
  BETWEEN
  br label %last

edge:
  %7 = load float, ptr addrspace(1) %x, align 4
  %8 = icmp ugt i64 %n, 1000
  br i1 %8, label %last, label %done

last:
  %9 = phi float [ %4, %fast ], [ %7, %edge ]
  %10 = getelementptr inbounds i8, ptr addrspace(1) %p, i64 12
  %11 = load float, ptr addrspace(1) %10, align 4
  %12 = fadd float %9, %11
  %13 = getelementptr inbounds i8, ptr addrspace(1) %q, i64 12
  store float %12, ptr addrspace(1) %13, align 4
  br label %done

done:
  %14 = phi float [ %11, %last ], [ 0.0, %edge ]
  %15 = getelementptr inbounds i8, ptr addrspace(1) %q, i64 8
  store float %14, ptr addrspace(1) %15, align 4
  ret void
}
"""


def _run_on_cpu(text: str, n: int, full: bool) -> list:
    """y after @k(x, y, n, full) (the hand-written function, JIT-compiled for this CPU)."""
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    module = llvm.parse_assembly(text)
    module.verify()
    engine = llvm.create_mcjit_compiler(module, llvm.Target.from_default_triple().create_target_machine())
    engine.finalize_object()
    kernel = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_bool)(
        engine.get_function_address("k"))
    x, y = (ctypes.c_float * 40)(*[1.5 * i - 7 for i in range(40)]), (ctypes.c_float * 40)()
    # 16-byte aligned starts, so n = 0 takes the aligned copy, n = 1..3 the scalar one.
    start_x, start_y = -ctypes.addressof(x) % 16 // 4, -ctypes.addressof(y) % 16 // 4
    kernel(ctypes.addressof(x) + 4 * start_x, ctypes.addressof(y) + 4 * start_y, n, full)
    return list(y)[start_y:start_y + 24]


def test_runs_are_versioned_on_their_alignment_and_compute_the_same():
    """A run split across blocks by LLVM's sinking (its last load and store in a block the
    edge path shares) is first copied whole into one block, then versioned: the copy where
    x and y are 16-byte aligned gets accesses of alignment 16/4/8/4 by offset. Run on the CPU
    at every alignment and on both paths, the function computes what it did."""
    original = _RUNS.replace("BETWEEN", "")
    versioned = vector_accesses(original)
    assert versioned != original
    fast = versioned[versioned.index("fast:"):versioned.index("edge:")]
    assert re.search(r"and i64 %tm\.v\d+\.i0, 15", fast) and "icmp eq i64" in fast and "freeze i64" in fast
    aligned = fast[fast.index(".aligned:"):fast.index(".scalar:")]
    assert re.findall(r"load float, ptr addrspace\(1\) %[-\w.]+, align (\d+)", aligned) == ["16", "4", "8", "4"]
    assert re.findall(r"store float %[-\w.]+, ptr addrspace\(1\) %[-\w.]+, align (\d+)", aligned) == ["16", "4", "4",
                                                                                                    "8"]
    scalar = fast[fast.index(".scalar:"):fast.index(".join:")]
    assert set(re.findall(r", align (\d+)", scalar)) == {"4"}
    for n in range(5):
        for full in (True, False):
            assert _run_on_cpu(versioned, n, full) == _run_on_cpu(original, n, full), (n, full)


@pytest.mark.parametrize("between", [
    "call void @llvm.nvvm.barrier0()",  # convergent: never made conditional
    "store volatile float 0.0, ptr addrspace(1) %y, align 4",
    "%r = atomicrmw add ptr addrspace(1) %y, i32 1 monotonic, align 4",
])
def test_runs_are_not_versioned_across_what_cannot_be_copied(between):
    """A barrier, a volatile access or an atomic between the accesses of a run: no region
    spans it (only the loads before it, a whole 8-byte chunk, are versioned), nor is a
    block copied across it; it runs once, unconditionally, as before."""
    text = _RUNS.replace("BETWEEN", between)
    text += "declare void @llvm.nvvm.barrier0() #0\nattributes #0 = { convergent nounwind }\n"
    versioned = vector_accesses(text)
    blocks = {chunk.split(":", 1)[0]: chunk for chunk in versioned.split("\n\n")}
    copies = [name for name in blocks if name.endswith((".aligned", ".scalar"))]
    assert copies and not any(between in blocks[name] for name in copies)
    assert versioned.count(between) == 1
    assert "align 16" not in versioned  # no whole 16-byte chunk on either side


def test_versioned_module_assembles(ptxas):
    """The rewrite's output on hand-written NVVM IR is valid for LLVM and ptxas, and the
    aligned copy's accesses are merged into one 16-byte load and store."""
    text = ('target triple = "nvptx64-nvidia-cuda"\n' + _RUNS.replace("BETWEEN", "")
            .replace("define void @k(ptr addrspace(1) %x, ptr addrspace(1) %y, i64 %n, i1 %full)",
                     "define ptx_kernel void @k(ptr addrspace(1) noalias %x, ptr addrspace(1) noalias %y, i64 %n, "
                     "i1 %full)"))
    ptx = ptx_module.compile_ptx(text, "k")
    assert re.search(r"ld\.global(\.nc)?\.v4\.b32", ptx) and "st.global.v4.b32" in ptx
    _assembled(ptx)


# --- refusals -----------------------------------------------------------------------------------

def test_tensor_operations_are_refused_by_name(ptxas):
    body = ["%t = call i32 @air.some_future_op.i32(i32 1) #2",
            "%p = getelementptr i32, ptr addrspace(1) %out, i64 %gid64", "store i32 %t, ptr addrspace(1) %p"]
    text = air.module_text("future", body, [("out", "i32", "air.read_write")],
                           ["declare i32 @air.some_future_op.i32(i32) #1"], collective=False)
    with pytest.raises(tm.UnsupportedKernelError, match=r"CUDA backend has no implementation of air\.some_future_op"):
        _ptx(air.library("future", text)["future"])


def test_missing_libdevice_says_how_to_provide_it(monkeypatch, ptxas):
    import torch_metallib.backends.cuda.ptx as ptx_module
    monkeypatch.setenv("TORCH_METALLIB_LIBDEVICE", "/nonexistent/libdevice.10.bc")
    monkeypatch.setattr(ptx_module, "_libdevice", None)  # as in a fresh process
    monkeypatch.setattr(ptx_module, "_libdevice_parts", {})
    with pytest.raises(tm.UnsupportedKernelError, match="TORCH_METALLIB_LIBDEVICE"):
        _ptx(air.lane_kernel("air.exp.f32", "float", ["float"]))


# --- grid-only kernels: 4 grid positions per thread, where their accesses merge -------------------

@pytest.mark.parametrize("name, loads, stores", [("vv_Addfloat32", 2, 1), ("v_Expfloat32float32", 1, 1),
                                                 ("vv_Addfloat16", 2, 1), ("v_copyfloat32float32", 1, 1)])
def test_grid_only_kernels_run_four_positions_per_thread(mlx_lib, ptxas, name, loads, stores):
    """Straight-line one-element kernels (MLX's contiguous elementwise and copies) export the
    coarsened entry, whose four copies read and write 16-byte vectors (coarsening.py); the
    same kernel asked as an ordinary one is not coarsened."""
    ptx = kernel_ptx(mlx_lib[name], {}, "t", grid_only=True)
    assert ".entry __tm_cuda_t_x4(" in ptx
    assert len(re.findall(r"ld\.global(?:\.nc)?\.v4\.b(?:16|32)", ptx)) == loads, ptx
    assert len(re.findall(r"st\.global\.v4\.b(?:16|32)", ptx)) == stores, ptx
    _assembled(ptx)
    assert ".entry __tm_cuda_t(" in _ptx(mlx_lib[name])


@pytest.mark.parametrize("name", ["v_Sinfloat32float32",    # libdevice's sinf branches between the copies
                                  "g3_copyfloat32float32",  # a vector position: strided accesses
                                  "vn_Expfloat32float32"])  # bounds checks between its own elements
def test_grid_only_kernels_that_would_not_merge_stay_one_position_per_thread(mlx_lib, name):
    function = mlx_lib[name]
    state = dispatch_state(function)
    assert grid_only(function, state.cooperative, state.serial)
    assert ".entry __tm_cuda_t(" in kernel_ptx(function, {}, "t", grid_only=True)


def test_grid_only_kernels_with_atomics_stay_one_position_per_thread(ptxas):
    """Threads may meet at an atomic's location on purpose: no copies reordered around it."""
    body = ["%p = getelementptr float, ptr addrspace(1) %out, i64 %gid64",
            "%old = call float @air.atomic.global.add.f32(ptr addrspace(1) %p, float 1.0, i32 0, i32 2, i1 true) #2"]
    text = air.module_text("adds", body, [("out", "float", "air.read_write")],
                           ["declare float @air.atomic.global.add.f32(ptr addrspace(1), float, i32, i32, i1) #1"],
                           collective=False)
    ptx = kernel_ptx(air.library("adds", text)["adds"], {}, "t", grid_only=True)
    assert ".entry __tm_cuda_t(" in ptx and re.search(r"(atom|red)(\.relaxed)?\.global\.add\.f32", ptx)
    _assembled(ptx)


# --- launches: every CUDA block is one Metal threadgroup ----------------------------------------

@pytest.mark.parametrize("grid, group", [((1000, 3, 1), (256, 2, 1)), ((33, 7, 5), (8, 4, 2)),
                                         ((1024, 1, 1), (256, 1, 1)), ((5, 1, 1), (32, 1, 1)),
                                         ((70000 * 2, 70000, 1), (2, 1, 1))])
def test_launches_cover_each_threadgroup_once_at_its_size(grid, group):
    seen = {}
    for blocks, block, base in _launches(grid, group):
        assert blocks[0] < 2 ** 31 and blocks[1] <= 65535 and blocks[2] <= 65535
        if max(blocks) > 1000:  # too many to enumerate: check the corners only
            corners = [(0, 0, 0), tuple(b - 1 for b in blocks)]
        else:
            corners = itertools.product(*(range(b) for b in blocks))
        for index in corners:
            g = tuple(base[a] + index[a] for a in range(3))
            assert g not in seen
            seen[g] = block
    groups = [-(-grid[a] // group[a]) for a in range(3)]
    for g, block in seen.items():
        for a in range(3):
            assert block[a] == min(group[a], grid[a] - g[a] * group[a]), (g, block)
    if all(g <= 1000 for g in groups):
        assert len(seen) == groups[0] * groups[1] * groups[2]


def test_launch_parameters_are_packed_at_their_natural_alignment():
    """One buffer holds a launch's parameters (cuLaunchKernel's CU_LAUNCH_PARAM_BUFFER_POINTER),
    each at the offset the PTX ABI gives it: u64 pointers on 8 bytes, u32 threadgroup offsets
    and the 9 launch values on 4."""
    layout = struct.Struct(_parameter_layout([False, True, False]))  # pointer, offset, pointer
    packed = layout.pack(1 << 40, 7, 3 << 40, *range(100, 109))
    assert struct.unpack_from("<Q", packed, 0)[0] == 1 << 40 and struct.unpack_from("<I", packed, 8)[0] == 7
    assert struct.unpack_from("<Q", packed, 16)[0] == 3 << 40
    assert struct.unpack_from("<9I", packed, 24) == tuple(range(100, 109)) and layout.size == 60


# --- the block of grid-only kernels -------------------------------------------------------------

@pytest.mark.parametrize("name, expected", [
    ("vv_Addfloat32", True),             # thread_position_in_grid only
    ("v_Sigmoidfloat32float32", True),
    ("block_softmax_float32", False),    # barriers, SIMD-group reductions, threadgroup memory
    ("row_reduce_simple_sumfloat32", False),
    ("gn2_Addfloat32", True),            # a 2-D position and threads_per_grid
    ("gemv_float32_bm1_bn8_sm1_sn32_tm4_tn4_nc0_axpby0", False),  # SIMD-group sums
])
def test_grid_only_kernels_are_recognised(mlx_lib, name, expected):
    function = mlx_lib[name]
    state = dispatch_state(function)
    assert grid_only(function, state.cooperative, state.serial) == expected


@pytest.mark.parametrize("grid, group, expected", [
    ((1 << 24, 1, 1), (1024, 1, 1), (GRID_ONLY_BLOCK, 1, 1)),
    ((100, 1, 1), (1024, 1, 1), (100, 1, 1)),
    ((1000, 3, 1), (32, 2, 1), (32, 2, 1)),  # 2-D grids keep the call's group
])
def test_grid_only_kernels_choose_their_block(grid, group, expected):
    assert launch_group(grid, group, True) == expected
    assert launch_group(grid, group, False) == group

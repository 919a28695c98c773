"""Simdgroup-matrix products that need none of each other's results run as one exchange
(_cpu_matrix_batches): the rewrite of the IR, the results against torch, and MLX's steel
GEMM tiles as Apple built them.

Apple's fragment layout (docs/formats.md, AIR): lane l holds M[r][c] and M[r][c + 1] with
r = ((l >> 4) << 2) | ((l >> 1) & 3) and c = ((l >> 3) & 1) * 4 + (l & 1) * 2.
"""

import functools
import pathlib
import re

import llvmlite.binding as llvm
import pytest
import torch

import torch_metallib as tm
from conftest import fixture_bitcode
from torch_metallib.backends.cpu.jit import lowered_ir
from torch_metallib.air.simdgroup_matrix import define_product_batch
from torch_metallib.backends.cpu.matrix_batches import MAX_BATCH, batch_matrix_products
from torch_metallib.backends.cpu.target import COROUTINES
from torch_metallib.air.intrinsics import parse_declaration

SENTINEL = -12345.0
_BATCH_CALL = re.compile(r"call \{[^}]*\} @tm\.simdgroup_matrix_8x8\.multiply_accumulate_batch\.(\w+)\.")
_SINGLE_CALL = re.compile(r"call <64 x \w+> @air\.simdgroup_matrix_8x8_multiply_accumulate\.")


@functools.lru_cache(maxsize=None)
def _fixture():
    name = "simdgroup_matrix_batched"
    return tm.load(tm.pack([tm.FunctionSource(name, fixture_bitcode(f"collectives/{name}"))]))[name]


def _batches(text: str, factors: bool = False):
    """The `sources` word of each batch call (``c`` or the index of the product whose D is
    the accumulator; with `factors`, followed by ``a<k>`` / ``b<k>`` where A / B is an
    earlier product's factor k), and the number of products called one at a time."""
    words = [m.split("_") for m in _BATCH_CALL.findall(text)]
    if not factors:
        words = [[re.sub(r"[ab]\d+", "", word) for word in batch] for batch in words]
    return words, len(_SINGLE_CALL.findall(text))


def test_independent_and_chained_products_run_as_one_exchange():
    # d1 = a b + c, d2 = a2 b + c and d3 = a2 b + d1 (d1 through thread_elements' shuffle);
    # b is staged once (factor 1, d1's B), a2 once (factor 3, d2's A).
    assert _batches(lowered_ir(_fixture(), {}, "t", True), factors=True) == ([["c", "cb1", "0a3b1"]], 0)


@pytest.mark.parametrize("integers", [False, True])
def test_batched_products_against_torch(integers):
    g = torch.Generator().manual_seed(41)
    if integers:  # every sum exact in float: the results must be equal
        a, a2, b, c = (torch.randint(-8, 8, (8, 8), generator=g).float() for _ in range(4))
    else:
        a, a2, b, c = (torch.randn(8, 8, generator=g) for _ in range(4))
    d1, d2, d3 = (torch.full((8, 8), SENTINEL) for _ in range(3))
    _fixture()(a, a2, b, c, d1, d2, d3, threads=32, group_size=32)
    expected = [a.double() @ b.double() + c.double(), a2.double() @ b.double() + c.double()]
    expected.append(a2.double() @ b.double() + expected[0])
    for actual, want in zip((d1, d2, d3), expected):
        if integers:
            assert torch.equal(actual.double(), want)
        else:
            torch.testing.assert_close(actual.double(), want, rtol=0, atol=1e-5 * want.abs().max().item())


def _held_by(lanes):
    """An 8x8 mask of the elements lanes `lanes` hold (Apple's layout, module docstring)."""
    mask = torch.zeros(8, 8, dtype=torch.bool)
    for lane in lanes:
        row = ((lane >> 4) << 2) | ((lane >> 1) & 3)
        column = ((lane >> 3) & 1) * 4 + (lane & 1) * 2
        mask[row, column:column + 2] = True
    return mask


def test_lanes_outside_the_grid_count_as_zeros():
    # 24 threads: lanes 24-31 of the SIMD-group do not exist. Metal leaves simdgroup
    # matrices with missing lanes undefined; here their elements count as zeros, and the
    # elements they would store stay untouched.
    g = torch.Generator().manual_seed(42)
    a, a2, b, c = (torch.randint(-8, 8, (8, 8), generator=g).float() for _ in range(4))
    d1, d2, d3 = (torch.full((8, 8), SENTINEL) for _ in range(3))
    _fixture()(a + 1, a2 + 1, b + 1, c + 1, d1, d2, d3, threads=32, group_size=32)  # leaves other values behind
    d1, d2, d3 = (torch.full((8, 8), SENTINEL) for _ in range(3))
    _fixture()(a, a2, b, c, d1, d2, d3, threads=24, group_size=32)
    present = _held_by(range(24))
    assert present.sum() == 48
    a, a2, b, c = (torch.where(present, m, 0.0) for m in (a, a2, b, c))
    expected = [a @ b + c, a2 @ b + c]
    expected.append(a2 @ b + expected[0])
    for actual, want in zip((d1, d2, d3), expected):
        assert torch.equal(actual, torch.where(present, want, SENTINEL))


# --- the rewrite, on hand-written blocks ------------------------------------------------

_HEAD = """declare <64 x float> @air.simdgroup_matrix_8x8_multiply_accumulate.v64f32.v64f32.v64f32.v64f32(<64 x float>, <64 x float>, <64 x float>)
declare void @air.wg.barrier(i32, i32)
declare void @air.simdgroup.barrier(i32, i32)

define void @k(<64 x float> %a, <64 x float> %b, <64 x float> %c, ptr %out) {
"""
_MMA = "call <64 x float> @air.simdgroup_matrix_8x8_multiply_accumulate.v64f32.v64f32.v64f32.v64f32"
_KEEP = "<64 x i32> <i32 0, i32 1" + ", i32 poison" * 62 + ">"
_SWAP = "<64 x i32> <i32 1, i32 0" + ", i32 poison" * 62 + ">"


def _rewrite(body: str):
    """(batches, single calls) of the block `body`, after checking the result is valid IR."""
    text = batch_matrix_products(_HEAD + body + "\n  ret void\n}\n", lambda module: module)
    llvm.parse_assembly(text, context=llvm.create_context()).verify()
    return _batches(text)


def test_products_needing_nothing_of_each_other_form_one_batch():
    body = f"""
  %d1 = {_MMA}(<64 x float> %a, <64 x float> %b, <64 x float> %c)
  %e1 = extractelement <64 x float> %d1, i32 0
  store float %e1, ptr %out
  %d2 = {_MMA}(<64 x float> %b, <64 x float> %a, <64 x float> %c)"""
    # The store needs d1: it ends the batch before it.
    assert _rewrite(body) == ([], 2)
    body = f"""
  %d1 = {_MMA}(<64 x float> %a, <64 x float> %b, <64 x float> %c)
  %e1 = extractelement <64 x float> %d1, i32 0
  %d2 = {_MMA}(<64 x float> %b, <64 x float> %a, <64 x float> %c)
  call void @air.simdgroup.barrier(i32 0, i32 1)
  %d3 = {_MMA}(<64 x float> %a, <64 x float> %a, <64 x float> %c)
  store float %e1, ptr %out"""
    # The pure extract moves below the batch; simdgroup_barrier(mem_none) is a no-op.
    assert _rewrite(body) == ([["c", "c", "c"]], 0)


def test_a_product_alone_keeps_its_operands():
    # A and B the same fragment: a batch would stage it once, a product called alone
    # passes both (MLX's gated delta kernel).
    body = f"""
  %d1 = {_MMA}(<64 x float> %a, <64 x float> %a, <64 x float> %c)
  %e1 = extractelement <64 x float> %d1, i32 0
  store float %e1, ptr %out"""
    text = batch_matrix_products(_HEAD + body + "\n  ret void\n}\n", lambda module: module)
    assert f"%d1 = {_MMA}(<64 x float> %a, <64 x float> %a, <64 x float> %c)" in text


def test_a_product_of_a_fragment_with_itself_in_a_batch():
    body = f"""
  %d1 = {_MMA}(<64 x float> %a, <64 x float> %a, <64 x float> %c)
  %d2 = {_MMA}(<64 x float> %b, <64 x float> %b, <64 x float> %c)"""
    text = batch_matrix_products(_HEAD + body + "\n  ret void\n}\n", lambda module: module)
    assert _batches(text, factors=True) == ([["cb0", "cb3"]], 0)
    # Its B is its own A, staged once: the batch has a definition.
    declaration = next(line for line in text.splitlines() if line.startswith("declare { <64 x float>"))
    ret, name, params = parse_declaration(declaration)
    assert define_product_batch(ret, name, params, COROUTINES) is not None


def test_a_factor_from_the_batch_ends_it():
    body = f"""
  %d1 = {_MMA}(<64 x float> %a, <64 x float> %b, <64 x float> %c)
  %k1 = shufflevector <64 x float> %d1, <64 x float> poison, {_KEEP}
  %d2 = {_MMA}(<64 x float> %k1, <64 x float> %b, <64 x float> %c)
  %d3 = {_MMA}(<64 x float> %a, <64 x float> %a, <64 x float> %c)"""
    assert _rewrite(body) == ([["c", "c"]], 1)  # d1 alone, then d2 and d3


def test_an_accumulator_from_the_batch_is_chained_only_if_the_lane_elements_are_kept():
    body = f"""
  %d1 = {_MMA}(<64 x float> %a, <64 x float> %b, <64 x float> %c)
  %d2 = {_MMA}(<64 x float> %b, <64 x float> %b, <64 x float> %c)
  %k2 = shufflevector <64 x float> %d2, <64 x float> poison, {_KEEP}
  %d3 = {_MMA}(<64 x float> %a, <64 x float> %a, <64 x float> %k2)
  %d4 = {_MMA}(<64 x float> %a, <64 x float> %a, <64 x float> %d1)"""
    assert _rewrite(body) == ([["c", "c", "1", "0"]], 0)
    body = f"""
  %d1 = {_MMA}(<64 x float> %a, <64 x float> %b, <64 x float> %c)
  %s1 = shufflevector <64 x float> %d1, <64 x float> poison, {_SWAP}
  %d2 = {_MMA}(<64 x float> %a, <64 x float> %a, <64 x float> %s1)"""
    assert _rewrite(body) == ([], 2)


def test_a_call_that_may_wait_ends_the_batch():
    body = f"""
  %d1 = {_MMA}(<64 x float> %a, <64 x float> %b, <64 x float> %c)
  call void @air.wg.barrier(i32 2, i32 1)
  %d2 = {_MMA}(<64 x float> %b, <64 x float> %a, <64 x float> %c)
  call void @air.simdgroup.barrier(i32 1, i32 1)
  %d3 = {_MMA}(<64 x float> %b, <64 x float> %b, <64 x float> %c)"""
    assert _rewrite(body) == ([], 3)


def test_batches_hold_at_most_max_batch_products():
    body = "".join(f"\n  %d{i} = {_MMA}(<64 x float> %a, <64 x float> %b, <64 x float> %c)" for i in range(MAX_BATCH + 3))
    batches, singles = _rewrite(body)
    assert [len(b) for b in batches] == [MAX_BATCH, 3] and singles == 0


# --- MLX's GEMM, as Apple built it --------------------------------------------------------

@pytest.mark.parametrize("name", [
    "steel_gemm_fused_nn_float32_float32_bm64_bn64_bk16_wm2_wn2",
    "steel_gemm_fused_nt_bfloat16_bfloat16_bm64_bn64_bk16_wm2_wn2",
    "steel_gemm_fused_tn_float16_float16_bm32_bn32_bk16_wm2_wn2",
])
def test_steel_gemm_k_blocks_are_one_exchange_each(mlx_lib, name):
    # Each SIMD-group owns a (bm / wm) x (bn / wn) tile of 8x8 fragments, (bk / 8) k-steps
    # per k-block; every product of a k-block lands in one batch, each k-step after the first
    # chained to the one before.
    bm, bn, bk, wm, wn = (int(v) for v in re.search(r"bm(\d+)_bn(\d+)_bk(\d+)_wm(\d+)_wn(\d+)", name).groups())
    tile = (bm // wm // 8) * (bn // wn // 8)
    per_block = tile * (bk // 8)
    text = lowered_ir(mlx_lib[name], {}, "t", True)
    batches, singles = _batches(text)
    assert batches and singles == 0
    for sources in batches:
        assert len(sources) == per_block
        assert sources[:tile] == ["c"] * tile
        assert all(0 <= int(s) < tile * step for step in range(1, bk // 8) for s in sources[tile * step:tile * (step + 1)])
    # A fragment of A serves a row of products, one of B a column: each is staged once.
    rows, columns = bm // wm // 8, bn // wn // 8
    for words in _batches(text, factors=True)[0]:
        assert sum(not re.search(r"a\d", word) for word in words) == rows * (bk // 8)
        assert sum(not re.search(r"b\d", word) for word in words) == columns * (bk // 8)


def test_elements_no_lane_holds_are_not_carried():
    # MLX builds a k-step's fragment from the lane's pair and the previous k-step's fragment,
    # whose elements it does not use: that operand becomes poison, so lane loops need not
    # keep the previous fragment.
    body = f"""
  %p = shufflevector <64 x float> %a, <64 x float> %b, <64 x i32> <i32 0, i32 1{", i32 66" * 62}>
  %d1 = {_MMA}(<64 x float> %p, <64 x float> %b, <64 x float> %c)
  %d2 = {_MMA}(<64 x float> %a, <64 x float> %p, <64 x float> %c)"""
    text = batch_matrix_products(_HEAD + body + "\n  ret void\n}\n", lambda module: module)
    llvm.parse_assembly(text, context=llvm.create_context()).verify()
    assert "%p = shufflevector <64 x float> %a, <64 x float> poison, <64 x i32> <i32 0, i32 1, i32 66" in text
    # %p holds %a's lane elements: staged once, as d1's A.
    assert _batches(text, factors=True) == ([["c", "ca0b0"]], 0)


# --- accumulators a loop keeps between runs of its batch (lane loops) --------------------

_LOAD = "call <64 x float> @air.simdgroup_matrix_8x8_load.v64f32.p1f32"
# The batched fixture's kernel with its products in a loop: for i < n (D2[0], a float so the
# loop is not unrolled), c = A2_i B_i + (A_i B_i + c) through thread_elements' shuffle and
# e = A_i B_i + (A2_i B_i + e), from c = e = C; c into D1, e into D3. Each k-step's four
# products are one batch, and both accumulators come back to it through the loop's phis.
_LOOP_BODY = f"""define weak_odr void @simdgroup_matrix_batched(ptr addrspace(1) noundef "air-buffer-no-alias" %A, ptr addrspace(1) noundef "air-buffer-no-alias" %A2, ptr addrspace(1) noundef "air-buffer-no-alias" %B, ptr addrspace(1) noundef "air-buffer-no-alias" %C, ptr addrspace(1) noundef "air-buffer-no-alias" %D1, ptr addrspace(1) noundef "air-buffer-no-alias" %D2, ptr addrspace(1) noundef "air-buffer-no-alias" %D3) local_unnamed_addr #0 {{
start:
  %c0 = {_LOAD}(ptr addrspace(1) %C, i64 8, <2 x i64> zeroinitializer, i1 false) #2
  %nf = load float, ptr addrspace(1) %D2, align 4
  %n = fptoui float %nf to i64
  br label %loop
loop:
  %i = phi i64 [ 0, %start ], [ %i.next, %loop ]
  %c = phi <64 x float> [ %c0, %start ], [ %c2, %loop ]
  %e = phi <64 x float> [ %c0, %start ], [ %e2, %loop ]
  %at = mul i64 %i, 64
  %pa = getelementptr float, ptr addrspace(1) %A, i64 %at
  %pa2 = getelementptr float, ptr addrspace(1) %A2, i64 %at
  %pb = getelementptr float, ptr addrspace(1) %B, i64 %at
  %a = {_LOAD}(ptr addrspace(1) %pa, i64 8, <2 x i64> zeroinitializer, i1 false) #2
  %a2 = {_LOAD}(ptr addrspace(1) %pa2, i64 8, <2 x i64> zeroinitializer, i1 false) #2
  %b = {_LOAD}(ptr addrspace(1) %pb, i64 8, <2 x i64> zeroinitializer, i1 false) #2
  %c1 = {_MMA}(<64 x float> %a, <64 x float> %b, <64 x float> %c) #2
  %e1 = {_MMA}(<64 x float> %a2, <64 x float> %b, <64 x float> %e) #2
  %c1k = shufflevector <64 x float> %c1, <64 x float> poison, {_KEEP}
  %c2 = {_MMA}(<64 x float> %a2, <64 x float> %b, <64 x float> %c1k) #2
  %e2 = {_MMA}(<64 x float> %a, <64 x float> %b, <64 x float> %e1) #2
  %i.next = add i64 %i, 1
  %more = icmp ult i64 %i.next, %n
  br i1 %more, label %loop, label %done
done:
  tail call void @air.simdgroup_matrix_8x8_store.v64f32.p1f32(<64 x float> %c2, ptr addrspace(1) %D1, i64 8, <2 x i64> zeroinitializer, i1 false) #2
  tail call void @air.simdgroup_matrix_8x8_store.v64f32.p1f32(<64 x float> %e2, ptr addrspace(1) %D3, i64 8, <2 x i64> zeroinitializer, i1 false) #2
  ret void
}}"""


@functools.lru_cache(maxsize=None)
def _loop_fixture():
    name = "simdgroup_matrix_batched"
    text = (pathlib.Path(__file__).parent / "fixtures" / "collectives" / f"{name}.ll").read_text()
    text = re.sub(r"define weak_odr void @simdgroup_matrix_batched\(.*?\n}", lambda _: _LOOP_BODY, text, flags=re.S)
    module = llvm.parse_assembly(text, context=llvm.create_context())
    module.verify()
    return tm.load(tm.pack([tm.FunctionSource(name, module.as_bitcode())]))[name]


def test_a_loops_accumulators_are_kept_in_lane_loops_only():
    # Products 0 and 1 start from the loop's phis, whose next values are products 2 and 3.
    kernel = _loop_fixture()
    assert _batches(lowered_ir(kernel, {}, "t", True, lanes=True)) == ([["k2", "k3", "0", "1"]], 0)
    assert _batches(lowered_ir(kernel, {}, "t", True)) == ([["c", "c", "0", "1"]], 0)


@pytest.mark.parametrize("threads,steps", [(32, 5), (32, 1), (24, 3)])
def test_kept_accumulators_give_the_coroutines_bits(threads, steps):
    # Lane loops (kept accumulators; vector lanes alike) against a checked call (coroutines,
    # C staged every k-step), twice: the second launch finds the first one's D in the kept area. With 24
    # threads, lanes 24-31 do not exist and their elements count as zeros in every step.
    g = torch.Generator().manual_seed(43 + steps)
    a, a2, b = (torch.randn(steps, 8, 8, generator=g) for _ in range(3))
    c = torch.randn(8, 8, generator=g)
    kernel = _loop_fixture()
    results = []
    for checked in (False, True, False):
        d1, d3 = torch.full((8, 8), SENTINEL), torch.full((8, 8), SENTINEL)
        kernel(a, a2, b, c, d1, torch.tensor([float(steps)]), d3, threads=threads, group_size=32, checked=checked)
        results.append((d1, d3, kernel.cpu_scheme))
    assert results[0][2] == results[2][2] in ("lanes", "vector") and results[1][2] == "coroutines"
    for lanes in (results[0], results[2]):
        assert torch.equal(lanes[0].view(torch.int32), results[1][0].view(torch.int32))
        assert torch.equal(lanes[1].view(torch.int32), results[1][1].view(torch.int32))
    present = _held_by(range(threads))
    c1, e1 = (torch.where(present, c, 0.0).double(),) * 2
    for i in range(steps):
        ai, a2i, bi = (torch.where(present, m[i], 0.0).double() for m in (a, a2, b))
        c1, e1 = a2i @ bi + (ai @ bi + c1), ai @ bi + (a2i @ bi + e1)
    for actual, want in ((results[0][0], c1), (results[0][1], e1)):
        torch.testing.assert_close(actual.double(), torch.where(present, want, SENTINEL), rtol=0, atol=1e-4)


@pytest.mark.parametrize("split,kept", [(False, [["k1", "0"]]), (True, [["c", "0"]])])
def test_only_a_phi_of_the_batchs_own_block_is_kept(split, kept):
    # With the products in a block of their own, the batch need not run once per run of the
    # phi's block (it might sit in an inner loop): the accumulator is staged as before.
    middle = "  br label %body\nbody:\n" if split else ""
    body = f"""  br label %loop
loop:
  %acc = phi <64 x float> [ %c, %0 ], [ %d2, %{"body" if split else "loop"} ]
{middle}  %d1 = {_MMA}(<64 x float> %a, <64 x float> %b, <64 x float> %acc)
  %d2 = {_MMA}(<64 x float> %b, <64 x float> %a, <64 x float> %d1)
  %more = load i1, ptr %out
  br i1 %more, label %loop, label %done
done:"""
    text = batch_matrix_products(_HEAD + body + "\n  ret void\n}\n", lambda module: module, keep_accumulators=True)
    llvm.parse_assembly(text, context=llvm.create_context()).verify()
    assert _batches(text) == (kept, 0)
    assert ("call void @tm.simdgroup_matrix_8x8.keep.0.0.1(<64 x float> %c)" in text) == (not split)

"""Cooperative kernels as lane loops (backends/cpu/regions.py, csrc/cpu/lanes.cpp).

Which scheme a call ran (KernelFunction.cpu_scheme), and that lane loops compute what
the coroutine scheme computes, bit for bit, on Apple-built MLX kernels: a checked call
runs as coroutines (the bounds checks need the runtime's current thread), an unchecked
one as lane loops, the same arithmetic in the same order either way. The hand-written
collective, reduction, scan and schedule tests run as lane loops too, whenever the
parallel or sequential schedule is used.
"""

import re
import struct

import pytest
import torch

import _air_modules as air
import torch_metallib as tm
from _cooperative import MLX_ROW_GROUP, mlx_row_sum_lanes_ir
from torch_metallib.backends.cpu.recompute import recompute, recomputable
from torch_metallib.backends.cpu.regions import ARRAY_SKEW, MAX_THREADS


def _both(kernel, outputs, *args, **kwargs):
    """The kernel's `outputs` after an unchecked and after a checked call, and the
    schemes those ran with."""
    results, schemes = [], []
    for checked in (False, True):
        for out in outputs:
            out.fill_(-7)
        kernel(*args, checked=checked, **kwargs)
        results.append([out.clone() for out in outputs])
        schemes.append(kernel.cpu_scheme)
    return results, schemes


@pytest.mark.parametrize("name,rows,size", [("block_softmax_float32", 7, 1000), ("block_softmax_float32", 3, 37),
                                            ("looped_softmax_float32", 3, 5000), ("block_softmax_float16", 5, 700)])
def test_softmax_lanes_match_coroutines(mlx_lib, name, rows, size):
    dtype = torch.float16 if name.endswith("16") else torch.float32
    x = torch.randn(rows, size, generator=torch.Generator().manual_seed(size)).to(dtype)
    out = torch.empty_like(x)
    # As MLX launches both: a smaller group leaves looped_softmax reading threadgroup entries
    # that no thread wrote (whatever an earlier kernel left in the reused threadgroup memory).
    group = MLX_ROW_GROUP
    (lanes, coroutines), schemes = _both(mlx_lib[name], [out], x, out, size, threads=rows * group, group_size=group)
    assert schemes == ["lanes", "coroutines"]
    assert torch.equal(lanes[0], coroutines[0])
    torch.testing.assert_close(lanes[0].float(), torch.softmax(x.float(), -1), atol=2e-3 if dtype != torch.float32
                               else 1e-6, rtol=1e-2 if dtype != torch.float32 else 1e-5)


def test_row_sum_lanes_match_coroutines(mlx_lib):
    rows, size = 16, 3000
    x = torch.randn(rows, size, generator=torch.Generator().manual_seed(5))
    out = torch.empty(rows)
    group = min(1024, -(-(size // 4) // 32) * 32)
    (lanes, coroutines), schemes = _both(mlx_lib["row_reduce_simple_sumfloat32"], [out], x, out, size, rows,
                                         threads=(group, rows // 4, 1), group_size=group)
    assert schemes == ["lanes", "coroutines"]
    assert torch.equal(lanes[0], coroutines[0])
    torch.testing.assert_close(lanes[0], x.double().sum(-1).float(), rtol=1e-5, atol=1e-4)


def test_scan_lanes_match_coroutines(mlx_lib):
    """A scan: SIMD-group prefix sums inside a loop over the row, barriers between."""
    rows, size = 3, 2500
    x = torch.randn(rows, size, generator=torch.Generator().manual_seed(9))
    out = torch.empty_like(x)
    kernel = mlx_lib["contig_scan_inclusive_sum_float32_float32"]
    (lanes, coroutines), schemes = _both(kernel, [out], x, out, size, threads=(256, rows, 1), group_size=(256, 1, 1))
    assert schemes == ["lanes", "coroutines"]
    assert torch.equal(lanes[0], coroutines[0])
    torch.testing.assert_close(lanes[0], torch.cumsum(x.double(), -1).float(), rtol=1e-4, atol=1e-3)


def test_schemes_named(mlx_lib):
    """Kernels whose threads never meet run one after another; cooperative ones as lane
    loops; a permuted schedule runs any kernel as coroutines."""
    x = torch.arange(64, dtype=torch.float32)
    out = torch.empty_like(x)
    add = mlx_lib["vv_Addfloat32"]
    add(x, x, out)
    assert add.cpu_scheme == "threads"
    softmax = mlx_lib["block_softmax_float32"]
    assert softmax.cpu_scheme in (None, "lanes", "coroutines")
    row = torch.randn(2, 64)
    result = torch.empty_like(row)
    with tm.cpu_schedule("permuted", seed=1):
        softmax(row, result, 64, threads=2 * 1024, group_size=1024)
    assert softmax.cpu_scheme == "coroutines"
    softmax(row, result, 64, threads=2 * 1024, group_size=1024)
    assert softmax.cpu_scheme == "lanes"
    torch.testing.assert_close(result, torch.softmax(row, -1))


@pytest.mark.parametrize("dtype,tile,m,n,k", [
    (torch.float32, (32, 32, 16, 2, 2), 64, 96, 48),    # whole tiles: products batched per k-block
    (torch.float32, (32, 32, 16, 2, 2), 37, 45, 29),    # edges: partial tiles, the unaligned paths
    (torch.float16, (64, 64, 16, 2, 2), 70, 64, 40),    # half fragments, products from float staging
    (torch.bfloat16, (64, 32, 32, 2, 2), 64, 50, 70)])
def test_steel_gemm_lanes_match_coroutines(mlx_lib, dtype, tile, m, n, k):
    """simdgroup-matrix products as a staged exchange in lane loops: the same bits as
    coroutines (the same fused multiply-adds in the same order), and torch's product."""
    bm, bn, bk, wm, wn = tile
    short = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}[dtype]
    kernel = mlx_lib[f"steel_gemm_fused_nn_{short}_{short}_bm{bm}_bn{bn}_bk{bk}_wm{wm}_wn{wn}"]
    g = torch.Generator().manual_seed(m * n + k)
    a, b = torch.randn(m, k, generator=g).to(dtype), torch.randn(k, n, generator=g).to(dtype)
    d = torch.empty(m, n, dtype=dtype)
    tiles_n, tiles_m = -(-n // bn), -(-m // bm)
    params = struct.pack("<8i3q3i4x", m, n, k, k, n, n, tiles_n, tiles_m, m * k, k * n, m * n, 0, k // bk, 0)
    constants = {"has_batch": False, "use_out_source": False, "do_axpby": False,
                 "align_M": m % bm == 0, "align_N": n % bn == 0, "align_K": k % bk == 0}
    (lanes, coroutines), schemes = _both(kernel, [d], a, b, d, params, threads=(tiles_n * 32, tiles_m * wn, wm),
                                         group_size=(32, wn, wm), constants=constants)
    assert schemes == ["lanes", "coroutines"]
    assert torch.equal(lanes[0], coroutines[0])
    exact = a.double() @ b.double()
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(lanes[0].double(), exact, rtol=tolerance, atol=tolerance * k ** 0.5)


def test_switches_before_and_after_a_collective():
    """A switch's cases are on lines of their own: every case is in the region (found by
    breaking regions.py's successor list, which then emitted branches to missing blocks)."""
    body = ["%m = urem i32 %gid, 3",
            "switch i32 %m, label %d [", "  i32 0, label %a", "  i32 1, label %b", "]",
            "a:", "br label %j", "b:", "br label %j", "d:", "br label %j",
            "j:", "%v = phi float [ 1.0, %a ], [ 2.0, %b ], [ 4.0, %d ]",
            "%s = call float @air.simd_sum.f32(float %v) #2",
            "%p = getelementptr float, ptr addrspace(1) %out, i64 %gid64",
            "switch i32 %m, label %x [", "  i32 0, label %y", "]",
            "y:", "%twice = fmul float %s, 2.0", "store float %twice, ptr addrspace(1) %p", "br label %end",
            "x:", "store float %s, ptr addrspace(1) %p", "br label %end", "end:"]
    text = air.module_text("switches", body, [("out", "float", "air.read_write")],
                       ["declare float @air.simd_sum.f32(float) local_unnamed_addr #1"], collective=True)
    kernel = air.library("switches", text)["switches"]
    threads = 70  # two whole SIMD-groups and a partial one
    out = torch.empty(threads)
    (lanes, coroutines), schemes = _both(kernel, [out], out, threads=threads, group_size=96)
    assert schemes == ["lanes", "coroutines"]
    assert torch.equal(lanes[0], coroutines[0])
    m = torch.arange(threads) % 3
    v = torch.tensor([1.0, 2.0, 4.0])[m]
    sums = torch.cat([v[s:s + 32].sum().expand(len(v[s:s + 32])) for s in range(0, threads, 32)])
    torch.testing.assert_close(lanes[0], torch.where(m == 0, sums * 2, sums), rtol=0, atol=0)


@pytest.mark.parametrize("kept", ["address", "selected address"])
def test_private_arrays_written_in_a_loop_and_through_a_kept_pointer(kept):
    """Private arrays filled in a loop are copied per region (regions.py) where no pointer
    into them outlives the region: an address kept across the wait is recomputed where it
    is used; one selected between two arrays cannot be, so they stay in the context (a
    copy would leave the pointer into the last region's stack). Both give what the
    coroutine scheme and the arithmetic give."""
    pointer = (["%p = getelementptr inbounds [4 x float], ptr %a, i64 0, i64 %m64"] if kept == "address" else
               ["%pa = getelementptr inbounds [4 x float], ptr %a, i64 0, i64 %m64",
                "%pb = getelementptr inbounds [4 x float], ptr %b, i64 0, i64 %m64",
                "%odd = trunc i32 %gid to i1", "%p = select i1 %odd, ptr %pb, ptr %pa"])
    fill = [line for array in "ab" for line in (
        f"%{array}q = getelementptr inbounds [4 x float], ptr %{array}, i64 0, i64 %i",
        f"store float %f, ptr %{array}q")]
    total = [f"%{array}{k}p = getelementptr inbounds [4 x float], ptr %{array}, i64 0, i64 {k}" for array in "ab"
             for k in range(4)] + [f"%{array}{k} = load float, ptr %{array}{k}p" for array in "ab" for k in range(4)]
    total += ["%t0 = fadd float %a0, %a1"] + [f"%t{j + 1} = fadd float %t{j}, %{e}" for j, e in
                                              enumerate(["a2", "a3", "b0", "b1", "b2", "b3"])]
    body = (["%a = alloca [4 x float], align 4", "%b = alloca [4 x float], align 4", "%m = urem i32 %gid, 4",
             "%m64 = zext i32 %m to i64"] + pointer
            + ["br label %fill", "fill:", "%i = phi i64 [ 0, %entry ], [ %next, %fill ]", "%f = uitofp i64 %i to float"]
            + fill + ["%next = add i64 %i, 1", "%more = icmp ult i64 %next, 4", "br i1 %more, label %fill, label %done",
                      "done:", "%s = call float @air.simd_sum.f32(float 1.0) #2",
                      "%old = load float, ptr %p", "%new = fadd float %old, %s", "store float %new, ptr %p"]
            + total + ["%o = getelementptr float, ptr addrspace(1) %out, i64 %gid64",
                       "store float %t6, ptr addrspace(1) %o"])
    text = air.module_text("kept", body, [("out", "float", "air.read_write")],
                           ["declare float @air.simd_sum.f32(float) local_unnamed_addr #1"], collective=True)
    kernel = air.library("kept", text)["kept"]
    threads = 40  # a whole SIMD-group and a partial one
    out = torch.empty(threads)
    (lanes, coroutines), schemes = _both(kernel, [out], out, threads=threads, group_size=64)
    assert schemes == ["lanes", "coroutines"]
    lanes_in_group = torch.tensor([32.0] * 32 + [8.0] * 8)
    torch.testing.assert_close(lanes[0], 12 + lanes_in_group, rtol=0, atol=0)
    assert torch.equal(lanes[0], coroutines[0])


def test_row_sum_keeps_no_launch_value_across_its_waits(mlx_bytes, tmp_path, monkeypatch):
    """MLX's row sum: each region computes again what the entry block computed from the launch
    (the output's address, the SIMD-group count) and the lane's SIMD-group and lane index
    (recompute.py), and an exchange's buffer is the region's own, so the context keeps only
    what the threads computed (8 arrays, not 15 with the output's address and two 64-byte
    buffers among them); a SIMD-group's sum adds lane after lane with no select (a lane
    that did not take part adds -0.0)."""
    kernel, lanes = mlx_row_sum_lanes_ir(mlx_bytes, monkeypatch, tmp_path, 16, 3000, 768, seed=5)
    assert kernel.cpu_scheme == "lanes"
    context = re.search(r"^%tm\.ctx\.\w+ = type \{(.*)\}$", lanes, re.MULTILINE).group(1)
    assert "ptr" not in context and "[64 x i8]" not in context
    assert context.count(f"[{MAX_THREADS + ARRAY_SKEW} x ") == 8
    assert not re.search(r"%acc\d+\S* = select ", lanes)


def test_what_a_region_computes_again():
    """From the entry block: the launch's values (the runtime's arrays, constant buffers, a
    division of them) and short cheap chains of the thread's index; not device memory, nor a
    division per lane. From other blocks: launch values computed without a division or a load
    (they might trap where the block's guard does not hold)."""
    entry = ["%dp6 = getelementptr i8, ptr %dims, i64 24", "%groups.x = load i32, ptr %dp6, align 4",
             "%gx = urem i32 %g32, %groups.x",
             "%raw0 = load ptr, ptr %args, align 8", "%arg0 = addrspacecast ptr %raw0 to ptr addrspace(1)",
             "%slot1 = getelementptr i8, ptr %args, i64 8", "%raw1 = load ptr, ptr %slot1, align 8",
             "%arg1 = addrspacecast ptr %raw1 to ptr addrspace(2)",
             "%n = load i32, ptr addrspace(2) %arg1, align 4, !tbaa !3",
             "store i32 %n, ptr %n.reg2mem, align 4", "%n.reload = load i32, ptr %n.reg2mem, align 4",
             "%device = load i32, ptr addrspace(1) %arg0, align 4",
             "%lane = and i32 %t32, 31", "%lane4 = shl i32 %lane, 2", "%at = add i32 %lane4, %n.reload",
             "%too.long = add i32 %at, 1", "%tx = urem i32 %t32, %groups.x"]
    others = ["%q = udiv i32 100, %n", "%m = mul i32 %later, %gx", "%later = add i32 %n, 1",
              "%c = load i32, ptr addrspace(2) %arg1, align 4", "%p = phi i32 [ 0, %entry ], [ %m, %loop ]"]
    found = recomputable(entry, others)
    assert {name for name, value in found.items() if value.uniform} == {
        "%dp6", "%groups.x", "%gx", "%raw0", "%arg0", "%slot1", "%raw1", "%arg1", "%n", "%later", "%m"}
    assert {name for name, value in found.items() if not value.uniform} == {"%lane", "%lane4", "%at"}
    before, per_lane, renames = recompute(["%at"], found, ".again")
    assert before == ["  %slot1.again = getelementptr i8, ptr %args, i64 8",
                      "  %raw1.again = load ptr, ptr %slot1.again, align 8",
                      "  %arg1.again = addrspacecast ptr %raw1.again to ptr addrspace(2)",
                      "  %n.again = load i32, ptr addrspace(2) %arg1.again, align 4, !tbaa !3"]
    assert per_lane == ["  %lane.again = and i32 %t32, 31", "  %lane4.again = shl i32 %lane.again, 2",
                        "  %at.again = add i32 %lane4.again, %n.again"]
    assert renames["%at"] == "%at.again"

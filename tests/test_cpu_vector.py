"""Lane-loop regions run as vector lanes (backends/cpu/vectorize.py, TORCH_METALLIB_CPU_VECTORIZE).

Each kernel runs twice, from two loads of its library: as lane loops and with vector lanes
(the knob is read when a kernel compiles). The results must be the same bits, and match
torch as the lane loops do; the second call of each goes through the native launcher,
which names the scheme too. Apple-built MLX kernels of every cooperative family the lane
loops take, PyTorch's own (layer_norm_looped, radix_scan), and hand-written kernels for
what vector lanes must get right: divergent `if`s nested, loops whose trip count differs
per lane, an early return, a lane masked off dividing by zero, SIMD-group reductions inside
a region (signed zeros, NaNs, partial SIMD-groups), a loop only some lanes run, and the
regions that stay lane loops (an atomic, a call they do not take), named in the log.
"""

import logging
import re
import struct

import pytest
import torch

import _air_modules as air
import torch_metallib as tm
from _cooperative import MLX_ROW_GROUP, layer_norm_looped_kernel, mlx_row_sum_lanes_ir, radix_scan_kernel
from torch_metallib.backends.cpu.regions import KIND_BARRIER, KIND_START, KIND_WHOLE_GROUP
from torch_metallib.backends.cpu.vectorize import PREFETCH_LANES, WIDTH, vectorize_regions


def _schemes(make, monkeypatch, outputs, *args, **kwargs):
    """`outputs` after calls of a fresh kernel (``make()``) as lane loops and one with
    vector lanes, two calls each (the second through the native launcher), and the
    scheme each second call names."""
    results, schemes = [], []
    for vector in ("0", "1"):
        monkeypatch.setenv("TORCH_METALLIB_CPU_VECTORIZE", vector)
        kernel = make()
        for _ in range(2):
            for out in outputs:
                out.fill_(-7)
            kernel(*args, **kwargs)
        results.append([out.clone() for out in outputs])
        schemes.append(kernel.cpu_scheme)
    return results, schemes


def _identical(results):
    (lanes, vector) = results
    assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(lanes, vector))


@pytest.mark.parametrize("name,rows,size", [("block_softmax_float32", 7, 1000), ("block_softmax_float32", 3, 37),
                                            ("looped_softmax_float32", 3, 5000), ("block_softmax_float16", 5, 700),
                                            ("looped_logsumexp_float32", 3, 6000)])
def test_mlx_row_kernels_bit_identical(mlx_path, monkeypatch, name, rows, size):
    dtype = torch.float16 if name.endswith("16") else torch.float32
    x = torch.randn(rows, size, generator=torch.Generator().manual_seed(size)).to(dtype)
    out = torch.empty_like(x) if "softmax" in name else torch.empty(rows, dtype=dtype)
    group = MLX_ROW_GROUP
    results, schemes = _schemes(lambda: tm.load(mlx_path)[name], monkeypatch, [out], x, out, size,
                                threads=rows * group, group_size=group)
    assert schemes == ["lanes", "vector"]
    _identical(results)
    expected = torch.softmax(x.double(), -1) if "softmax" in name else torch.logsumexp(x.double(), -1)
    tolerance = 2e-3 if dtype == torch.float16 else 1e-5
    torch.testing.assert_close(results[1][0].double(), expected, atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("looped", [False, True])
def test_mlx_norms_bit_identical(mlx_path, monkeypatch, looped):
    rows, size = 5, 4096
    g = torch.Generator().manual_seed(4)
    x, w, b = torch.randn(rows, size, generator=g), torch.randn(size, generator=g), torch.randn(size, generator=g)
    out = torch.empty_like(x)
    group = 256 if looped else size // 4
    name = "layer_norm_loopedfloat32" if looped else "layer_normfloat32"
    results, schemes = _schemes(lambda: tm.load(mlx_path)[name], monkeypatch, [out], x, w, b, out, 1e-5, size, 1, 1,
                                threads=rows * group, group_size=group)
    assert schemes == ["lanes", "vector"]
    _identical(results)
    expected = torch.nn.functional.layer_norm(x.double(), (size,), w.double(), b.double(), 1e-5)
    assert (results[1][0].double() - expected).abs().max() <= 2e-5


def test_mlx_row_sum_and_scan_bit_identical(mlx_path, monkeypatch):
    rows, size = 16, 3000
    x = torch.randn(rows, size, generator=torch.Generator().manual_seed(5))
    out = torch.empty(rows)
    group = min(1024, -(-(size // 4) // 32) * 32)
    results, schemes = _schemes(lambda: tm.load(mlx_path)["row_reduce_simple_sumfloat32"], monkeypatch, [out],
                                x, out, size, rows, threads=(group, rows // 4, 1), group_size=group)
    assert schemes == ["lanes", "vector"]
    _identical(results)
    torch.testing.assert_close(results[1][0], x.double().sum(-1).float(), rtol=1e-5, atol=1e-4)

    rows, size = 3, 2500
    x = torch.randn(rows, size, generator=torch.Generator().manual_seed(9))
    out = torch.empty_like(x)
    results, schemes = _schemes(lambda: tm.load(mlx_path)["contig_scan_inclusive_sum_float32_float32"], monkeypatch,
                                [out], x, out, size, threads=(256, rows, 1), group_size=(256, 1, 1))
    _identical(results)
    torch.testing.assert_close(results[1][0], torch.cumsum(x.double(), -1).float(), rtol=1e-4, atol=1e-3)


def test_mlx_steel_gemm_bit_identical(mlx_path, monkeypatch):
    """simdgroup-matrix regions (vector values per lane) stay lane loops; the others do not."""
    m, n, k = 37, 45, 29
    bm, bn, bk, wm, wn = 32, 32, 16, 2, 2
    g = torch.Generator().manual_seed(m * n + k)
    a, b = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)
    d = torch.empty(m, n)
    tiles_n, tiles_m = -(-n // bn), -(-m // bm)
    params = struct.pack("<8i3q3i4x", m, n, k, k, n, n, tiles_n, tiles_m, m * k, k * n, m * n, 0, k // bk, 0)
    constants = {"has_batch": False, "use_out_source": False, "do_axpby": False,
                 "align_M": False, "align_N": False, "align_K": False}
    name = f"steel_gemm_fused_nn_float32_float32_bm{bm}_bn{bn}_bk{bk}_wm{wm}_wn{wn}"
    results, schemes = _schemes(lambda: tm.load(mlx_path)[name], monkeypatch, [d], a, b, d, params,
                                threads=(tiles_n * 32, tiles_m * wn, wm), group_size=(32, wn, wm), constants=constants)
    assert schemes == ["lanes", "vector"]
    _identical(results)
    torch.testing.assert_close(results[1][0].double(), a.double() @ b.double(), rtol=1e-4, atol=1e-3)


def test_pytorch_layer_norm_looped_and_radix_scan_bit_identical(monkeypatch):
    rows, size, group = 3, 1000, 256
    g = torch.Generator().manual_seed(11)
    x = torch.randn(rows, size, generator=g) * 2 + 0.5
    w, b = torch.randn(size, generator=g), torch.randn(size, generator=g)
    out, mean, rstd = torch.empty_like(x), torch.empty(rows), torch.empty(rows)
    results, schemes = _schemes(layer_norm_looped_kernel, monkeypatch, [out, mean, rstd], x, out, mean, rstd, size,
                                1e-5, 1, 1, w, b, threads=rows * group, group_size=group)
    assert schemes == ["lanes", "vector"]
    _identical(results)
    torch.testing.assert_close(results[1][0].double(), torch.nn.functional.layer_norm(
        x.double(), (size,), w.double(), b.double(), 1e-5), rtol=1e-5, atol=1e-5)

    counts = torch.randint(0, 1000, (2, 2560), generator=g, dtype=torch.int32)
    histograms = counts.clone()
    results, schemes = _schemes(radix_scan_kernel, monkeypatch, [histograms], histograms, 2560,
                                threads=(1024, 2, 1), group_size=(1024, 1, 1))
    # The scan runs in place: each call scans what the one before left, so only the two
    # schemes' results are compared (the lane loops' were checked against torch elsewhere).
    assert schemes == ["lanes", "vector"]
    _identical(results)


# --- hand-written kernels: divergence under masks -------------------------------------------

_SIMD_SUM = ["declare float @air.simd_sum.f32(float) local_unnamed_addr #1"]


def _kernel(name, body, arguments):
    return lambda: air.library(name, air.module_text(name, body, arguments, _SIMD_SUM, collective=True))[name]


def test_nested_ifs_loops_of_lane_trip_counts_and_early_return(monkeypatch):
    """Per lane: an early return (gid % 7 == 6); else a loop of gid % 5 iterations summing
    x, inside it an `if` on the element's sign nested in one on the iteration's parity; then
    a SIMD-group sum of what is left (the lanes that returned take no part)."""
    body = ["%r = urem i32 %gid, 7", "%early = icmp eq i32 %r, 6", "br i1 %early, label %out, label %start",
            "start:", "%n = urem i32 %gid, 5", "br label %head",
            "head:", "%i = phi i32 [ 0, %start ], [ %i1, %next ]", "%acc = phi float [ 0.0, %start ], [ %acc1, %next ]",
            "%more = icmp ult i32 %i, %n", "br i1 %more, label %body, label %done",
            "body:", "%j = add i32 %gid, %i", "%j64 = zext i32 %j to i64",
            "%xp = getelementptr float, ptr addrspace(1) %x, i64 %j64", "%v = load float, ptr addrspace(1) %xp",
            "%odd = and i32 %i, 1", "%isodd = icmp ne i32 %odd, 0", "br i1 %isodd, label %oddi, label %eveni",
            "oddi:", "%neg = fcmp olt float %v, 0.0", "br i1 %neg, label %flip, label %keep",
            "flip:", "%f = fneg float %v", "br label %join", "keep:", "%k = fmul float %v, 3.0", "br label %join",
            "eveni:", "%e = fadd float %v, 1.0", "br label %join",
            "join:", "%w = phi float [ %f, %flip ], [ %k, %keep ], [ %e, %eveni ]", "%acc1 = fadd float %acc, %w",
            "%i1 = add i32 %i, 1", "br label %next", "next:", "br label %head",
            "done:", "%s = call float @air.simd_sum.f32(float %acc) #2", "%t = fadd float %s, %acc",
            "%op = getelementptr float, ptr addrspace(1) %y, i64 %gid64", "store float %t, ptr addrspace(1) %op",
            "br label %out", "out:"]
    threads = 75  # two whole SIMD-groups and a partial one
    x = torch.randn(threads + 8, generator=torch.Generator().manual_seed(3))
    y = torch.empty(threads)
    make = _kernel("divergent", body, [("x", "float", "air.read"), ("y", "float", "air.read_write")])
    results, schemes = _schemes(make, monkeypatch, [y], x, y, threads=threads, group_size=96)
    assert schemes == ["lanes", "vector"]
    _identical(results)
    acc = torch.zeros(threads)
    for t in range(threads):
        for i in range(t % 5):
            v = x[t + i]
            acc[t] += v + 1 if i % 2 == 0 else (-v if v < 0 else v * 3)
    returned = torch.arange(threads) % 7 == 6
    sums = torch.cat([acc[s:s + 32].masked_fill(returned[s:s + 32], 0).sum().expand(len(acc[s:s + 32]))
                      for s in range(0, threads, 32)])
    expected = torch.where(returned, torch.tensor(-7.0), sums + acc)
    torch.testing.assert_close(results[1][0], expected, rtol=1e-5, atol=1e-5)


def test_masked_off_lanes_do_not_divide(monkeypatch):
    """An integer division only the lanes with a nonzero divisor run: the lanes masked off
    (divisor 0) must not trap (x86 faults on a division by zero)."""
    body = ["%dp = getelementptr i32, ptr addrspace(1) %d, i64 %gid64", "%dv = load i32, ptr addrspace(1) %dp",
            "%zero = icmp eq i32 %dv, 0", "br i1 %zero, label %skip, label %divide",
            "divide:", "%q = sdiv i32 1000, %dv", "br label %skip",
            "skip:", "%r = phi i32 [ -1, %entry ], [ %q, %divide ]", "%rf = sitofp i32 %r to float",
            "%s = call float @air.simd_sum.f32(float %rf) #2", "%sum = fptosi float %s to i32", "%both = add i32 %sum, %r",
            "%op = getelementptr i32, ptr addrspace(1) %out, i64 %gid64", "store i32 %both, ptr addrspace(1) %op"]
    threads = 40
    divisors = torch.tensor([0 if t % 3 == 0 else t - 20 for t in range(threads)], dtype=torch.int32)
    out = torch.empty(threads, dtype=torch.int32)
    make = _kernel("divide", body, [("d", "i32", "air.read"), ("out", "i32", "air.read_write")])
    results, schemes = _schemes(make, monkeypatch, [out], divisors, out, threads=threads, group_size=64)
    assert schemes == ["lanes", "vector"]
    _identical(results)
    r = torch.tensor([-1 if d == 0 else int(1000 / d) for d in divisors.tolist()], dtype=torch.int32)
    sums = torch.cat([r[s:s + 32].sum().expand(len(r[s:s + 32])) for s in range(0, threads, 32)])
    assert torch.equal(results[1][0], (sums + r).int())


def test_uniform_values_stay_scalar_and_atomics_stay_lane_loops(monkeypatch, caplog):
    """A branch on a uniform value picks one block for every lane (a scalar select of the
    target); a region with an atomic stays a lane loop (said at debug level), the others
    are vector lanes, and the results are the lane loops'."""
    body = ["%cp = getelementptr i32, ptr addrspace(1) %c, i64 0", "%cv = load i32, ptr addrspace(1) %cp",
            "%big = icmp sgt i32 %cv, 10", "br i1 %big, label %a, label %b",
            "a:", "%va = add i32 %gid, 100", "br label %j", "b:", "%vb = mul i32 %gid, 2", "br label %j",
            "j:", "%v = phi i32 [ %va, %a ], [ %vb, %b ]", "%vf = sitofp i32 %v to float",
            "%s = call float @air.simd_sum.f32(float %vf) #2",
            "%old = atomicrmw add ptr addrspace(1) %c, i32 0 monotonic, align 4",
            "%si = fptosi float %s to i32", "%op = getelementptr i32, ptr addrspace(1) %out, i64 %gid64",
            "store i32 %si, ptr addrspace(1) %op"]
    threads = 64
    control = torch.tensor([11], dtype=torch.int32)
    out = torch.empty(threads, dtype=torch.int32)
    make = _kernel("uniform", body, [("c", "i32", "air.read_write"), ("out", "i32", "air.read_write")])
    monkeypatch.setenv("TORCH_METALLIB_LOG", "debug")
    monkeypatch.setenv("TORCH_METALLIB_CACHE", "0")
    with caplog.at_level(logging.DEBUG, logger="torch_metallib"):
        results, schemes = _schemes(make, monkeypatch, [out], control, out, threads=threads, group_size=64)
    assert schemes == ["lanes", "vector"]
    _identical(results)
    v = torch.arange(threads) + 100
    assert torch.equal(results[1][0], torch.cat([v[:32].sum().expand(32), v[32:].sum().expand(32)]).int())
    assert any("stays a lane loop: atomicrmw" in record.getMessage() for record in caplog.records)


@pytest.mark.parametrize("control", [0, 11])
def test_a_uniform_branch_into_blocks_lanes_may_run_apart(monkeypatch, control):
    """A uniform branch (on a value read from a buffer) to a block that a divergent branch
    reaches too, in a part without convergent copies (no loop): the lanes enter the part
    there by their counters. Every lane takes it (control 11), or only lanes above 40 reach
    it through the divergent branch (control 0); then a SIMD-group sum."""
    body = ["%cp = getelementptr i32, ptr addrspace(1) %c, i64 0", "%cv = load i32, ptr addrspace(1) %cp",
            "%uc = icmp sgt i32 %cv, 10", "br i1 %uc, label %b, label %a",
            "a:", "%vc = icmp ugt i32 %gid, 40", "br i1 %vc, label %b, label %j",
            "b:", "%vb = mul i32 %gid, 3", "br label %j",
            "j:", "%v = phi i32 [ %vb, %b ], [ %gid, %a ]", "%vf = sitofp i32 %v to float",
            "%s = call float @air.simd_sum.f32(float %vf) #2", "%t = fadd float %s, %vf", "%ti = fptosi float %t to i32",
            "%op = getelementptr i32, ptr addrspace(1) %out, i64 %gid64", "store i32 %ti, ptr addrspace(1) %op"]
    threads = 80
    out = torch.empty(threads, dtype=torch.int32)
    make = _kernel("entered", body, [("c", "i32", "air.read"), ("out", "i32", "air.read_write")])
    results, schemes = _schemes(make, monkeypatch, [out], torch.tensor([control], dtype=torch.int32), out,
                                threads=threads, group_size=96)
    assert schemes == ["lanes", "vector"]
    _identical(results)
    gid = torch.arange(threads)
    v = torch.where((gid > 40) | (control > 10), 3 * gid, gid)
    sums = torch.cat([v[s:s + 32].sum().expand(len(v[s:s + 32])) for s in range(0, threads, 32)])
    assert torch.equal(results[1][0], (sums + v).int())


def test_uniform_branch_stays_a_branch():
    """In the vectorized IR a branch on a uniform condition stays a branch (every lane takes
    the same edge); one on a varying condition sets each lane's next block (a select per
    lane) and the lanes run the blocks after it under masks."""
    region = ["define internal void @tm.region.0(ptr noalias %ctx, ptr %args, ptr %dims, i32 %g32, i32 %tm.begin, "
              "i32 %tm.end, ptr noalias %tm.points) {", "tm.rentry:", "  %u = load i32, ptr %dims, align 4",
              "  br label %tm.loop", "tm.loop:", "  %t32 = phi i32 [ %tm.begin, %tm.rentry ], [ %tm.next, %tm.latch ]",
              "  %tm.pt = getelementptr inbounds i32, ptr %tm.points, i32 %t32", "  br label %entry",
              "entry:", "  %uc = icmp ugt i32 %u, 3", "  br i1 %uc, label %a, label %b",
              "a:", "  %vc = icmp ugt i32 %t32, 3", "  br i1 %vc, label %b, label %c",
              "b:", "  br label %c", "c:", "  store i32 -1, ptr %tm.pt, align 4", "  br label %tm.latch",
              "tm.latch:", "  %tm.next = add nuw i32 %t32, 1", "  %tm.more = icmp ult i32 %tm.next, %tm.end",
              "  br i1 %tm.more, label %tm.loop, label %tm.exit", "tm.exit:", "  ret void", "}"]
    text, vectorized, refused = vectorize_regions("\n".join(region))
    assert vectorized == ["tm.region.0"] and not refused
    assert "  br i1 %uc, label %a, label %" in text
    assert f"= select <{WIDTH} x i1> %vc, <{WIDTH} x i32> " in text and "br i1 %vc" not in text


@pytest.mark.parametrize("failure", ["raises", "invalid IR"])
def test_a_failing_rewrite_falls_back_to_lane_loops(monkeypatch, failure):
    """If the rewrite fails (a bug: an exception, or IR LLVM refuses), the kernel compiles
    as lane loops, with a warning naming it, and computes what lane loops compute."""
    import torch_metallib.backends.cpu.vectorize as vectorize
    from torch_metallib.backends.cpu import jit

    def broken(text):
        if failure == "raises":
            raise KeyError("%unknown")
        return text + "\nthis is not IR\n", ["tm.region.0"], {}
    monkeypatch.setattr(vectorize, "vectorize_regions", broken)
    monkeypatch.setattr(jit, "_compiled", {})  # compiled again in this process
    monkeypatch.setenv("TORCH_METALLIB_CACHE", "0")
    monkeypatch.setenv("TORCH_METALLIB_CPU_VECTORIZE", "1")
    kernel = layer_norm_looped_kernel()
    rows, size, group = 2, 300, 64
    x = torch.randn(rows, size, generator=torch.Generator().manual_seed(1))
    w, b = torch.ones(size), torch.zeros(size)
    out, mean, rstd = torch.empty_like(x), torch.empty(rows), torch.empty(rows)
    with pytest.warns(RuntimeWarning, match="layer_norm_looped: vector lanes failed"):
        kernel(x, out, mean, rstd, size, 1e-5, 1, 1, w, b, threads=rows * group, group_size=group)
    assert kernel.cpu_scheme == "lanes"
    torch.testing.assert_close(out, torch.nn.functional.layer_norm(x, (size,), eps=1e-5), rtol=1e-5, atol=1e-5)
def test_row_addresses_kept_in_a_private_array_are_read_wide_and_checked_once():
    """Lanes that each read a few consecutive floats of a row through an address kept in a
    private array (MLX's row reductions): the address's stride between lanes is guessed
    through the array, so the loads are wide masked loads (every 4th element), not gathers;
    the address one element further takes its check, and addresses of an element of an
    interleaved private array need none: two checks at run time (that address, the output's).
    The array's element is read and written for every lane as one vector."""
    region = ["define internal void @tm.region.0(ptr noalias %ctx, ptr %args, ptr %dims, i32 %g32, i32 %tm.begin, "
              "i32 %tm.end, ptr noalias %tm.points) {", "tm.rentry:", "  %rows = alloca [2 x ptr addrspace(1)], align 8",
              "  %raw = load ptr, ptr %args, align 8", "  %base = addrspacecast ptr %raw to ptr addrspace(1)",
              "  %rawout = getelementptr i8, ptr %args, i64 8", "  %outp = load ptr, ptr %rawout, align 8",
              "  %out = addrspacecast ptr %outp to ptr addrspace(1)", "  br label %tm.loop", "tm.loop:",
              "  %t32 = phi i32 [ %tm.begin, %tm.rentry ], [ %tm.next, %tm.latch ]",
              "  %tm.pt = getelementptr inbounds i32, ptr %tm.points, i32 %t32", "  br label %entry", "entry:",
              "  %col = shl i32 %t32, 2", "  %col64 = zext i32 %col to i64",
              "  %row0 = getelementptr inbounds float, ptr addrspace(1) %base, i64 %col64",
              "  %at0 = getelementptr inbounds [2 x ptr addrspace(1)], ptr %rows, i64 0, i64 0",
              "  store ptr addrspace(1) %row0, ptr %at0, align 8",
              "  %row1 = getelementptr inbounds float, ptr addrspace(1) %row0, i64 4096",
              "  %at1 = getelementptr inbounds [2 x ptr addrspace(1)], ptr %rows, i64 0, i64 1",
              "  store ptr addrspace(1) %row1, ptr %at1, align 8", "  %r1 = load ptr addrspace(1), ptr %at1, align 8",
              "  %x0 = load float, ptr addrspace(1) %r1, align 4",
              "  %p1 = getelementptr inbounds float, ptr addrspace(1) %r1, i64 1",
              "  %x1 = load float, ptr addrspace(1) %p1, align 4", "  %sum = fadd float %x0, %x1",
              "  %t64 = zext i32 %t32 to i64", "  %o = getelementptr inbounds float, ptr addrspace(1) %out, i64 %t64",
              "  store float %sum, ptr addrspace(1) %o, align 4", "  store i32 -1, ptr %tm.pt, align 4",
              "  br label %tm.latch", "tm.latch:", "  %tm.next = add nuw i32 %t32, 1",
              "  %tm.more = icmp ult i32 %tm.next, %tm.end", "  br i1 %tm.more, label %tm.loop, label %tm.exit",
              "tm.exit:", "  ret void", "}"]
    text, vectorized, refused = vectorize_regions("\n".join(region))
    assert vectorized == ["tm.region.0"] and not refused
    assert text.count(f"call <{4 * WIDTH} x float> @llvm.masked.load.v{4 * WIDTH}f32.p1(") == 2
    assert text.count(f"call i1 @llvm.vector.reduce.and.v{WIDTH}i1(") == 2
    # The array's element of every lane is one plain vector (LLVM keeps it in registers).
    assert f"  %r1 = load <{WIDTH} x ptr addrspace(1)>, ptr " in text


def test_a_position_kept_in_the_context_grows_as_the_region_that_stored_it_guessed():
    """A thread's position stored in the context by one region (x = index % width) and read
    back by the next grows by one from lane to lane there too, so the next region's lanes,
    reading 4 floats each from 4 x, read every 4th element of a wide load (checked at run
    time) where a consecutive guess had it (a gather after a failed check)."""
    def region(number, body):
        return ["define internal void @tm.region.%d(ptr noalias %%ctx, ptr %%args, ptr %%dims, i32 %%g32, "
                "i32 %%tm.begin, i32 %%tm.end, ptr noalias %%tm.points) {" % number, "tm.rentry:",
                "  %w = load i32, ptr %dims, align 4", "  %raw = load ptr, ptr %args, align 8",
                "  %x = addrspacecast ptr %raw to ptr addrspace(1)", "  br label %tm.loop", "tm.loop:",
                "  %t32 = phi i32 [ %tm.begin, %tm.rentry ], [ %tm.next, %tm.latch ]",
                "  %tm.pt = getelementptr inbounds i32, ptr %tm.points, i32 %t32",
                "  %txp = getelementptr inbounds %tm.ctx.k, ptr %ctx, i32 0, i32 1, i32 %t32", "  br label %entry",
                "entry:"] + body + [
                "  store i32 %d, ptr %%tm.pt, align 4" % (number + 1), "  br label %tm.latch", "tm.latch:",
                "  %tm.next = add nuw i32 %t32, 1", "  %tm.more = icmp ult i32 %tm.next, %tm.end",
                "  br i1 %tm.more, label %tm.loop, label %tm.exit", "tm.exit:", "  ret void", "}"]
    module = ["%tm.ctx.k = type { [1024 x { float, [0 x i32] }], [1024 x { i32, [0 x i32] }] }"] + region(0, [
        "  %tx = urem i32 %t32, %w", "  store i32 %tx, ptr %txp, align 4"]) + region(1, [
        "  %tx = load i32, ptr %txp, align 4", "  %i = shl i32 %tx, 2", "  %i64 = zext i32 %i to i64",
        "  %p = getelementptr inbounds float, ptr addrspace(1) %x, i64 %i64",
        "  %v = load float, ptr addrspace(1) %p, align 4", "  %o = getelementptr inbounds float, ptr %ctx, i32 %t32",
        "  store float %v, ptr %o, align 4"])
    text, vectorized, refused = vectorize_regions("\n".join(module))
    assert vectorized == ["tm.region.0", "tm.region.1"] and not refused
    assert text.count(f"call <{4 * WIDTH} x float> @llvm.masked.load.v{4 * WIDTH}f32.p1(") == 1
    assert f"call <{WIDTH} x float> @llvm.masked.load.v{WIDTH}f32.p1(" not in text


def test_a_deposit_copies_lanes_values_as_vector_accesses():
    """A lane's deposit into its exchange slot (a memcpy of 4 bytes, regions.py) is one
    integer store of every lane under the mask (a scatter: the slots are 64 bytes apart),
    not a call and a branch per lane, of the vector the block stored just before."""
    region = ["define internal void @tm.region.0(ptr noalias %ctx, ptr %args, ptr %dims, i32 %g32, i32 %tm.begin, "
              "i32 %tm.end, ptr noalias %tm.points) {", "tm.rentry:", "  %buf = alloca [64 x i8], align 16",
              "  br label %tm.loop", "tm.loop:", "  %t32 = phi i32 [ %tm.begin, %tm.rentry ], [ %tm.next, %tm.latch ]",
              "  %tm.pt = getelementptr inbounds i32, ptr %tm.points, i32 %t32", "  br label %entry", "entry:",
              "  %f = uitofp i32 %t32 to float", "  store float %f, ptr %buf, align 4", "  %lane = and i32 %t32, 31",
              "  %slot = getelementptr inbounds [32 x [64 x i8]], ptr %ctx, i32 0, i32 %lane",
              "  call void @llvm.memcpy.p0.p0.i64(ptr align 4 %slot, ptr align 4 %buf, i64 4, i1 false)",
              "  store i32 1, ptr %tm.pt, align 4", "  br label %tm.latch", "tm.latch:", "  %tm.next = add nuw i32 %t32, 1",
              "  %tm.more = icmp ult i32 %tm.next, %tm.end", "  br i1 %tm.more, label %tm.loop, label %tm.exit",
              "tm.exit:", "  ret void", "}", "declare void @llvm.memcpy.p0.p0.i64(ptr, ptr, i64, i1)"]
    text, vectorized, refused = vectorize_regions("\n".join(region))
    assert vectorized == ["tm.region.0"] and not refused
    assert "call void @llvm.memcpy" not in text
    assert f" = bitcast <{WIDTH} x float> %f to <{WIDTH} x i32>" in text  # what was just stored, not read back
    assert f"@llvm.masked.gather.v{WIDTH}i32" not in text
    assert f"call void @llvm.masked.scatter.v{WIDTH}i32.v{WIDTH}p0(<{WIDTH} x i32> " in text


def _agreeing_loop_region(bound="%n"):
    """A region in reg2mem's form: lanes below 5 run a loop of `bound` iterations (a
    uniform value read from the launch, or a constant; its counter in %j.slot), the others
    skip it (a divergent `if` around a loop every lane in it runs alike)."""
    return ["define internal void @tm.region.0(ptr noalias %ctx, ptr %args, ptr %dims, i32 %g32, i32 %tm.begin, "
            "i32 %tm.end, ptr noalias %tm.points) {", "tm.rentry:", "  %j.slot = alloca i32, align 4",
            "  %n = load i32, ptr %dims, align 4", "  br label %tm.loop", "tm.loop:", "  %t32 = phi i32 [ %tm.begin, %tm.rentry ], [ %tm.next, %tm.latch ]",
            "  %tm.pt = getelementptr inbounds i32, ptr %tm.points, i32 %t32", "  br label %entry", "entry:",
            "  %few = icmp ult i32 %t32, 5", "  br i1 %few, label %pre, label %done", "pre:",
            "  store i32 0, ptr %j.slot, align 4", "  br label %head", "head:", "  %j = load i32, ptr %j.slot, align 4",
            "  %jn = add i32 %j, 1", "  store i32 %jn, ptr %j.slot, align 4", f"  %more = icmp ult i32 %jn, {bound}",
            "  br i1 %more, label %head, label %done", "done:", "  store i32 -1, ptr %tm.pt, align 4",
            "  br label %tm.latch", "tm.latch:", "  %tm.next = add nuw i32 %t32, 1",
            "  %tm.more = icmp ult i32 %tm.next, %tm.end", "  br i1 %tm.more, label %tm.loop, label %tm.exit",
            "tm.exit:", "  ret void", "}"]


@pytest.mark.parametrize("bound", ["%n", "4", "16"])
def test_a_loop_counter_lanes_agree_on_is_a_scalar_where_they_run_together(bound):
    """In a divergent part's convergent copy (its lanes agreed at every branch since they
    entered it) a value stored only there, only from values alike, and read only after the
    part wrote it is one scalar: the loop's branch is a branch, no agreement checked. Every
    part holding a loop has the copy, a short one (a thread's 4 reads) too."""
    text, vectorized, refused = vectorize_regions("\n".join(_agreeing_loop_region(bound)))
    assert vectorized == ["tm.region.0"] and not refused
    assert "  %j.slot.u = alloca i32" in text
    assert "  %u.j = load i32, ptr %j.slot.u" in text
    assert "  br i1 %u.more, label %head.u, label %done" in text


def test_lanes_going_apart_inside_a_loop_they_agreed_on(monkeypatch):
    """Lanes above 40 run a loop of 4 over their elements, the others skip it; inside, an
    `if` on the element's sign, where lanes agree except at two elements: there they go
    apart with the loop's counter and sum so far (kept as scalars while they agreed); then
    a SIMD-group sum of every lane's result."""
    body = ["%big = icmp ugt i32 %gid, 40", "br i1 %big, label %start, label %skip",
            "start:", "br label %head",
            "head:", "%i = phi i32 [ 0, %start ], [ %i1, %next ]", "%acc = phi float [ 0.0, %start ], [ %acc1, %next ]",
            "%k = mul i32 %gid, 4", "%j = add i32 %k, %i", "%j64 = zext i32 %j to i64",
            "%xp = getelementptr float, ptr addrspace(1) %x, i64 %j64", "%v = load float, ptr addrspace(1) %xp",
            "%pos = fcmp ogt float %v, 0.0", "br i1 %pos, label %plus, label %minus",
            "plus:", "%a = fadd float %acc, %v", "br label %next",
            "minus:", "%b = fmul float %v, 2.0", "%c = fsub float %acc, %b", "br label %next",
            "next:", "%acc1 = phi float [ %a, %plus ], [ %c, %minus ]", "%i1 = add i32 %i, 1",
            "%more = icmp ult i32 %i1, 4", "br i1 %more, label %head, label %done",
            "skip:", "br label %merge", "done:", "br label %merge",
            "merge:", "%r = phi float [ -1.0, %skip ], [ %acc1, %done ]",
            "%s = call float @air.simd_sum.f32(float %r) #2", "%t = fadd float %s, %r",
            "%op = getelementptr float, ptr addrspace(1) %y, i64 %gid64", "store float %t, ptr addrspace(1) %op",
            "br label %out", "out:"]
    threads = 96
    x = torch.rand(4 * threads, generator=torch.Generator().manual_seed(4)) + 0.25
    x[4 * 70 + 2], x[4 * 50 + 1] = -1.5, -0.75  # lanes that go their own way mid-loop
    y = torch.empty(threads)
    make = _kernel("agreeing", body, [("x", "float", "air.read"), ("y", "float", "air.read_write")])
    results, schemes = _schemes(make, monkeypatch, [y], x, y, threads=threads, group_size=96)
    assert schemes == ["lanes", "vector"]
    _identical(results)
    v = x.view(threads, 4).double()
    r = torch.where(torch.arange(threads) > 40, torch.where(v > 0, v, -2 * v).sum(1), torch.tensor(-1.0).double())
    expected = torch.cat([r[s:s + 32].sum().expand(32) for s in range(0, threads, 32)]) + r
    torch.testing.assert_close(results[1][0], expected.float(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("group", [(6, 8), (24, 2), (40, 3)])
def test_thread_positions_from_the_index_in_a_two_dimensional_group(monkeypatch, group):
    """A lane's position along x is its thread index modulo the group's width: for a width
    below WIDTH a division per lane, else the first lane's quotient and remainder and the
    lanes after it passing the width at most once. Every thread adds its SIMD-group's sum
    of positions to its own and stores it at its position (threads of one x store in
    order: the last row's value stays)."""
    body = ["%g = uitofp i32 %gid to float", "%s = call float @air.simd_sum.f32(float %g) #2",
            "%t = fmul float %s, 1000.0", "%v = fadd float %t, %g",
            "%op = getelementptr float, ptr addrspace(1) %out, i64 %gid64", "store float %v, ptr addrspace(1) %op"]
    width, rows = group
    out = torch.empty(width)
    make = _kernel("positions", body, [("out", "float", "air.read_write")])
    results, schemes = _schemes(make, monkeypatch, [out], out, threads=(width, rows, 1), group_size=(width, rows, 1))
    assert schemes == ["lanes", "vector"]
    _identical(results)
    x = torch.arange(width * rows) % width
    sums = torch.cat([x[s:s + 32].sum().expand(len(x[s:s + 32])) for s in range(0, width * rows, 32)])
    last = (width * (rows - 1)) + torch.arange(width)
    assert torch.equal(results[1][0], (sums[last] * 1000 + x[last]).float())


def test_the_thread_index_divided_by_a_uniform_width_is_divided_once():
    """The lanes' positions from their thread index: one scalar division (the first lane's)
    where the width is at least WIDTH, a vector division (per lane) only below it."""
    region = ["define internal void @tm.region.0(ptr noalias %ctx, ptr %args, ptr %dims, i32 %g32, i32 %tm.begin, "
              "i32 %tm.end, ptr noalias %tm.points) {", "tm.rentry:", "  %w = load i32, ptr %dims, align 4",
              "  br label %tm.loop", "tm.loop:", "  %t32 = phi i32 [ %tm.begin, %tm.rentry ], [ %tm.next, %tm.latch ]",
              "  %tm.pt = getelementptr inbounds i32, ptr %tm.points, i32 %t32", "  br label %entry", "entry:",
              "  %x = urem i32 %t32, %w", "  %y = udiv i32 %t32, %w", "  %xy = add i32 %x, %y",
              "  store i32 %xy, ptr %tm.pt, align 4", "  br label %tm.latch", "tm.latch:",
              "  %tm.next = add nuw i32 %t32, 1", "  %tm.more = icmp ult i32 %tm.next, %tm.end",
              "  br i1 %tm.more, label %tm.loop, label %tm.exit", "tm.exit:", "  ret void", "}"]
    text, vectorized, refused = vectorize_regions("\n".join(region))
    assert vectorized == ["tm.region.0"] and not refused
    for code in ("urem", "udiv"):
        assert text.count(f" = {code} i32 %tm.v0, ") == 2  # the first lane's quotient and remainder, for each
        assert text.count(f" = {code} <{WIDTH} x i32> %t32, ") == 1  # below WIDTH only


def test_wide_device_accesses_ask_for_the_lines_of_lanes_two_simd_groups_on():
    """Lanes reading 4 consecutive floats each (a wide load, every 4th element) and writing
    one float each (a consecutive store) of device memory prefetch, per line of what they
    access, the lines the lanes PREFETCH_LANES threads on will access (read, then write);
    threadgroup memory and the context get none."""
    region = ["define internal void @tm.region.0(ptr noalias %ctx, ptr %args, ptr %dims, i32 %g32, i32 %tm.begin, "
              "i32 %tm.end, ptr noalias %tm.points) {", "tm.rentry:", "  %raw = load ptr, ptr %args, align 8",
              "  %x = addrspacecast ptr %raw to ptr addrspace(1)", "  %rawout = getelementptr i8, ptr %args, i64 8",
              "  %outp = load ptr, ptr %rawout, align 8", "  %out = addrspacecast ptr %outp to ptr addrspace(1)",
              "  br label %tm.loop", "tm.loop:", "  %t32 = phi i32 [ %tm.begin, %tm.rentry ], [ %tm.next, %tm.latch ]",
              "  %tm.pt = getelementptr inbounds i32, ptr %tm.points, i32 %t32", "  br label %entry", "entry:",
              "  %i = shl i32 %t32, 2", "  %i64 = zext i32 %i to i64",
              "  %p = getelementptr inbounds float, ptr addrspace(1) %x, i64 %i64",
              "  %v = load float, ptr addrspace(1) %p, align 4",
              "  %s = getelementptr inbounds [1024 x float], ptr addrspace(3) @shared, i32 0, i32 %t32",
              "  %w = load float, ptr addrspace(3) %s, align 4", "  %sum = fadd float %v, %w",
              "  %t64 = zext i32 %t32 to i64", "  %o = getelementptr inbounds float, ptr addrspace(1) %out, i64 %t64",
              "  store float %sum, ptr addrspace(1) %o, align 4",
              "  %c = getelementptr inbounds float, ptr %ctx, i32 %t32", "  store float %sum, ptr %c, align 4",
              "  store i32 -1, ptr %tm.pt, align 4", "  br label %tm.latch", "tm.latch:",
              "  %tm.next = add nuw i32 %t32, 1", "  %tm.more = icmp ult i32 %tm.next, %tm.end",
              "  br i1 %tm.more, label %tm.loop, label %tm.exit", "tm.exit:", "  ret void", "}",
              "@shared = internal addrspace(3) global [1024 x float] undef, align 4"]
    text, vectorized, refused = vectorize_regions("\n".join(region))
    assert vectorized == ["tm.region.0"] and not refused
    assert f"call <{4 * WIDTH} x float> @llvm.masked.load.v{4 * WIDTH}f32.p1(" in text
    assert f"call <{WIDTH} x float> @llvm.masked.load.v{WIDTH}f32.p3(" in text  # wide, not prefetched
    assert f"call void @llvm.masked.store.v{WIDTH}f32.p0(" in text
    read_span, write_span = 4 * WIDTH * 4, WIDTH * 4  # bytes the lanes read and write
    offsets = {}
    for line in text.split("\n"):
        if " = getelementptr i8, ptr addrspace(1) " in line and ".pre." in line.split(" = ")[0]:
            offsets[line.split(" = ")[0].strip()] = int(line.rsplit("i64 ", 1)[1])
    prefetches = [(offsets[line.split("(ptr addrspace(1) ")[1].split(",")[0]], int(line.split(", i32 ")[1]))
                  for line in text.split("\n") if "call void @llvm.prefetch." in line]
    ahead = PREFETCH_LANES // WIDTH
    assert prefetches == ([(read_span * ahead + line, 0) for line in range(0, read_span, 64)]
                          + [(write_span * ahead + line, 1) for line in range(0, write_span, 64)])
    assert PREFETCH_LANES == 2 * 32
    assert "declare void @llvm.prefetch.p1(ptr addrspace(1), i32, i32, i32)" in text


@pytest.mark.parametrize("read_again", [False, True])
def test_a_deposit_buffer_only_copied_right_after_its_store_is_not_written(read_again):
    """A deposit's buffer (a private allocation stored to, then copied into the exchange slot
    right after) needs no scatter into the lanes' copies: the copy takes the stored vector.
    Where the buffer is also read otherwise, the store stays (a scatter: copies 64 bytes apart)."""
    again = ["  %back = load float, ptr %buf, align 4", "  %o = getelementptr inbounds float, ptr %ctx, i32 %t32",
             "  store float %back, ptr %o, align 4"] if read_again else []
    region = ["define internal void @tm.region.0(ptr noalias %ctx, ptr %args, ptr %dims, i32 %g32, i32 %tm.begin, "
              "i32 %tm.end, ptr noalias %tm.points) {", "tm.rentry:", "  %buf = alloca [64 x i8], align 16",
              "  br label %tm.loop", "tm.loop:", "  %t32 = phi i32 [ %tm.begin, %tm.rentry ], [ %tm.next, %tm.latch ]",
              "  %tm.pt = getelementptr inbounds i32, ptr %tm.points, i32 %t32", "  br label %entry", "entry:",
              "  %f = uitofp i32 %t32 to float", "  %lane = and i32 %t32, 31", "  store float %f, ptr %buf, align 4",
              "  %slot = getelementptr inbounds [32 x [64 x i8]], ptr %ctx, i32 0, i32 %lane",
              "  call void @llvm.memcpy.p0.p0.i64(ptr align 4 %slot, ptr align 4 nonnull %buf, i64 4, i1 false)"
              ] + again + [
              "  store i32 1, ptr %tm.pt, align 4", "  br label %tm.latch", "tm.latch:", "  %tm.next = add nuw i32 %t32, 1",
              "  %tm.more = icmp ult i32 %tm.next, %tm.end", "  br i1 %tm.more, label %tm.loop, label %tm.exit",
              "tm.exit:", "  ret void", "}", "declare void @llvm.memcpy.p0.p0.i64(ptr, ptr, i64, i1)"]
    text, vectorized, refused = vectorize_regions("\n".join(region))
    assert vectorized == ["tm.region.0"] and not refused
    assert f" = bitcast <{WIDTH} x float> %f to <{WIDTH} x i32>" in text
    assert f"call void @llvm.masked.scatter.v{WIDTH}i32.v{WIDTH}p0(<{WIDTH} x i32> " in text
    assert (f"call void @llvm.masked.scatter.v{WIDTH}f32.v{WIDTH}p0(<{WIDTH} x float> %f, " in text) == read_again


def _special_floats(threads: int) -> torch.Tensor:
    """Per SIMD-group: ordinary values; negatives among zeros of alternating sign (a maximum
    that is a zero, whose sign the order decides); ordinary values with NaNs of two
    payloads; positives among zeros of alternating sign and an infinity (a minimum that
    is a zero); then again."""
    g = torch.Generator().manual_seed(5)
    lanes = torch.arange(32)
    zeros = torch.where((lanes // 3) % 2 == 0, torch.tensor(0.0), torch.tensor(-0.0))
    groups = [torch.randn(32, generator=g), torch.where(lanes % 3 == 0, zeros, -torch.rand(32, generator=g) - 1),
              torch.randn(32, generator=g), torch.where(lanes % 3 == 1, zeros, torch.rand(32, generator=g) + 1)]
    groups[3][30] = float("inf")
    x = torch.cat(groups * (threads // 128 + 1))[:threads].contiguous()
    bits = x.view(torch.int32)
    bits[64 + 3], bits[64 + 9] = 0x7FC00001, 0x7FC00002  # NaNs in the third group
    return x


@pytest.mark.parametrize("threads,group", [(128, 64), (80, 40)])  # whole SIMD-groups, and partial ones
@pytest.mark.parametrize("intrinsic,type_name", [
    ("air.simd_max.f32", "float"), ("air.simd_min.f32", "float"), ("air.simd_sum.f32", "float"),
    ("air.simd_product.f32", "float"), ("air.simd_max.s.i32", "i32"), ("air.simd_min.u.i32", "i32"),
    ("air.simd_sum.s.i32", "i32"), ("air.simd_product.s.i32", "i32"), ("air.simd_xor.s.i32", "i32"),
    ("air.simd_max.f16", "half"), ("air.simd_min.f16", "half")])
def test_simd_reductions_inside_a_region_give_the_lane_loops_bits(monkeypatch, intrinsic, type_name, threads, group):
    """Vector lanes run a SIMD-group's exchange inside a region and reduce the deposited
    vector in registers where the order cannot change the result (integers; a float
    minimum or maximum without a NaN or a zero), a float sum or product of 32 lanes in the
    fold's butterfly, else through the slots: the lane loops' bits for signed zeros, NaN
    payloads and infinities, over whole and partial SIMD-groups."""
    if type_name in ("float", "half") and ("max" in intrinsic or "min" in intrinsic):
        x = _special_floats(threads).to(torch.half if type_name == "half" else torch.float)
    elif type_name == "float":  # values whose sums and products the order changes in the last bits
        x = 1 + torch.randn(threads, generator=torch.Generator().manual_seed(7)) / 3
    else:
        x = torch.randint(-2**31, 2**31, (threads,), generator=torch.Generator().manual_seed(6), dtype=torch.int32)
        if "product" in intrinsic:
            x = x % 5 - 2
    out = torch.empty_like(x)
    unsigned = ".u." in intrinsic
    results, schemes = _schemes(lambda: air.simd_kernel(intrinsic, type_name, [type_name], unsigned=unsigned),
                                monkeypatch, [out], x, out, threads=threads, group_size=group)
    assert schemes == ["lanes", "vector"]
    _identical(results)


def test_a_region_vector_lanes_refuse_with_an_exchange_inside_is_cut_at_its_exchanges(monkeypatch, caplog):
    """A kernel whose exchange would be inside a region that vector lanes refuse (a call
    they do not take: a saturating conversion, after a barrier) is cut at its exchanges as
    well: that region stays a lane loop, the others are vector lanes, and the sums are the
    lane loops'."""
    body = ["%p = getelementptr float, ptr addrspace(1) %x, i64 %gid64", "%v = load float, ptr addrspace(1) %p",
            "%m = call float @air.simd_sum.f32(float %v) #2", "%mp = getelementptr float, ptr addrspace(1) %first, "
            "i64 %gid64", "store float %m, ptr addrspace(1) %mp", "call void @air.wg.barrier(i32 2, i32 1) #2",
            "%i = call i32 @llvm.fptosi.sat.i32.f32(float %v)", "%w = sitofp i32 %i to float",
            "%s = call float @air.simd_sum.f32(float %w) #2",
            "%op = getelementptr float, ptr addrspace(1) %out, i64 %gid64", "store float %s, ptr addrspace(1) %op"]
    threads = 64
    x = torch.randn(threads, generator=torch.Generator().manual_seed(8)) * 100
    x[3], x[4] = float("nan"), 3e9
    first, out = torch.empty(threads), torch.empty(threads)
    make = lambda: air.library("refused", air.module_text(  # noqa: E731
        "refused", body, [("x", "float", "air.read"), ("first", "float", "air.read_write"),
                          ("out", "float", "air.read_write")],
        _SIMD_SUM + ["declare i32 @llvm.fptosi.sat.i32.f32(float)", "declare void @air.wg.barrier(i32, i32) #1"],
        collective=True))["refused"]
    monkeypatch.setenv("TORCH_METALLIB_LOG", "debug")
    monkeypatch.setenv("TORCH_METALLIB_CACHE", "0")
    with caplog.at_level(logging.DEBUG, logger="torch_metallib"):
        results, schemes = _schemes(make, monkeypatch, [first, out], x, first, out, threads=threads, group_size=64)
    assert schemes == ["lanes", "vector"]
    _identical(results)
    w = torch.where(x.isnan(), torch.tensor(0.0), x.clamp(-2**31, 2**31 - 128)).trunc()  # fptosi.sat
    assert torch.allclose(results[1][1], torch.cat([w[:32].sum().expand(32), w[32:].sum().expand(32)]))
    assert any("stays a lane loop: a call of @llvm.fptosi.sat" in record.getMessage() for record in caplog.records)


def test_row_sum_runs_its_two_regions_over_the_whole_threadgroup(mlx_path, monkeypatch, tmp_path):
    """MLX's row sum with vector lanes: cut at its one barrier only (its SIMD-group sums
    inside the regions), and neither region keeps anything of a SIMD-group's own, so the
    runtime runs each over all the threadgroup's threads at once (KIND_WHOLE_GROUP); the
    sums are torch's."""
    monkeypatch.setenv("TORCH_METALLIB_CPU_VECTORIZE", "1")
    kernel, lanes = mlx_row_sum_lanes_ir(mlx_path, monkeypatch, tmp_path, 8, 4096, 1024, seed=12)
    assert kernel.cpu_scheme == "vector"
    table = re.search(r"^@__tm_lanes_\w+ = constant .*$", lanes, re.MULTILINE).group(0)
    kinds = [int(kind) for kind in re.findall(r"ptr @tm\.region\.\d+, i32 (\d+)", table)]
    assert kinds == [KIND_START + KIND_WHOLE_GROUP, KIND_BARRIER + KIND_WHOLE_GROUP]


@pytest.mark.parametrize("every", [3, 32])  # a third of the lanes; lane 1 of each SIMD-group alone
def test_a_loop_some_lanes_run_writes_their_rows_whole(monkeypatch, every):
    """A loop that only some lanes run (gid % every == 1) writes 4 elements of the lane's
    row: the lanes that never entered it keep no counter, so their addresses are anything,
    and the check for a wide access looks at the lanes that run it only. The same bits as
    the lane loops, and the rows written where expected, the others untouched."""
    body = ["%xp = getelementptr float, ptr addrspace(1) %x, i64 %gid64", "%v = load float, ptr addrspace(1) %xp",
            "%s = call float @air.simd_sum.f32(float %v) #2",  # a cooperative kernel
            "%zp = getelementptr float, ptr addrspace(1) %z, i64 %gid64", "store float %s, ptr addrspace(1) %zp",
            "%r = urem i32 %gid, " + str(every), "%mine = icmp eq i32 %r, 1", "br i1 %mine, label %start, label %out",
            "start:", "br label %head",
            "head:", "%i = phi i32 [ 0, %start ], [ %i1, %head ]", "%row = shl i32 %gid, 2", "%at = add i32 %row, %i",
            "%at64 = zext i32 %at to i64", "%iv = sitofp i32 %i to float", "%w = fadd float %v, %iv",
            "%op = getelementptr float, ptr addrspace(1) %y, i64 %at64", "store float %w, ptr addrspace(1) %op",
            "%i1 = add i32 %i, 1", "%more = icmp ult i32 %i1, 4", "br i1 %more, label %head, label %out", "out:"]
    threads = 75
    x = torch.randn(threads, generator=torch.Generator().manual_seed(4))
    y, z = torch.empty(4 * threads), torch.empty(threads)
    make = _kernel(f"some_rows_{every}", body, [("x", "float", "air.read"), ("y", "float", "air.read_write"),
                                                ("z", "float", "air.read_write")])
    results, schemes = _schemes(make, monkeypatch, [y, z], x, y, z, threads=threads, group_size=64)
    assert schemes == ["lanes", "vector"]
    _identical(results)
    expected = torch.full((threads, 4), -7.0)
    mine = torch.arange(threads) % every == 1
    expected[mine] = x[mine, None] + torch.arange(4.0)
    assert torch.equal(results[1][0].view(threads, 4), expected)


def test_a_deposit_only_a_fold_in_registers_reads_is_written_on_the_slots_path(mlx_path, monkeypatch, tmp_path):
    """MLX's row sum with vector lanes: each SIMD-group sum's deposit is read by its fold
    only, which a full SIMD-group does in registers; the deposit is then written into the
    slots only on the path that folds them (a partial group), not on every sum. The sums
    are torch's."""
    monkeypatch.setenv("TORCH_METALLIB_CPU_VECTORIZE", "1")
    kernel, lanes = mlx_row_sum_lanes_ir(mlx_path, monkeypatch, tmp_path, 8, 4096, 1024, seed=13)
    assert kernel.cpu_scheme == "vector"
    block, deposits = None, []
    for line in lanes.splitlines():
        label = re.match(r"^([\w.]+):", line)
        if label:
            block = label.group(1)
        elif "@llvm.masked.scatter." in line and "%tm.slot." in line:
            deposits.append(block)
    assert deposits and all(block.startswith("tm.slots.") for block in deposits), deposits


def test_per_thread_arrays_copied_to_and_from_the_context_in_chunks_of_the_width(mlx_path, monkeypatch, tmp_path):
    """MLX's row sum, its small loops kept (vector lanes unroll them, and then it keeps no
    array), keeps a per-thread array of 5 floats across its barrier: vector lanes copy the
    lanes' arrays between the context and their interleaved copy as 5 accesses of 32
    elements, each under its own mask (one access of 160 elements under a mask of 160 bits
    is lowered bit by bit: hundreds of mask instructions); no masked access has a length
    that is not a power of two. The sums are torch's."""
    from torch_metallib.backends.cpu import jit as cpu_jit

    monkeypatch.setenv("TORCH_METALLIB_CPU_VECTORIZE", "1")
    monkeypatch.setattr(cpu_jit, "_unrolled_for_vector_lanes", lambda module: str(module))
    kernel, lanes = mlx_row_sum_lanes_ir(mlx_path, monkeypatch, tmp_path, 8, 4096, 1024, seed=14)
    assert kernel.cpu_scheme == "vector"
    lengths = {int(n) for n in re.findall(r"call (?:<\d+ x \w+> |void )@llvm\.masked\.(?:load|store)\.v(\d+)", lanes)}
    assert lengths and all(n & (n - 1) == 0 for n in lengths), sorted(lengths)
    assert len(re.findall(r"= shufflevector <32 x i1> %tm\.m\.\w+, <32 x i1> poison, <32 x i32> <i32 0, i32 0, "
                          r"i32 0, i32 0, i32 0, i32 1,", lanes)) >= 2  # the first chunk's mask, both ways


# A lane reads the 4 floats from its row's address %b (through getelementptrs of floats and
# of bytes) and sums them weighted 1, 2, 4, 8 into %s.
_FOUR_NEIGHBOURS = [
    "%v0 = load float, ptr addrspace(1) %b",
    "%b1 = getelementptr inbounds float, ptr addrspace(1) %b, i64 1", "%v1 = load float, ptr addrspace(1) %b1",
    "%b2 = getelementptr inbounds nuw i8, ptr addrspace(1) %b, i64 8", "%v2 = load float, ptr addrspace(1) %b2",
    "%b3 = getelementptr float, ptr addrspace(1) %b, i64 3", "%v3 = load float, ptr addrspace(1) %b3",
    "%w1 = fmul float %v1, 2.0", "%w2 = fmul float %v2, 4.0", "%w3 = fmul float %v3, 8.0",
    "%s1 = fadd float %v0, %w1", "%s2 = fadd float %s1, %w2", "%s = fadd float %s2, %w3"]


def _assert_four_neighbours_one_wide_load(lanes: str) -> None:
    """The vector lanes' IR `lanes` reads _FOUR_NEIGHBOURS' 32 lanes' 128 floats with one
    wide load and takes each element by a shuffle."""
    wide = re.findall(r"(%tm\.gw\.\d+) = call <128 x float> @llvm\.masked\.load\.v128f32", lanes)
    assert len(wide) == 1, wide
    picks = re.findall(rf"= shufflevector <128 x float> {wide[0]}, <128 x float> poison, <32 x i32> <i32 (\d), i32 (\d)",
                       lanes)
    assert sorted(picks) == [("0", "4"), ("1", "5"), ("2", "6"), ("3", "7")]


@pytest.mark.parametrize("wrap", [1000, 40])  # every lane's row 4 floats on the last's; from thread 40, row 0 again
def test_neighbouring_elements_a_lane_reads_are_one_wide_load(monkeypatch, tmp_path, wrap):
    """Each lane reads 4 neighbouring floats of its row (through getelementptrs of floats
    and of bytes): vector lanes read the 32 lanes' 128 floats with one wide load and take
    each element by a shuffle. Where the rows are not 4 floats apart in a SIMD-group
    (threads from 40 on start again at row 0), that group gathers each element instead. The same
    bits as the lane loops, and the values expected."""
    body = [f"%rowi = urem i32 %gid, {wrap}", "%row = shl i32 %rowi, 2",
            "%row64 = zext i32 %row to i64",
            "%b = getelementptr float, ptr addrspace(1) %x, i64 %row64"] + _FOUR_NEIGHBOURS + [
            "%yp = getelementptr float, ptr addrspace(1) %y, i64 %gid64", "store float %s, ptr addrspace(1) %yp",
            "%t = call float @air.simd_sum.f32(float %s) #2",  # a cooperative kernel
            "%zp = getelementptr float, ptr addrspace(1) %z, i64 %gid64", "store float %t, ptr addrspace(1) %zp"]
    threads = 64
    x = torch.randn(4 * threads, generator=torch.Generator().manual_seed(9))
    y, z = torch.empty(threads), torch.empty(threads)
    monkeypatch.setenv("TORCH_METALLIB_DUMP_IR", str(tmp_path))
    monkeypatch.setenv("TORCH_METALLIB_CACHE", "0")
    make = _kernel(f"neighbours_{wrap}", body, [("x", "float", "air.read"), ("y", "float", "air.read_write"),
                                                      ("z", "float", "air.read_write")])
    results, schemes = _schemes(make, monkeypatch, [y, z], x, y, z, threads=threads, group_size=64)
    assert schemes == ["lanes", "vector"]
    _identical(results)
    rows = torch.arange(threads) % wrap * 4
    expected = x[rows] + x[rows + 1] * 2 + x[rows + 2] * 4 + x[rows + 3] * 8
    assert torch.equal(results[1][0], expected)
    (lanes,) = [text for text in (folder / "lanes.ll" for folder in tmp_path.iterdir())
                for text in [text.read_text()] if "<32 x float>" in text]  # the vector lanes' compile
    _assert_four_neighbours_one_wide_load(lanes)


@pytest.mark.parametrize("dtype,d,causal", [("float32", 128, True), ("float16", 64, False)])
def test_mlx_sdpa_vector_with_vector_lanes_is_torchs(mlx_path, monkeypatch, dtype, d, causal):
    """MLX's sdpa_vector with vector lanes, its small loops unrolled: the loop that adds the
    SIMD-groups' outputs (a threadgroup barrier, a SIMD-group sum, a barrier, per element)
    becomes straight code where a sum and the next barrier share a block. That barrier is
    a barrier: the SIMD-groups all wait there (run as an exchange, a SIMD-group went on
    before the others had written the outputs it reads). Within torch's tolerance, and bit
    for bit the lane loops'."""
    from test_cpu_mlx_matmul import _run_sdpa_vector, _sdpa_name

    outputs, schemes = [], []
    for vector in ("0", "1"):
        monkeypatch.setenv("TORCH_METALLIB_CPU_VECTORIZE", vector)
        lib = tm.load(mlx_path)
        outputs.append(_run_sdpa_vector(lib, dtype, d, d, q_len=3, causal=causal, seed=12))
        schemes.append(lib[_sdpa_name("", dtype, d, d)].cpu_scheme)
    assert schemes == ["lanes", "vector"]
    _identical([[outputs[0]], [outputs[1]]])


def test_a_barrier_after_a_collective_in_its_block_waits_for_the_whole_threadgroup(monkeypatch):
    """With vector lanes a kernel is cut at its barriers only: a barrier in the same block
    as a SIMD-group sum before it is still a threadgroup barrier (it was taken for the
    sum's exchange, and the region after it ran for each SIMD-group as soon as that one
    arrived: SIMD-group 0 read shared memory SIMD-group 1 had not written yet). Two
    SIMD-groups exchange values through threadgroup memory across such barriers: the
    lane loops' bits, and the values expected."""
    body = ["%sl = and i32 %gid, 31", "%in = and i32 %gid, 63", "%sg = lshr i32 %in, 5",
            "%a2 = shl i32 %sl, 1", "%a = add i32 %a2, %sg", "%a64 = zext i32 %a to i64",
            "%b2 = shl i32 %sg, 5", "%b = add i32 %b2, %sl", "%b64 = zext i32 %b to i64",
            "%sa = getelementptr float, ptr addrspace(3) @shared, i64 %a64",
            "%sb = getelementptr float, ptr addrspace(3) @shared, i64 %b64",
            "%xp = getelementptr float, ptr addrspace(1) %x, i64 %gid64", "%o = load float, ptr addrspace(1) %xp",
            "store float %o, ptr addrspace(3) %sa", "call void @air.wg.barrier(i32 2, i32 1) #2",
            "%v0 = load float, ptr addrspace(3) %sb", "%s0 = call float @air.simd_sum.f32(float %v0) #2",
            "call void @air.wg.barrier(i32 2, i32 1) #2",
            "%w = fadd float %s0, %o", "store float %w, ptr addrspace(3) %sa",
            "%s1 = call float @air.simd_sum.f32(float %o) #2", "call void @air.wg.barrier(i32 2, i32 1) #2",
            "%v2 = load float, ptr addrspace(3) %sb", "%r = fadd float %v2, %s1",
            "%yp = getelementptr float, ptr addrspace(1) %y, i64 %gid64", "store float %r, ptr addrspace(1) %yp"]
    threads = 128
    x = torch.randn(threads, generator=torch.Generator().manual_seed(3))
    y = torch.empty(threads)
    make = lambda: air.library("barrier_after_sum", air.module_text(  # noqa: E731
        "barrier_after_sum", body, [("x", "float", "air.read"), ("y", "float", "air.read_write")],
        _SIMD_SUM + ["declare void @air.wg.barrier(i32, i32) #1",
                     "@shared = internal addrspace(3) global [64 x float] undef, align 4"], collective=True))["barrier_after_sum"]
    results, schemes = _schemes(make, monkeypatch, [y], x, y, threads=threads, group_size=64)
    assert schemes == ["lanes", "vector"]
    _identical(results)
    o = x.double().view(-1, 2, 32)  # (threadgroup, SIMD-group, lane)
    at = lambda values: values.transpose(1, 2).reshape(-1, 64).view(-1, 2, 32)  # noqa: E731 - shared[sg * 32 + sl]
    s0 = at(o).sum(-1, keepdim=True)  # each lane reads shared[sg * 32 + sl], written by thread (sl * 2 + sg)
    w = s0 + o
    expected = at(w) + o.sum(-1, keepdim=True)
    torch.testing.assert_close(results[1][0], expected.reshape(-1).float())


@pytest.mark.parametrize("permutes", [True, False])
def test_fast_exps_table_is_read_by_permutes_with_the_lane_loops_bits(monkeypatch, tmp_path, permutes):
    """fast_exp reads a table of 32 entries at an index per lane: with AVX-512 (`permutes`)
    vector lanes read it by two permutes of registers, else by a gather; its rare cases
    are selected, not branched to. Over the inputs at
    every edge of its definition (its slow path, overflow, underflow, subnormal results,
    infinities, NaNs) and random ones: the lane loops' bits, and libm's expf's where
    that is glibc's (the definition's reference)."""
    from test_float_exp import _edges, _glibc_fma, _libm_expf

    from torch_metallib.backends.cpu import jit as cpu_jit

    if permutes and not cpu_jit._permutes():
        pytest.skip("the host has no AVX-512")
    monkeypatch.setattr(cpu_jit, "_permutes", lambda: permutes)
    body = ["%xp = getelementptr float, ptr addrspace(1) %x, i64 %gid64", "%v = load float, ptr addrspace(1) %xp",
            "%e = call float @air.fast_exp.f32(float %v) #2",
            "%yp = getelementptr float, ptr addrspace(1) %y, i64 %gid64", "store float %e, ptr addrspace(1) %yp",
            "%s = call float @air.simd_sum.f32(float %e) #2",  # a cooperative kernel
            "%zp = getelementptr float, ptr addrspace(1) %z, i64 %gid64", "store float %s, ptr addrspace(1) %zp"]
    edges = torch.tensor(_edges(), dtype=torch.int64).to(torch.int32).view(torch.float32)
    x = torch.cat([edges, torch.rand(1000, generator=torch.Generator().manual_seed(4)) * 240 - 120])
    y, z = torch.empty_like(x), torch.empty_like(x)
    monkeypatch.setenv("TORCH_METALLIB_DUMP_IR", str(tmp_path))
    monkeypatch.setenv("TORCH_METALLIB_CACHE", "0")
    name = f"exp_table_{permutes}"
    declared = _SIMD_SUM + ["declare float @air.fast_exp.f32(float) local_unnamed_addr #1"]
    arguments = [("x", "float", "air.read"), ("y", "float", "air.read_write"), ("z", "float", "air.read_write")]

    def make():
        return air.library(name, air.module_text(name, body, arguments, declared, collective=True))[name]

    results, schemes = _schemes(make, monkeypatch, [y, z], x, y, z, threads=x.numel(), group_size=256)
    assert schemes == ["lanes", "vector"]
    _identical(results)
    if _glibc_fma():
        assert torch.equal(results[1][0].view(torch.int32), _libm_expf(x).view(torch.int32))
    (lanes,) = [text for text in (folder / "lanes.ll" for folder in tmp_path.iterdir())
                for text in [text.read_text()] if "@__tm_vector_" in text]  # the vector lanes' compile
    gathers = re.findall(r"= call <\d+ x i64> @llvm\.masked\.gather", lanes)
    permuted = re.findall(r"= call <8 x i64> @llvm\.x86\.avx512\.vpermi2var\.q\.512\(", lanes)
    if permutes:
        assert len(permuted) >= 2 and not gathers, (len(permuted), gathers)
    else:
        assert gathers and not permuted
    # Its rare cases (|x| >= 88, infinities, NaNs) are selected, not a branch lanes take
    # apart: no divergent part, whose blocks run under a counter per lane.
    assert not re.search(r"^tm\.g\.\d+:", lanes, re.M)


def test_a_row_address_reloaded_for_each_element_is_still_one_wide_load(monkeypatch, tmp_path):
    """A lane's row address read through before a branch and after it: the lane loops
    keep it in memory and reload it for each use, so each element's address has its own
    name. Vector lanes see the reloads (and the addresses computed from them) as one
    value: the 32 lanes' 128 floats are one wide load, not one per element. The lane
    loops' bits, and the values expected."""
    body = ["%row = shl i32 %gid, 2", "%row64 = zext i32 %row to i64",
            "%b = getelementptr float, ptr addrspace(1) %x, i64 %row64",
            "%first = load float, ptr addrspace(1) %b", "%inside = fcmp une float %first, 12345.0",
            "br i1 %inside, label %read, label %skip",
            "read:"] + _FOUR_NEIGHBOURS + [
            "br label %skip", "skip:", "%r = phi float [ %s, %read ], [ 0.0, %entry ]",
            "%yp = getelementptr float, ptr addrspace(1) %y, i64 %gid64", "store float %r, ptr addrspace(1) %yp",
            "%t = call float @air.simd_sum.f32(float %r) #2",  # a cooperative kernel
            "%zp = getelementptr float, ptr addrspace(1) %z, i64 %gid64", "store float %t, ptr addrspace(1) %zp"]
    threads = 64
    x = torch.randn(4 * threads, generator=torch.Generator().manual_seed(10))
    y, z = torch.empty(threads), torch.empty(threads)
    monkeypatch.setenv("TORCH_METALLIB_DUMP_IR", str(tmp_path))
    monkeypatch.setenv("TORCH_METALLIB_CACHE", "0")
    make = _kernel("reloaded_row", body, [("x", "float", "air.read"), ("y", "float", "air.read_write"),
                                          ("z", "float", "air.read_write")])
    results, schemes = _schemes(make, monkeypatch, [y, z], x, y, z, threads=threads, group_size=64)
    assert schemes == ["lanes", "vector"]
    _identical(results)
    rows = torch.arange(threads) * 4
    assert torch.equal(results[1][0], x[rows] + x[rows + 1] * 2 + x[rows + 2] * 4 + x[rows + 3] * 8)
    (lanes,) = [text for text in (folder / "lanes.ll" for folder in tmp_path.iterdir())
                for text in [text.read_text()] if "@__tm_vector_" in text]
    assert len(re.findall(r"\.reload\d* = load <32 x ptr addrspace\(1\)>", lanes)) >= 4  # the reloads, widened
    _assert_four_neighbours_one_wide_load(lanes)

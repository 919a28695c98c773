"""Cooperative kernels shared by the CPU tests (tests/test_cpu_cooperative.py) and the GPU
backends' (tests/test_cuda.py, test_cuda_lowering.py, test_metal_sim.py, test_mps.py): the
fixtures' threadgroup sum, MLX's softmax, logsumexp and norms as MLX launches them, and
PyTorch's layer_norm_looped and radix_scan, with their checks against torch; MLX's row sum
with the CPU's lane-loop module of it (tests/test_cpu_lanes.py, test_cpu_vector.py)."""

import torch

import torch_metallib as tm
from conftest import fixture_bitcode

# float32 kernels accumulate in float32 in an order of their own; float16 and bfloat16
# kernels round their inputs and outputs: bounds relative to each type's precision.
ATOL = {torch.float32: 2e-6, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# The threadgroup MLX launches these rows in (softmax.cpp, logsumexp.cpp): the looped kernels
# read one threadgroup entry per SIMD-group of 1,024 threads, so a smaller group leaves
# entries that no SIMD-group wrote (stale memory on a GPU: wrong results there).
MLX_ROW_GROUP = 1024


# --- PyTorch's layer_norm_looped: one lane test on both sides of a barrier ---------------------

def layer_norm_looped_kernel():
    """tests/fixtures/norms/layer_norm_looped.ll (PyTorch's layer_norm_looped<float>), loaded
    on its own."""
    return tm.load(tm.pack([tm.FunctionSource(
        "layer_norm_looped", fixture_bitcode("norms/layer_norm_looped"))])).layer_norm_looped


def check_layer_norm_looped(kernel, rows: int, size: int, group: int, affine: bool = True, device: str = "cpu",
                            checked=None) -> None:
    """Runs the kernel on `rows` rows of `size` floats, one threadgroup of `group` threads
    each, on `device`; its output, means and 1 / standard deviations against torch's in
    float64 (the kernel's variance is E[x^2] - mean^2, in float32)."""
    g = _generator(size * 7 + group)
    x = torch.randn(rows, size, generator=g) * 2 + 0.5
    w, b = torch.randn(size, generator=g), torch.randn(size, generator=g)
    out, mean, rstd = torch.full_like(x, 7.0), torch.full((rows,), 7.0), torch.full((rows,), 7.0)
    moved = [t.to(device) for t in (x, out, mean, rstd, w, b)]
    kernel(*moved[:4], size, 1e-5, int(affine), int(affine), *moved[4:], threads=rows * group, group_size=group,
           checked=checked)
    out, mean, rstd = (t.cpu().double() for t in moved[1:4])
    xd = x.double()
    expected = torch.nn.functional.layer_norm(xd, (size,), w.double() if affine else None,
                                              b.double() if affine else None, 1e-5)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mean, xd.mean(1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(rstd, torch.rsqrt(xd.var(1, unbiased=False) + 1e-5), rtol=1e-5, atol=1e-6)


# --- PyTorch's radix_scan: a prefix sum after a loop whose trip count differs per lane -----------

# n_entries: one thread's chunk or none (256), chunks of 3 where thread 853 has one element and
# its SIMD-group's lanes after it none (2560), of 8 (8000), the largest PyTorch's sort uses.
RADIX_SCAN_SIZES = [256, 2560, 8000, 4096 * 16]


def radix_scan_kernel():
    """tests/fixtures/scans/radix_scan.ll (PyTorch's radix_scan), loaded on its own."""
    return tm.load(tm.pack([tm.FunctionSource("radix_scan", fixture_bitcode("scans/radix_scan"))])).radix_scan


def check_radix_scan(kernel, rows: int, n_entries: int, device: str = "cpu") -> None:
    """The kernel's in-place exclusive scan of `rows` rows of `n_entries` counts, one
    threadgroup of 1,024 threads per row (as PyTorch launches it), against torch.cumsum."""
    counts = torch.randint(0, 1000, (rows, n_entries), generator=_generator(n_entries + rows), dtype=torch.int32)
    histograms = counts.clone().to(device)
    kernel(histograms, n_entries, threads=(1024, rows, 1), group_size=(1024, 1, 1))
    expected = torch.cumsum(counts.long(), 1) - counts.long()
    assert torch.equal(histograms.cpu().long(), expected), f"{rows} x {n_entries}"


# --- the project's fixtures ----------------------------------------------------------------

def check_threadgroup_sum_with_threadgroup_memory(fixtures, group):
    """Each threadgroup gets its own `scratch` (threadgroups run in parallel) and the tree
    reduction needs every barrier."""
    groups = 37
    x = torch.randint(-1000, 1000, (groups * group,), generator=_generator(group)).float()
    out = torch.full((groups + 1,), -7.0)
    fixtures.threadgroup_sum_float(x, out, threads=groups * group, group_size=group,
                                   threadgroup_memory={0: group * 4})
    assert torch.equal(out[:groups], x.view(groups, group).sum(1))  # small integers: exact
    assert out[groups] == -7.0


# --- MLX kernels ----------------------------------------------------------------------------

def check_softmax(mlx_lib, variant, dtype):
    """softmax.h: block_ (one row of up to 4096 per threadgroup, 4 per thread) and looped_
    (any length): simd_max / simd_sum across SIMD-groups, threadgroup variables, barriers."""
    rows, size = 6, (4096 if variant == "block" else 5000)
    x = (torch.randn(rows, size, generator=_generator(1)) * 3).to(DTYPES[dtype])
    out = torch.empty_like(x)
    group = MLX_ROW_GROUP
    mlx_lib[f"{variant}_softmax_{dtype}"](x, out, size, threads=rows * group, group_size=group)
    expected = torch.softmax(x.double(), -1)
    assert (out.double() - expected).abs().max() <= ATOL[DTYPES[dtype]]


def check_logsumexp(mlx_lib, variant, dtype):
    rows, size = 5, (4096 if variant == "block" else 6000)
    x = torch.randn(rows, size, generator=_generator(2)).to(DTYPES[dtype])
    out = torch.empty(rows, dtype=x.dtype)
    group = MLX_ROW_GROUP
    mlx_lib[f"{variant}_logsumexp_{dtype}"](x, out, size, threads=rows * group, group_size=group)
    expected = torch.logsumexp(x.double(), -1)
    assert ((out.double() - expected).abs() / expected.abs()).max() <= 4 * ATOL[DTYPES[dtype]]


def check_rms_norm(mlx_lib, looped, dtype):
    rows, size = 7, 4096
    g = _generator(3)
    x = torch.randn(rows, size, generator=g).to(DTYPES[dtype])
    w = torch.randn(size, generator=g).to(DTYPES[dtype])
    out = torch.empty_like(x)
    group = 256 if looped else size // 4
    name = f"rms_looped{dtype}" if looped else f"rms{dtype}"
    mlx_lib[name](x, w, out, 1e-5, size, 1, threads=rows * group, group_size=group)
    xd = x.double()
    expected = (xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype).double() * w.double()
    assert (out.double() - expected).abs().max() <= 8 * ATOL[DTYPES[dtype]] * expected.abs().max()


def check_layer_norm(mlx_lib, looped):
    rows, size = 5, 4096
    g = _generator(4)
    x, w, b = torch.randn(rows, size, generator=g), torch.randn(size, generator=g), torch.randn(size, generator=g)
    out = torch.empty_like(x)
    group = 256 if looped else size // 4
    name = "layer_norm_loopedfloat32" if looped else "layer_normfloat32"
    mlx_lib[name](x, w, b, out, 1e-5, size, 1, 1, threads=rows * group, group_size=group)
    expected = torch.nn.functional.layer_norm(x.double(), (size,), w.double(), b.double(), 1e-5)
    assert (out.double() - expected).abs().max() <= 2e-5


# --- MLX's row sum on the CPU, with its lane-loop module as text ---------------------------------

def mlx_row_sum_lanes_ir(mlx, monkeypatch, tmp_path, rows: int, size: int, group: int, seed: int):
    """(kernel, its lane-loop module as text): MLX's row_reduce_simple_sumfloat32 compiled
    afresh (its IR written under `tmp_path`) and run on `rows` x `size` values, checked
    against torch."""
    from torch_metallib.backends.cpu import jit as cpu_jit

    monkeypatch.setenv("TORCH_METALLIB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(cpu_jit, "_compiled", {})
    monkeypatch.setenv("TORCH_METALLIB_DUMP_IR", str(tmp_path / "dump"))
    x = torch.randn(rows, size, generator=_generator(seed))
    out = torch.empty(rows)
    kernel = tm.load(mlx)["row_reduce_simple_sumfloat32"]
    kernel(x, out, size, rows, threads=(group, rows // 4, 1), group_size=group)
    torch.testing.assert_close(out, x.double().sum(-1).float(), rtol=1e-5, atol=1e-4)
    (folder,) = (tmp_path / "dump").iterdir()
    return kernel, (folder / "lanes.ll").read_text()


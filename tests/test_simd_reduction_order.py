"""The order of a float sum or product over a SIMD-group (air/collectives.py).

Apple does not document the order in which a GPU adds a SIMD-group's values, and float
addition is not associative, so the last bits of a ``simd_sum`` depend on it. The CPU
backend takes the CUDA backend's order (backends/cuda/warp_spelling.py), so the two
backends that run Metal kernels without a Mac give the same bits: with all 32 lanes taking
part, a butterfly (after the step of distance s = 16, 8, 4, 2, 1, lane i holds
acc_i + acc_(i^s)); with fewer (a SIMD-group cut short by its threadgroup or the grid),
lane after lane in lane order. The references here are computed in torch float32 in those
orders, on values over a wide range of magnitudes, whose sums differ between the orders.
"""

import pytest
import torch

import torch_metallib as tm
from _collectives import SIMD, _simd_groups
from conftest import fixture_bitcode

FLOAT, HALF_FLOAT4 = "simd_sum_product_float", "simd_sum_product_half_float4"
# (threads, threadgroup size): whole SIMD-groups; a partial one at the grid's edge (200 - 192
# = 8 lanes); a partial one in every threadgroup (48 = 32 + 16).
LAUNCHES = [(256, 64), (200, 64), (96, 48)]


def _kernel(name: str = FLOAT):
    """A fresh load of the kernel: the CPU scheme is chosen when it compiles."""
    return tm.load(tm.pack([tm.FunctionSource(name, fixture_bitcode(f"collectives/{name}"))]))[name]


def _values(shape, seed: int, dtype=torch.float32, exponents: int = 20):
    """(summands, factors): normal values scaled by 2^-exponents..2^exponents, and factors near 1."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.pow(2.0, torch.randint(-exponents, exponents + 1, shape, generator=g))
    summands = torch.randn(shape, generator=g) * scale
    factors = torch.exp(0.1 * torch.randn(shape, generator=g))
    return summands.to(dtype), factors.to(dtype)


def _butterfly(values: torch.Tensor, combine) -> torch.Tensor:
    """32 lanes' values (the first dimension) combined as a warp's butterfly leaves them in
    lane 0: the first half with the second, element by element, until one is left."""
    while values.shape[0] > 1:
        half = values.shape[0] // 2
        values = combine(values[:half], values[half:])
    return values[0]


def _in_order(values: torch.Tensor, combine) -> torch.Tensor:
    acc = values[0]
    for value in values[1:]:
        acc = combine(acc, value)
    return acc


def _expected(summands, factors, group: int):
    """(sums, products) per thread, and how many whole SIMD-groups' sums lane order would change."""
    threads = summands.shape[0]
    sums, products = torch.empty_like(summands), torch.empty_like(factors)
    differs = 0
    for members in _simd_groups(threads, group):
        fold = _butterfly if len(members) == SIMD else _in_order
        sums[members] = fold(summands[members], torch.add)
        products[members] = fold(factors[members], torch.mul)
        if len(members) == SIMD:
            differs += int(not torch.equal(sums[members[0]], _in_order(summands[members], torch.add)))
    return sums, products, differs


def _run(kernel, summands, factors, group: int, device: str = "cpu"):
    """(sums, products) of simd_sum_product_float: its sums over `summands`, its products over
    `factors` (two calls: each output column holds both reductions of one input)."""
    threads = summands.numel()
    results = []
    for x in (summands, factors):
        out = torch.full((threads * 2,), -7.0, device=device)
        kernel(x.to(device), out, threads=threads, group_size=group)
        results.append(out.cpu().view(threads, 2))
    return results[0][:, 0], results[1][:, 1]


def _run_half_float4(kernel, h, v, group: int, device: str = "cpu"):
    """((half sums, half products), (float4 sums, float4 products)) of simd_sum_product_half_float4,
    `h` and `v` each (summands, factors)."""
    threads = h[0].numel()
    results = []
    for which in (0, 1):
        oh = torch.full((threads * 2,), -7.0, dtype=torch.float16, device=device)
        ov = torch.full((threads * 2, 4), -7.0, device=device)
        kernel(h[which].to(device), v[which].to(device), oh, ov, threads=threads, group_size=group)
        results.append((oh.cpu().view(threads, 2)[:, which], ov.cpu().view(threads, 2, 4)[:, which]))
    return (results[0][0], results[1][0]), (results[0][1], results[1][1])


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.int16 if x.dtype == torch.float16 else torch.int32)


@pytest.mark.parametrize("threads,group", LAUNCHES)
def test_float_sum_and_product_take_the_warp_order(threads, group):
    """Whole SIMD-groups in the butterfly's order, partial ones in lane order, bit for bit."""
    summands, factors = _values((threads,), seed=threads)
    sums, products = _run(_kernel(), summands, factors, group)
    expected_sums, expected_products, differs = _expected(summands, factors, group)
    if threads % SIMD == 0 and group % SIMD == 0:
        assert differs > 0  # the data tell the orders apart
    assert torch.equal(_bits(sums), _bits(expected_sums))
    assert torch.equal(_bits(products), _bits(expected_products))


@pytest.mark.parametrize("threads,group", LAUNCHES)
def test_half_and_float4_take_the_warp_order(threads, group):
    """Halves (added as halves) and each element of float4s alike."""
    h = _values((threads,), seed=threads, dtype=torch.float16, exponents=6)
    v = _values((threads, 4), seed=threads + 3)
    (h_sums, h_products), (v_sums, v_products) = _run_half_float4(_kernel(HALF_FLOAT4), h, v, group)
    for (sums, products), (summands, factors) in (((h_sums, h_products), h), ((v_sums, v_products), v)):
        expected_sums, expected_products, differs = _expected(summands, factors, group)
        assert differs > 0
        assert torch.equal(_bits(sums), _bits(expected_sums))
        assert torch.equal(_bits(products), _bits(expected_products))


@pytest.mark.parametrize("threads,group", LAUNCHES)
def test_every_cpu_scheme_reduces_alike(threads, group, monkeypatch):
    """Coroutines, lane loops and vector lanes give the same bits."""
    summands, factors = _values((threads,), seed=threads + 1)
    h = _values((threads,), seed=threads + 4, dtype=torch.float16, exponents=6)
    v = _values((threads, 4), seed=threads + 5)
    results, schemes = [], []
    for lanes, vector in (("0", "0"), ("1", "0"), ("1", "1")):
        monkeypatch.setenv("TORCH_METALLIB_CPU_LANES", lanes)
        monkeypatch.setenv("TORCH_METALLIB_CPU_VECTORIZE", vector)
        kernel, other = _kernel(), _kernel(HALF_FLOAT4)
        found = _run(kernel, summands, factors, group)
        results.append([found[0], found[1]] + [x for pair in _run_half_float4(other, h, v, group) for x in pair])
        schemes.append((kernel.cpu_scheme, other.cpu_scheme))
    assert [s[0] for s in schemes] == ["coroutines", "lanes", "vector"]
    assert [s[1] for s in schemes][:2] == ["coroutines", "lanes"]
    for found in results[1:]:
        assert all(torch.equal(_bits(a), _bits(b)) for a, b in zip(found, results[0]))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch.cuda.is_available() is False: no CUDA device")
@pytest.mark.parametrize("threads,group", LAUNCHES)
def test_cuda_reduces_as_the_cpu(threads, group):
    """The CUDA backend's sums and products are the CPU's, bit for bit."""
    summands, factors = _values((threads,), seed=threads + 2)
    kernel = _kernel()
    for cpu, cuda in zip(_run(kernel, summands, factors, group), _run(kernel, summands, factors, group, "cuda")):
        assert torch.equal(_bits(cpu), _bits(cuda))
    h = _values((threads,), seed=threads + 6, dtype=torch.float16, exponents=6)
    v = _values((threads, 4), seed=threads + 7)
    other = _kernel(HALF_FLOAT4)
    on_cpu, on_cuda = _run_half_float4(other, h, v, group), _run_half_float4(other, h, v, group, "cuda")
    for cpu, cuda in zip([x for pair in on_cpu for x in pair], [x for pair in on_cuda for x in pair]):
        assert torch.equal(_bits(cpu), _bits(cuda))

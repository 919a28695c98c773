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

KERNEL = "simd_sum_product_float"
# (threads, threadgroup size): whole SIMD-groups; a partial one at the grid's edge (200 - 192
# = 8 lanes); a partial one in every threadgroup (48 = 32 + 16).
LAUNCHES = [(256, 64), (200, 64), (96, 48)]


def _kernel():
    """A fresh load of the kernel: the CPU scheme is chosen when it compiles."""
    return tm.load(tm.pack([tm.FunctionSource(KERNEL, fixture_bitcode(f"collectives/{KERNEL}"))]))[KERNEL]


def _values(threads: int, seed: int):
    """(summands, factors): normal values scaled by 2^-20..2^20, and factors near 1."""
    g = torch.Generator().manual_seed(seed)
    summands = torch.randn(threads, generator=g) * torch.pow(2.0, torch.randint(-20, 21, (threads,), generator=g))
    factors = torch.exp(0.3 * torch.randn(threads, generator=g))
    return summands, factors


def _butterfly(values: torch.Tensor, combine) -> torch.Tensor:
    """32 values combined as a warp's butterfly leaves them in lane 0: the first half with
    the second, element by element, until one is left."""
    while values.numel() > 1:
        half = values.numel() // 2
        values = combine(values[:half], values[half:])
    return values[0]


def _in_order(values: torch.Tensor, combine) -> torch.Tensor:
    acc = values[0]
    for value in values[1:]:
        acc = combine(acc, value)
    return acc


def _expected(summands, factors, threads: int, group: int):
    """(sums, products) per thread, and how many whole SIMD-groups' sums lane order would change."""
    sums, products = torch.empty(threads), torch.empty(threads)
    differs = 0
    for members in _simd_groups(threads, group):
        fold = _butterfly if len(members) == SIMD else _in_order
        sums[members] = fold(summands[members], torch.add)
        products[members] = fold(factors[members], torch.mul)
        if len(members) == SIMD:
            differs += int(not torch.equal(sums[members[0]], _in_order(summands[members], torch.add)))
    return sums, products, differs


def _run(kernel, summands, factors, group: int, device: str = "cpu"):
    """(sums, products) of the kernel: its sums over `summands`, its products over `factors`
    (two calls: each output column holds both reductions of one input)."""
    threads = summands.numel()
    results = []
    for x in (summands, factors):
        out = torch.full((threads * 2,), -7.0, device=device)
        kernel(x.to(device), out, threads=threads, group_size=group)
        results.append(out.cpu().view(threads, 2))
    return results[0][:, 0], results[1][:, 1]


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.int32)


@pytest.mark.parametrize("threads,group", LAUNCHES)
def test_float_sum_and_product_take_the_warp_order(threads, group):
    """Whole SIMD-groups in the butterfly's order, partial ones in lane order, bit for bit."""
    summands, factors = _values(threads, seed=threads)
    sums, products = _run(_kernel(), summands, factors, group)
    expected_sums, expected_products, differs = _expected(summands, factors, threads, group)
    if threads % SIMD == 0 and group % SIMD == 0:
        assert differs > 0  # the data tell the orders apart
    assert torch.equal(_bits(sums), _bits(expected_sums))
    assert torch.equal(_bits(products), _bits(expected_products))


@pytest.mark.parametrize("threads,group", LAUNCHES)
def test_every_cpu_scheme_reduces_alike(threads, group, monkeypatch):
    """Coroutines, lane loops and vector lanes give the same bits."""
    summands, factors = _values(threads, seed=threads + 1)
    results, schemes = [], []
    for lanes, vector in (("0", "0"), ("1", "0"), ("1", "1")):
        monkeypatch.setenv("TORCH_METALLIB_CPU_LANES", lanes)
        monkeypatch.setenv("TORCH_METALLIB_CPU_VECTORIZE", vector)
        kernel = _kernel()
        results.append(_run(kernel, summands, factors, group))
        schemes.append(kernel.cpu_scheme)
    assert schemes == ["coroutines", "lanes", "vector"]
    for sums, products in results[1:]:
        assert torch.equal(_bits(sums), _bits(results[0][0]))
        assert torch.equal(_bits(products), _bits(results[0][1]))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch.cuda.is_available() is False: no CUDA device")
@pytest.mark.parametrize("threads,group", LAUNCHES)
def test_cuda_reduces_as_the_cpu(threads, group):
    """The CUDA backend's sums and products are the CPU's, bit for bit."""
    summands, factors = _values(threads, seed=threads + 2)
    kernel = _kernel()
    on_cpu = _run(kernel, summands, factors, group)
    on_cuda = _run(kernel, summands, factors, group, device="cuda")
    for cpu, cuda in zip(on_cpu, on_cuda):
        assert torch.equal(_bits(cpu), _bits(cuda))

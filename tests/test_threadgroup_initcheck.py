"""Checked execution's threadgroup initcheck: a read of threadgroup memory that no thread
of the threadgroup has written in the launch raises KernelMemoryError naming the kernel,
the threadgroup argument or variable, the byte offset and the thread; correct kernels
(write, barrier, read; partial writes that cover what is read; atomics) run clean and give
the results they give unchecked. Fixture kernels: tests/_initcheck_kernels.py; real ones:
MLX's sdpa_vector and looped softmax launched with smaller threadgroups than they are
written for, which read slots no SIMD-group wrote. The initcheck is a switch of its own
(off by default): this module turns it on through the environment."""

import pytest
import torch

import torch_metallib as tm
from _initcheck_kernels import library
from test_checked_ops import NS, _sdpa_64

GROUP, GROUPS = 64, 3


@pytest.fixture(scope="module")
def kernels():
    return library()


@pytest.fixture(autouse=True)
def initcheck_on(monkeypatch):
    monkeypatch.setenv("TORCH_METALLIB_INITCHECK", "1")


def _run(kernels, name, checked=True):
    x = torch.arange(1.0, GROUP * GROUPS + 1)
    out = torch.zeros_like(x)
    kernels[name](x, out, threads=x.numel(), group_size=GROUP, threadgroup_memory={0: GROUP * 4}, checked=checked)
    return x, out


def _neighbours(x):
    return x.view(-1, 2).flip(1).reshape(-1)  # out[i] = x[i ^ 1]


@pytest.mark.parametrize("name", ["write_barrier_read", "write_barrier_read_argument", "atomic_write_barrier_read"])
def test_written_then_read_runs_clean(kernels, name):
    x, out = _run(kernels, name)
    assert torch.equal(out, _neighbours(x))


def test_both_halves_written_then_read_runs_clean(kernels):
    _, out = _run(kernels, "both_halves_written")
    assert torch.equal(out, torch.ones(GROUP * GROUPS))


CASES = {
    "read_before_write": "thread (0, 0, 0) reads 4 bytes at byte offset 0 of argument 2 'scratch' (threadgroup(0), "
                         "threadgroup float*) that no thread of its threadgroup has written in this launch; expected "
                         "threadgroup memory written before it is read, got byte offset 0 unwritten",
    "even_threads_write": "thread (0, 0, 0) reads 4 bytes at byte offset 4 of threadgroup variable 'tile' that no "
                          "thread of its threadgroup has written in this launch; expected threadgroup memory written "
                          "before it is read, got byte offset 4 unwritten",
    "low_half_written": "thread (0, 0, 0) reads 4 bytes at byte offset 0 of argument 2 'scratch' (threadgroup(0), "
                        "threadgroup float*) that no thread of its threadgroup has written in this launch; expected "
                        "threadgroup memory written before it is read, got byte offset 2 unwritten",
}


@pytest.mark.parametrize("name", list(CASES))
def test_read_of_unwritten_threadgroup_memory_raises(kernels, name):
    with pytest.raises(tm.KernelMemoryError) as error:
        _run(kernels, name)
    assert str(error.value).startswith(f"{name}: {CASES[name]}. Write it first"), str(error.value)


@pytest.mark.parametrize("name", list(CASES))
def test_unchecked_runs_as_before(kernels, name):
    _run(kernels, name, checked=False)  # reads whatever the memory holds; nothing raises


def test_the_first_threadgroup_that_reads_is_reported_in_each_launch(kernels):
    """The shadow starts empty for every threadgroup and every launch: what one launch's
    threadgroup wrote does not count for the next."""
    _run(kernels, "write_barrier_read_argument")
    with pytest.raises(tm.KernelMemoryError, match=r"^read_before_write: thread \(0, 0, 0\)"):
        _run(kernels, "read_before_write")


# --- MLX ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def sdpa(mlx_path):
    lib = tm.load(mlx_path)
    return {group: _sdpa_64(lib, f"sdpa_64_group_{group}", group=group) for group in (1024, 256)}


def _attention(heads=2, keys=40):
    generator = torch.Generator().manual_seed(3)
    q = torch.randn(1, heads, 1, 64, generator=generator)
    k, v = torch.randn(1, heads, keys, 64, generator=generator), torch.randn(1, heads, keys, 64, generator=generator)
    return q, k, v


def test_sdpa_vector_in_the_threadgroups_it_is_written_for_runs_clean(sdpa):
    q, k, v = _attention()
    with tm.checked():
        out = sdpa[1024](q, k, v, 0.125)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=0.125)
    assert torch.allclose(out, expected, atol=1e-5, rtol=1e-4)


def test_sdpa_vector_in_smaller_threadgroups_reads_unwritten_slots(sdpa):
    """With 256 threads, 8 SIMD-groups write their partial maxima and sums, and the kernel
    reads all 32 slots."""
    q, k, v = _attention()
    with tm.checked():
        with pytest.raises(tm.KernelMemoryError) as error:
            sdpa[256](q, k, v, 0.125)
    message = str(error.value)
    assert message.startswith(f"{NS}::sdpa_64_group_256: sdpa_vector_float_64_64: thread ("), message
    assert " of threadgroup variable '" in message and "that no thread of its threadgroup has written" in message
    assert "got byte offset 32 unwritten" in message, message  # slot 8: the first no SIMD-group wrote


@pytest.mark.parametrize("group", [1024, 256])
def test_looped_softmax(mlx_lib, group):
    x = torch.randn(3, 5000, generator=torch.Generator().manual_seed(4))
    out = torch.empty_like(x)

    def run():
        mlx_lib.looped_softmax_float32(x, out, x.shape[-1], threads=x.shape[0] * group, group_size=group,
                                       checked=True)

    if group == 1024:
        run()
        assert torch.allclose(out, torch.softmax(x, -1), atol=1e-6, rtol=1e-5)
    else:
        with pytest.raises(tm.KernelMemoryError, match=r"^looped_softmax_float32: thread \(.* of threadgroup "
                                                       r"variable 'local_(max|normalizer)' that no thread"):
            run()


def test_initcheck_is_a_switch_of_its_own(kernels, monkeypatch):
    """Off by default; checked(initcheck=False) and TORCH_METALLIB_INITCHECK=0 keep the
    bounds checks only, and the innermost checked() block wins over the environment."""
    with tm.checked(initcheck=False):
        _run(kernels, "read_before_write", checked=None)
    monkeypatch.delenv("TORCH_METALLIB_INITCHECK")
    _run(kernels, "read_before_write")
    monkeypatch.setenv("TORCH_METALLIB_INITCHECK", "0")
    _run(kernels, "read_before_write")
    with tm.checked(initcheck=True):
        with pytest.raises(tm.KernelMemoryError):
            _run(kernels, "read_before_write", checked=None)


def test_mlx_contiguous_scan_reads_slots_no_simdgroup_wrote(mlx_lib):
    """MLX's contiguous scan, in threadgroups of fewer than 32 SIMD-groups (as MLX launches
    it for short rows), has SIMD-group 0 read all 32 slots of simdgroup_sums; the slots no
    SIMD-group wrote reach only lanes whose results are unused, so the output is right.
    The initcheck reports the read all the same (why it is off by default); initcheck=False
    runs it checked for bounds."""
    x = torch.randn(2, 1000, generator=torch.Generator().manual_seed(5))
    out = torch.empty_like(x)

    def run():
        mlx_lib.contig_scan_inclusive_sum_float32_float32(x, out, x.shape[-1], threads=(64, 2, 1),
                                                          group_size=(64, 1, 1))

    with tm.checked(initcheck=True):
        with pytest.raises(tm.KernelMemoryError, match=r"^contig_scan_inclusive_sum_float32_float32: thread "
                                                       r"\(2, 0, 0\) reads 4 bytes at byte offset 8 of threadgroup "
                                                       r"variable 'simdgroup_sums'"):
            run()
    with tm.checked(initcheck=False):
        run()
    assert torch.allclose(out, x.cumsum(-1), atol=1e-4, rtol=1e-5)

"""The hand-written AIR kernels of tests/fixtures/collectives/, each loaded on its own (once):
tests/test_cpu_collectives.py and tests/test_cuda_lowering.py; the lanes of a 1-D dispatch
(tests/test_cpu_collectives.py's docstring), and the shuffle check tests/test_cuda.py mirrors."""

import functools

import torch

import torch_metallib as tm
from conftest import fixture_bitcode


@functools.lru_cache(maxsize=None)
def collective_kernel(name: str):
    library = tm.load(tm.pack([tm.FunctionSource(name, fixture_bitcode(f"collectives/{name}"))]))
    return library[name]


SIMD = 32
SENTINEL = -12345.0


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _simd_groups(threads: int, group: int):
    """The grid positions of each SIMD-group, lane by lane (see the module docstring)."""
    groups = []
    for start in range(0, threads, group):
        end = min(start + group, threads)
        groups += [list(range(s, min(s + SIMD, end))) for s in range(start, end, SIMD)]
    return groups


def check_shuffle_up_down_xor_broadcast(d):
    threads, group = 128, 64
    x = torch.randperm(threads, generator=_generator(d)).float() + 0.25
    out = torch.full((threads * 4,), SENTINEL)
    collective_kernel("simd_shuffle_edges")(x, out, d, threads=threads, group_size=group)
    expected = torch.empty(threads, 4)
    for members in _simd_groups(threads, group):
        for lane, gid in enumerate(members):
            own = x[gid]
            expected[gid, 0] = x[members[lane - d]] if lane - d >= 0 else own   # up: no wrap
            expected[gid, 1] = x[members[lane + d]] if lane + d < SIMD else own  # down: no wrap
            expected[gid, 2] = x[members[lane ^ d]]
            expected[gid, 3] = x[members[d]]
    assert torch.equal(out.view(threads, 4), expected)

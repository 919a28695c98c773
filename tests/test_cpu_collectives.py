"""SIMD-group, quad-group, atomic and simdgroup-matrix intrinsics on the CPU, with hand-written
AIR kernels (tests/fixtures/collectives/), against references computed here from Metal's
semantics: up/down shuffles do not wrap; a collective in divergent code acts over the active
lanes only; a SIMD-group cut short at a threadgroup or grid edge holds only the lanes that
exist; quad functions stay within their 4 lanes; device atomics are atomic across
threadgroups running in parallel.

Lanes: in a 1-D dispatch of `threads` threads in threadgroups of `group`, threadgroup g holds
grid positions [g * group, min((g + 1) * group, threads)), and SIMD-group s of it the 32
consecutive ones from g * group + 32 * s; a thread's lane is its index in that list.
"""

import numpy as np
import pytest
import torch

import torch_metallib as tm
from _collectives import (SENTINEL, SIMD, _generator, _simd_groups, check_shuffle_up_down_xor_broadcast,
                          collective_kernel)


def _lane_of(threads: int, group: int):
    lanes = [0] * threads
    for members in _simd_groups(threads, group):
        for lane, gid in enumerate(members):
            lanes[gid] = lane
    return lanes


def _small_ints(n: int, seed: int, low: int = -50, high: int = 50) -> torch.Tensor:
    """Integer-valued floats: their sums are exact in any order."""
    return torch.randint(low, high, (n,), generator=_generator(seed)).float()


# --- shuffles --------------------------------------------------------------------------------

@pytest.mark.parametrize("d", [0, 1, 3, 16, 31])
def test_shuffle_up_down_xor_broadcast(d):
    check_shuffle_up_down_xor_broadcast(d)


def _shuffled_and_filled(x, fill, delta, width):
    """(up, down) over vectors of `width` lanes: up = fill's last `delta` lanes, then data's
    first width - delta; down = data's last width - delta lanes, then fill's first `delta`."""
    data_chunks, fill_chunks = x.view(-1, width), fill.view(-1, width)
    up = torch.cat([fill_chunks[:, width - delta:], data_chunks[:, :width - delta]], 1).flatten()
    down = torch.cat([data_chunks[:, delta:], fill_chunks[:, :delta]], 1).flatten()
    return up, down


@pytest.mark.parametrize("delta,modulo", [(1, 32), (2, 4), (3, 8), (0, 16), (5, 8), (7, 16), (1, 2)])
def test_shuffle_and_fill(delta, modulo):
    """Per vector of `modulo` lanes (see _shuffled_and_filled)."""
    threads = 64
    x = torch.arange(threads).float()
    fill = -torch.arange(1, threads + 1).float()
    out = torch.full((threads * 2,), SENTINEL)
    collective_kernel("simd_shuffle_and_fill")(x, fill, out, delta, modulo, threads=threads, group_size=threads)
    up, down = _shuffled_and_filled(x, fill, delta, modulo)
    assert torch.equal(out.view(threads, 2)[:, 0], up)
    assert torch.equal(out.view(threads, 2)[:, 1], down)


def test_shuffle_and_fill_matches_the_metal_specification_example():
    # MSL spec, simd_shuffle_and_fill_up with delta 2 over 8-lane vectors:
    # data {s0..s7}, filling {f0..f7} -> {f6, f7, s0, s1, s2, s3, s4, s5}.
    x = torch.arange(100.0, 132.0)
    fill = torch.arange(200.0, 232.0)
    out = torch.full((64,), SENTINEL)
    collective_kernel("simd_shuffle_and_fill")(x, fill, out, 2, 8, threads=32, group_size=32)
    assert out.view(32, 2)[:8, 0].tolist() == [206, 207, 100, 101, 102, 103, 104, 105]
    assert out.view(32, 2)[:8, 1].tolist() == [102, 103, 104, 105, 106, 107, 200, 201]


@pytest.mark.parametrize("delta", [0, 1, 3])
def test_shuffle_and_fill_without_modulo_spans_the_group(delta):
    """The 3-argument overloads: the vector is the whole SIMD-group (32 lanes) for simd_*,
    the quad (4 lanes) for quad_*."""
    threads = 64
    x = torch.arange(threads).float()
    fill = -torch.arange(1, threads + 1).float()
    out = torch.full((threads * 4,), SENTINEL)
    collective_kernel("shuffle_and_fill_whole_group")(x, fill, out, delta, threads=threads, group_size=threads)
    for column, width in ((0, SIMD), (2, 4)):
        up, down = _shuffled_and_filled(x, fill, delta, width)
        assert torch.equal(out.view(threads, 4)[:, column], up)
        assert torch.equal(out.view(threads, 4)[:, column + 1], down)


# --- reductions and votes in divergent code ---------------------------------------------------

def _active_pattern(pattern: str, threads: int, group: int, seed: int) -> torch.Tensor:
    lanes = torch.tensor(_lane_of(threads, group))
    if pattern == "lane%3==0":
        return (lanes % 3 == 0).int()
    if pattern == "one_lane":
        return (lanes == 7).int()
    if pattern == "all":
        return torch.ones(threads, dtype=torch.int32)
    return torch.randint(0, 2, (threads,), generator=_generator(seed), dtype=torch.int32)


@pytest.mark.parametrize("schedule", ["parallel", "permuted"])
@pytest.mark.parametrize("pattern", ["lane%3==0", "random", "one_lane", "all"])
@pytest.mark.parametrize("threads,group", [(96, 32), (100, 64), (80, 40)])
def test_reductions_act_over_active_lanes(threads, group, pattern, schedule):
    """prefix_exclusive_sum / sum / max / broadcast_first inside `if (active[gid])`: over the
    lanes that took the branch, and only the lanes that exist (partial SIMD-groups)."""
    x = _small_ints(threads, seed=threads + group)
    active = _active_pattern(pattern, threads, group, seed=group)
    out = torch.full((threads * 4,), SENTINEL)
    with tm.cpu_schedule(schedule, seed=3):
        collective_kernel("simd_reduce_divergent")(x, active, out, threads=threads, group_size=group)
    expected = torch.full((threads, 4), SENTINEL)
    for members in _simd_groups(threads, group):
        taking = [gid for gid in members if active[gid]]
        for i, gid in enumerate(taking):
            expected[gid, 0] = sum(x[g].item() for g in taking[:i])
            expected[gid, 1] = sum(x[g].item() for g in taking)
            expected[gid, 2] = max(x[g].item() for g in taking)
            expected[gid, 3] = x[taking[0]]
    assert torch.equal(out.view(threads, 4), expected)


@pytest.mark.parametrize("schedule", ["parallel", "permuted"])
@pytest.mark.parametrize("threads,group", [(128, 64), (80, 40), (45, 64)])
def test_ballot_active_mask_is_first_in_divergent_code(threads, group, schedule):
    """Inside `if (v != 0)`: ballot(v > 1) has bit j set iff lane j took the branch and
    v > 1; the active mask has exactly the lanes that took it; simd_is_first() is true in
    the lowest of them only."""
    v = torch.randint(0, 4, (threads,), generator=_generator(threads), dtype=torch.int32)
    v[:SIMD] = torch.tensor([0, 0, 0, 2] + [0] * 20 + [1, 3, 0, 1, 0, 0, 0, 2])  # sparse, high lanes
    out = torch.full((threads * 3,), -1, dtype=torch.int64)
    with tm.cpu_schedule(schedule, seed=5):
        collective_kernel("simd_vote_divergent")(v, out, threads=threads, group_size=group)
    expected = torch.full((threads, 3), -1, dtype=torch.int64)
    for members in _simd_groups(threads, group):
        taking = [lane for lane, gid in enumerate(members) if v[gid] != 0]
        ballot = sum(1 << lane for lane in taking if v[members[lane]] > 1)
        mask = sum(1 << lane for lane in taking)
        for lane in taking:
            expected[members[lane]] = torch.tensor([ballot, mask, int(lane == taking[0])])
    assert torch.equal(out.view(threads, 3), expected)


def test_is_uniform_of_uniform_and_non_uniform_values():
    threads = 128
    v = torch.full((threads,), 7, dtype=torch.int32)
    v[32 + 5] = 8                       # SIMD-group 1: an odd lane differs
    v[64 + 4] = 9                       # SIMD-group 2: an even lane differs
    v[96:] = torch.arange(32, dtype=torch.int32)  # SIMD-group 3: all different
    out = torch.full((threads * 2,), 99, dtype=torch.int32)
    collective_kernel("simd_is_uniform")(v, out, threads=threads, group_size=threads)
    out = out.view(threads, 2)
    full = [1, 0, 0, 0]
    even_lanes = [1, 1, 0, 0]
    for simd in range(4):
        rows = out[simd * SIMD:(simd + 1) * SIMD]
        assert rows[:, 0].tolist() == [full[simd]] * SIMD, simd
        assert rows[0::2, 1].tolist() == [even_lanes[simd]] * 16, simd
        assert rows[1::2, 1].tolist() == [99] * 16, simd  # odd lanes skip the second call


def test_is_uniform_over_the_lanes_that_exist():
    # The last SIMD-group has 4 lanes (threads 96..99), uniform among themselves.
    threads = 100
    v = torch.arange(128, dtype=torch.int32)
    v[96:100] = 5
    out = torch.full((256,), 99, dtype=torch.int32)
    collective_kernel("simd_is_uniform")(v, out, threads=threads, group_size=128)
    out = out.view(128, 2)
    assert out[:96, 0].tolist() == [0] * 96
    assert out[96:100, 0].tolist() == [1] * 4
    assert out[96:100:2, 1].tolist() == [1, 1]
    assert out[100:].eq(99).all()


@pytest.mark.parametrize("threads,group", [(80, 40), (100, 64), (45, 64), (33, 33), (64, 64)])
def test_partial_simdgroups_hold_only_existing_lanes(threads, group):
    """int simd_sum, a simdgroup_barrier and the active mask in SIMD-groups cut short by
    the threadgroup size or the grid's edge."""
    v = torch.randint(-1000, 1000, (threads,), generator=_generator(threads), dtype=torch.int32)
    out = torch.full((threads * 4,), -7, dtype=torch.int32)
    collective_kernel("simd_partial_groups")(v, out, threads=threads, group_size=group)
    expected = torch.empty(threads, 4, dtype=torch.int32)
    for start in range(0, threads, group):
        size = min(group, threads - start)
        for members in _simd_groups(size, size):
            gids = [start + m for m in members]
            mask = (1 << len(gids)) - 1
            for gid in gids:
                expected[gid] = torch.tensor([int(v[gids].sum()), mask - (1 << 32) if mask >> 31 else mask,
                                              members[0] // SIMD, -(-size // SIMD)])
    assert torch.equal(out.view(threads, 4), expected)


@pytest.mark.parametrize("schedule, seed", [("parallel", 0), ("sequential", 0), ("permuted", 1), ("permuted", 2)])
def test_simdgroup_barrier_with_memory_flags_makes_lanes_meet(schedule, seed):
    """shared[lid] = in[gid]; simdgroup_barrier(mem_threadgroup); out[gid] = shared[lid ^ 1]:
    every lane reads its neighbour's store, in any thread order. (A mem_none barrier orders
    no memory, so the runtime lets lanes pass it; this one must make them meet.)"""
    threads, group = 200, 64  # the last threadgroup's last SIMD-group is cut short: 8 lanes
    v = torch.randint(-1000, 1000, (threads,), generator=_generator(seed), dtype=torch.int32)
    out = torch.full((threads,), -7, dtype=torch.int32)
    with tm.cpu_schedule(schedule, seed=seed):
        collective_kernel("simdgroup_barrier_threadgroup")(v, out, threads=threads, group_size=group,
                                                 threadgroup_memory={0: group * 4})
    neighbour = torch.tensor([(gid // group) * group + ((gid % group) ^ 1) for gid in range(threads)])
    assert torch.equal(out, v[neighbour])


# --- reconvergence ----------------------------------------------------------------------------

# Lanes that skip a branch (or leave a loop) reach the next collective first in every
# schedule's thread order; the runtime must still let the lanes inside go first.
RECONVERGENCE_SCHEDULES = [("parallel", 0), ("sequential", 0), ("permuted", 1), ("permuted", 2), ("permuted", 3)]


@pytest.mark.parametrize("schedule, seed", RECONVERGENCE_SCHEDULES)
@pytest.mark.parametrize("k", [0, 1, 2])
def test_simdgroup_reconverges_after_divergent_if(k, schedule, seed):
    """`if (lane % 3 == k) a = simd_sum(x);` then `b = simd_sum(x)` after the if: a is the sum
    over lanes with lane % 3 == k, b the sum over all 32 lanes, whichever lanes come first."""
    threads = 64
    x = _small_ints(threads, seed=k)
    out = torch.full((threads * 2,), SENTINEL)
    with tm.cpu_schedule(schedule, seed=seed):
        collective_kernel("simd_sum_reconverge")(x, out, k, threads=threads, group_size=threads)
    expected = torch.empty(threads, 2)
    for members in _simd_groups(threads, threads):
        branch = sum(x[gid].item() for lane, gid in enumerate(members) if lane % 3 == k)
        for lane, gid in enumerate(members):
            expected[gid, 0] = branch if lane % 3 == k else 0.0
            expected[gid, 1] = x[members].sum()
    assert torch.equal(out.view(threads, 2), expected)


@pytest.mark.parametrize("schedule, seed", RECONVERGENCE_SCHEDULES)
@pytest.mark.parametrize("threads, group", [(64, 64), (96, 48), (40, 40)])
def test_simdgroup_reconverges_after_divergent_loop(threads, group, schedule, seed):
    """Lane l loops l % 4 times: iteration i's simd_sum acts over the lanes with l % 4 > i;
    the simd_sum after the loop over every lane of the SIMD-group."""
    x = _small_ints(threads, seed=threads + group)
    out = torch.full((threads * 2,), SENTINEL)
    with tm.cpu_schedule(schedule, seed=seed):
        collective_kernel("simd_sum_loop_reconverge")(x, out, threads=threads, group_size=group)
    expected = torch.empty(threads, 2)
    for members in _simd_groups(threads, group):
        in_iteration = [sum(x[gid].item() for lane, gid in enumerate(members) if lane % 4 > i) for i in range(3)]
        for lane, gid in enumerate(members):
            expected[gid, 0] = sum(in_iteration[:lane % 4])
            expected[gid, 1] = x[members].sum()
    assert torch.equal(out.view(threads, 2), expected)


@pytest.mark.parametrize("schedule", ["parallel", "permuted"])
@pytest.mark.parametrize("k", [0, 5, 16, 31, 32])
@pytest.mark.parametrize("threads", [64, 48])
def test_if_and_else_collectives_are_separate(threads, k, schedule):
    """`if (lane < k) r = simd_sum(x); else r = simd_sum(-x);`: two collectives, one per side."""
    x = _small_ints(threads, seed=threads + k)
    out = torch.full((threads,), SENTINEL)
    with tm.cpu_schedule(schedule, seed=k):
        collective_kernel("simd_sum_if_else")(x, out, k, threads=threads, group_size=threads)
    expected = torch.empty(threads)
    for members in _simd_groups(threads, threads):
        below = [gid for lane, gid in enumerate(members) if lane < k]
        above = [gid for lane, gid in enumerate(members) if lane >= k]
        expected[below] = x[below].sum()
        expected[above] = -x[above].sum()
    assert torch.equal(out, expected)


# --- quad-groups ------------------------------------------------------------------------------

@pytest.mark.parametrize("d", [0, 1, 2, 3])
def test_quad_functions_stay_within_their_quad(d):
    threads = 64
    x = torch.randint(-5, 6, (threads,), generator=_generator(10 + d)).float()
    x[0:4] = torch.tensor([1.0, 2.0, 3.0, 4.0])    # all positive
    x[4:8] = torch.tensor([0.0, -1.0, -2.0, 0.0])  # none positive
    x[8:12] = torch.tensor([0.0, 3.0, -1.0, 0.0])  # one positive
    out = torch.full((threads * 8,), SENTINEL)
    collective_kernel("quad_functions")(x, out, d, threads=threads, group_size=threads)
    expected = torch.empty(threads, 8)
    for gid in range(threads):
        base, q = gid - gid % 4, gid % 4
        quad = x[base:base + 4]
        positive = quad > 0
        expected[gid] = torch.tensor([
            quad.sum(),
            quad[(q + d) % 4],
            quad[q ^ d],
            quad[q - d] if q - d >= 0 else x[gid],   # up: no wrap within the quad
            quad[q + d] if q + d < 4 else x[gid],    # down: no wrap within the quad
            quad[d],
            quad[:q + 1].sum(),
            float(positive.all()) + 2 * float(positive.any()),
        ])
    assert torch.equal(out.view(threads, 8), expected)


@pytest.mark.parametrize("d", [0, 1, 2, 3])
def test_quad_functions_in_a_partial_quad(d):
    """62 threads: the last quad has lanes 0 and 1 only. Its reductions, prefix and votes
    cover those two; a shuffle is checked only where its source lane exists or where it
    keeps the lane's own value (a source outside the quad)."""
    threads = 62
    x = torch.tensor([3.0, -2.0] * 31)
    x[60:62] = torch.tensor([5.0, 7.0])
    out = torch.full((64 * 8,), SENTINEL)
    collective_kernel("quad_functions")(x, out, d, threads=threads, group_size=64)
    rows = out.view(64, 8)
    assert rows[62:].eq(SENTINEL).all()
    for gid, q in ((60, 0), (61, 1)):
        own, pair = x[gid].item(), [5.0, 7.0]
        assert rows[gid, 0] == 12.0
        if (q + d) % 4 < 2:
            assert rows[gid, 1] == pair[(q + d) % 4]
        if q ^ d < 2:
            assert rows[gid, 2] == pair[q ^ d]
        assert rows[gid, 3] == (pair[q - d] if q - d >= 0 else own)
        if q + d < 2 or q + d >= 4:
            assert rows[gid, 4] == (pair[q + d] if q + d < 4 else own)
        if d < 2:
            assert rows[gid, 5] == pair[d]
        assert rows[gid, 6] == sum(pair[:q + 1])
        assert rows[gid, 7] == 3.0  # all and any positive
    # The full quads before it are unaffected: 3 and -2 alternate.
    assert rows[:60, 0].eq(2.0).all() and rows[:60, 7].eq(2.0).all()


# --- atomics ----------------------------------------------------------------------------------

# Non-atomic kernels run threadgroups in parallel_for chunks of about 32,768 threads: 64
# threadgroups of 64 all run on one OS thread. 4,096 threadgroups of 1,024 threads (4M
# threads) keep torch's threads busy at the same time, long enough that a plain
# load-add-store loses updates here (checked with a non-atomic replacement).
ATOMIC_SIZES = [(64, 64), (4096, 1024)]


@pytest.mark.parametrize("groups,group", ATOMIC_SIZES)
def test_atomic_float_add_across_parallel_threadgroups(groups, group):
    threads = groups * group
    x = torch.randint(1, 3, (threads,), generator=_generator(1)).float()  # totals < 2**24: exact
    total = torch.tensor([0.5])
    old = torch.full((threads,), SENTINEL)
    collective_kernel("atomic_add_float")(x, total, old, threads=threads, group_size=group)
    assert total.item() == 0.5 + x.double().sum().item()
    # Each addition saw the total of the ones before it: sorted, the old values chain up.
    order = torch.argsort(old)
    chained = 0.5 + torch.cumsum(x[order].double(), 0) - x[order].double()
    assert torch.equal(old[order].double(), chained)


@pytest.mark.parametrize("groups,group", [(64, 64), (2048, 1024)])
def test_atomic_int_ops_across_parallel_threadgroups(groups, group):
    threads = groups * group
    v = torch.randint(-50000, 50000, (threads,), generator=_generator(2), dtype=torch.int32) * 2  # even
    s_init = [5, 10**6, -10**6, 7, 123456789]  # s[4] is odd: told apart from every v
    u_init = [-1, 0, 0, 0x12345678, -1]        # as int32 bits: 0xFFFFFFFF, 0, 0, ..., 0xFFFFFFFF
    s = torch.tensor(s_init, dtype=torch.int32)
    u = torch.tensor(u_init, dtype=torch.int32)
    old = torch.zeros(threads, dtype=torch.int32)
    collective_kernel("atomic_int_ops")(v, s, u, old, threads=threads, group_size=group)
    bits = v.numpy().view(np.uint32)
    total = int(v.long().sum())
    wrap = lambda value: (value + 2**31) % 2**32 - 2**31  # noqa: E731  (int32 two's complement)
    assert s[:4].tolist() == [wrap(5 + total), int(v.min()), int(v.max()), wrap(7 - total)]
    expected_u = np.array([bits.min(), bits.max(), np.bitwise_or.reduce(bits),
                           np.bitwise_xor.reduce(bits) ^ np.uint32(0x12345678),
                           np.bitwise_and.reduce(bits | np.uint32(1))], dtype=np.uint32)
    assert u.numpy().view(np.uint32).tolist() == expected_u.tolist()
    # xchg: the values handed back plus the one left are the initial value and every v.
    handed = torch.cat([old, s[4:5]]).sort().values
    assert torch.equal(handed, torch.cat([v, torch.tensor([s_init[4]], dtype=torch.int32)]).sort().values)


@pytest.mark.parametrize("threads,group", [(200, 64), (1024, 256), (37, 37)])
def test_atomics_on_threadgroup_memory(threads, group):
    v = torch.randint(0, 1000, (threads,), generator=_generator(threads), dtype=torch.int32)
    ticket = torch.full((threads,), -1, dtype=torch.int32)
    groups = -(-threads // group)
    out = torch.full((groups * 3,), -1, dtype=torch.int32)
    collective_kernel("atomic_threadgroup")(v, ticket, out, threads=threads, group_size=group,
                                  threadgroup_memory={0: 16})
    for g in range(groups):
        members = slice(g * group, min((g + 1) * group, threads))
        size = len(range(threads)[members])
        assert sorted(ticket[members].tolist()) == list(range(size)), g
        assert out[3 * g:3 * g + 3].tolist() == [size, int(v[members].sum()), int(v[members].max())], g


@pytest.mark.parametrize("groups,group", ATOMIC_SIZES)
def test_compare_exchange_weak_counter_is_exact(groups, group):
    threads = groups * group
    counter = torch.tensor([1000], dtype=torch.int32)
    ticket = torch.full((threads,), -1, dtype=torch.int32)
    collective_kernel("atomic_cmpxchg_counter")(counter, ticket, threads=threads, group_size=group)
    assert counter.item() == 1000 + threads
    assert torch.equal(ticket.sort().values, torch.arange(1000, 1000 + threads, dtype=torch.int32))


# --- simdgroup matrices -----------------------------------------------------------------------

def _assert_product_close(actual: torch.Tensor, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor):
    """actual ~ a @ b + c within 1e-5 of the magnitude of what was summed (float32 fma
    accumulation in k order against a float64 reference)."""
    expected = a.double() @ b.double() + c.double()
    scale = a.double().abs() @ b.double().abs() + c.double().abs()
    assert ((actual.double() - expected).abs() <= 1e-5 * scale).all(), (actual.double() - expected).abs().max()


def test_simdgroup_matrix_8x8_load_multiply_accumulate_store():
    g = _generator(8)
    a, b, c = (torch.randn(8, 8, generator=g) for _ in range(3))
    d, e, f, t = (torch.full((8, 8), SENTINEL) for _ in range(4))
    collective_kernel("simdgroup_matrix_8x8")(a, b, c, d, e, f, t, threads=32, group_size=32)
    _assert_product_close(d, a, b, c)
    _assert_product_close(e, a.T, b, c)                   # loaded with transpose = true
    _assert_product_close(f, a, torch.full((8, 8), 0.5), c)  # init_filled(0.5)
    assert torch.equal(t, d.T)                            # stored with transpose = true


def test_simdgroup_matrix_8x8_small_integers_are_exact():
    g = _generator(9)
    a, b, c = (torch.randint(-8, 8, (8, 8), generator=g).float() for _ in range(3))
    d, e, f, t = (torch.full((8, 8), SENTINEL) for _ in range(4))
    collective_kernel("simdgroup_matrix_8x8")(a, b, c, d, e, f, t, threads=32, group_size=32)
    assert torch.equal(d, a @ b + c)
    assert torch.equal(e, a.T @ b + c)
    assert torch.equal(f, a.sum(1, keepdim=True).expand(8, 8) * 0.5 + c)


def test_simdgroup_matrix_16x16_tiles_accumulated_over_k():
    batch = 5
    g = _generator(16)
    a, b, c = (torch.randn(batch, 16, 16, generator=g) for _ in range(3))
    d = torch.full((batch, 16, 16), SENTINEL)
    collective_kernel("simdgroup_matrix_16x16")(a, b, c, d, threads=batch * 128, group_size=128)
    _assert_product_close(d, a, b, c)
    a, b, c = (torch.randint(-8, 8, (batch, 16, 16), generator=g).float() for _ in range(3))
    collective_kernel("simdgroup_matrix_16x16")(a, b, c, d, threads=batch * 128, group_size=128)
    assert torch.equal(d, a @ b + c)

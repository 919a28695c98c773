"""MLX's fused gated-delta-rule kernel (linear attention: per step S = g*S, delta = beta*(v -
S k), S += delta k^T, y = S q) as two compilers built it from the same MLX 0.32.4 source:
mlx.metallib (macOS 14 wheel, the older ``simdgroup_matrix_8x8_load(ptr, elements_per_row,
origin, transpose)`` form) and the macOS 26 wheel's library (Xcode 26's (ptr, extents,
strides, origin) form). Both against a float64 step-by-step reference.

Launch as mlx/backend/metal/gated_delta_update.cpp does: dispatchThreads grid (32, Dv/8,
B*Hv), threadgroup (32, 4, 1); q, k [B, T, Hk, Dk], v and y [B, T, Hv, Dv], g and beta
[B, T, Hv], state [B, Hv, Dv, Dk] (float32), T a ``constant int&``. g is a decay in (0, 1].
"""

import pytest
import torch

import torch_metallib as tm
from _public_corpus import mac26_path

KERNEL = "gated_delta_fused_chunk_float_128_128_24_24_8"  # Dk, Dv, Hk, Hv, chunk of 8 steps
B, T, H, D = 1, 13, 24, 128                                  # T: one full chunk and a partial one


def _reference(q, k, v, state, g, beta):
    """y [B, T, H, D] and the final state, float64, one time step after another."""
    S = state.double().clone()
    y = torch.empty(B, T, H, D, dtype=torch.float64)
    for t in range(T):
        kt, qt = k[:, t].double(), q[:, t].double()
        S = S * g[:, t, :, None, None].double()
        delta = (v[:, t].double() - torch.einsum("bhvk,bhk->bhv", S, kt)) * beta[:, t, :, None].double()
        S = S + delta[..., None] * kt[:, :, None, :]
        y[:, t] = torch.einsum("bhvk,bhk->bhv", S, qt)
    return y, S


@pytest.fixture(scope="module")
def inputs():
    g = torch.Generator().manual_seed(32)
    q, k = (torch.nn.functional.normalize(torch.randn(B, T, H, D, generator=g), dim=-1) for _ in range(2))
    v = torch.randn(B, T, H, D, generator=g)
    state = torch.randn(B, H, D, D, generator=g) * 0.1
    decay = torch.rand(B, T, H, generator=g) * 0.5 + 0.5
    beta = torch.sigmoid(torch.randn(B, T, H, generator=g))
    return q, k, v, state, decay, beta


@pytest.fixture(scope="module")
def reference(inputs):
    return _reference(*inputs)


@pytest.fixture(scope="module")
def outputs(inputs, mlx_path):
    """{library: (y, state_out)} for the macOS 14 and macOS 26 builds."""
    q, k, v, state, decay, beta = inputs
    results = {}
    for label, path in (("macOS 14 build", mlx_path), ("macOS 26 build", mac26_path())):
        y = torch.full((B, T, H, D), float("nan"))
        state_out = torch.full((B, H, D, D), float("nan"))
        tm.load(path)[KERNEL](q, k, v, state, decay, beta, y, state_out, T,
                              threads=(32, D // 8, B * H), group_size=(32, 4, 1))
        results[label] = (y, state_out)
    return results


@pytest.mark.parametrize("label", ["macOS 14 build", "macOS 26 build"])
def test_gated_delta_matches_the_step_by_step_recurrence(outputs, reference, label):
    y, state_out = outputs[label]
    want_y, want_state = reference
    # float32 throughout a 13-step recurrence over 128-long dot products: relative
    # Frobenius error ~2e-7 measured; a wrong tile element, transpose or stride gives O(1).
    for got, want in ((y, want_y), (state_out, want_state)):
        assert not got.isnan().any()
        assert (got.double() - want).norm() <= 2e-6 * want.norm()


def test_both_compilers_forms_give_the_same_numbers(outputs):
    """The two builds' load/store forms move the same elements and the compilers emit the
    same arithmetic: the results are identical bit for bit (measured)."""
    (y14, s14), (y26, s26) = outputs["macOS 14 build"], outputs["macOS 26 build"]
    assert torch.equal(y26, y14)
    assert torch.equal(s26, s14)

"""SIMD-group async copies on the CPU (air/async_copies.py, csrc/cpu/async_copy.cpp).
The real kernels that use them (diffusion-rs's MFA GEMMs) are in test_public_corpus_kernels.py;
here the copy itself, edge tiles and clamp modes, and the refusal of call sites whose offset
or clamp mode is not known."""

import ctypes

import pytest
import torch

import torch_metallib as tm
from torch_metallib import _C
from torch_metallib.air.async_copies import check_async_copy_calls

U64 = ctypes.c_uint64
COPY = ctypes.CFUNCTYPE(None, U64, ctypes.c_void_p, U64, U64, U64, U64, ctypes.c_void_p, U64, U64, U64, U64,
                        ctypes.c_int32)(_C.runtime_symbols()["tm_rt_async_copy_2d"])


def copy_tile(src: torch.Tensor, width: int, height: int, clamp: int, dst_shape=(6, 8)) -> torch.Tensor:
    """Copies src[:height, :width] into a fresh dst tile of dst_shape (rows, columns)."""
    dst = torch.full(dst_shape, -1.0)
    COPY(4, dst.data_ptr(), dst.shape[1], 1, dst.shape[1], dst.shape[0],
         src.data_ptr(), src.shape[1], 1, width, height, clamp)
    return dst


def test_tile_inside_the_source_is_copied():
    src = torch.arange(100, dtype=torch.float32).view(10, 10)
    assert torch.equal(copy_tile(src, 8, 6, 0), src[:6, :8])


def test_edge_tile_is_zero_filled_with_clamp_to_zero():
    src = torch.arange(100, dtype=torch.float32).view(10, 10)
    expected = torch.zeros(6, 8)
    expected[:4, :5] = src[:4, :5]
    assert torch.equal(copy_tile(src, 5, 4, 0), expected)


def test_edge_tile_repeats_the_last_row_and_column_with_clamp_to_edge():
    src = torch.arange(100, dtype=torch.float32).view(10, 10)
    rows, cols = torch.arange(6).clamp(max=3), torch.arange(8).clamp(max=4)
    assert torch.equal(copy_tile(src, 5, 4, 1), src[rows][:, cols])


CALL = ("%1 = call ptr @air.simdgroup_async_copy_2d.p3i8.p1i8(i64 4, i64 4, ptr addrspace(3) %a, i64 8, i64 1, "
        "<2 x i64> %t, ptr addrspace(1) %b, i64 8, i64 1, <2 x i64> %s, {tail}) #3")


def test_known_offset_and_clamp_modes_compile():
    for tail in ("<2 x i64> zeroinitializer, i32 0", "<2 x i64> zeroinitializer, i32 1"):
        check_async_copy_calls(CALL.format(tail=tail), "k")


@pytest.mark.parametrize("tail", ["<2 x i64> zeroinitializer, i32 2", "<2 x i64> <i64 1, i64 0>, i32 0",
                                  "<2 x i64> %offset, i32 0"])
def test_unknown_offset_or_clamp_mode_is_refused(tail):
    with pytest.raises(tm.UnsupportedKernelError, match="async copy with an offset or clamp mode"):
        check_async_copy_calls(CALL.format(tail=tail), "k")

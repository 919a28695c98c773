"""Scaled dot-product attention for many queries per head (steel_attention.h:
steel_attention_{T}_bq32_bk{BK}_bd{D}_bv{Dv}_wm4_wn{WN}_mask{M}), as MLX's
``fast.scaled_dot_product_attention`` launches it for prefill
(sdpa_full_self_attention_metal): one threadgroup of (32, WM, WN) threads per block of BQ = 32
queries of one head, grid (ceil(Tq / 32), Hq, B) threadgroups. Each threadgroup walks the keys
in blocks of BK, keeping a running max and sum (flash attention), in float32.

The sizes go in an AttnParams struct (buffer 4): the block counts, the remainders of the last
query and key blocks (used where the function constants align_Q / align_K say the lengths
are not whole blocks), qL_off = Tk - Tq (causal masks align to the end: query i sees keys
0 .. Tk - Tq + i) and the (batch, head, row) strides of Q, K, V and O. An array mask comes
with AttnMaskParams (buffer 5): its (batch, head, row) strides, 0 along a dimension it is
broadcast over; its key dimension is read with stride 1. Additive masks have the queries'
dtype (kernels ..._mask{T}), boolean masks their own kernels (..._maskbool_, False drops
the key).

A kernel is compiled for one key head dimension D and one value head dimension Dv and
reads that many elements per row, so both are preconditions; there are three operators
per (D, Dv): no mask, an additive mask, a boolean mask; float32, float16 and bfloat16, but
no float32 at D = 192 (see steel_dtypes).
"""

import torch

from .. import ops

__all__ = ["define_steel_attention", "STEEL_HEAD_DIMS", "steel_dtypes"]

BQ, WM = 32, 4
# (D, Dv) -> BK, as MLX picks it (bd < 128: 32, else 16); D = 256 splits the head
# dimension over WN = 2 SIMD-groups per row block.
STEEL_HEAD_DIMS = {(64, 64): 32, (72, 72): 32, (80, 80): 32, (96, 64): 32, (96, 96): 32, (128, 128): 16,
                   (192, 192): 16, (256, 256): 16}
_TYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def steel_dtypes(d: int, dv: int) -> list:
    """The dtypes with a kernel that can launch: float32 at D = 192 declares 40,448 bytes of
    threadgroup memory, more than a Metal threadgroup has (32 KB), so the binding plan
    refuses it (MLX runs its unfused path at D = 192 beyond 8 queries)."""
    return [dtype for dtype in _TYPE_NAMES if not (dtype == torch.float32 and d == 192)]


def _kernels(d: int, dv: int, mask_type=None) -> dict:
    bk, wn = STEEL_HEAD_DIMS[(d, dv)], 2 if d == 256 else 1
    return {dtype: f"steel_attention_{_TYPE_NAMES[dtype]}_bq{BQ}_bk{bk}_bd{d}_bv{dv}_wm{WM}_wn{wn}_mask"
                   f"{mask_type or _TYPE_NAMES[dtype]}" for dtype in steel_dtypes(d, dv)}


def _strides(name: str) -> tuple:
    """(batch, head, row) strides of a contiguous 4-D tensor: the operator passes it so."""
    return tuple(ops.stride(name, i) for i in range(3))


def _broadcast_strides(name: str) -> tuple:
    """(batch, head, row) strides of the mask, 0 along a dimension of size 1 (broadcast)."""
    return tuple(ops.stride(name, i) * (ops.size(name, i) != 1) for i in range(3))


def _fits(name: str, i: int, full):
    """size(name, i) is 1 (broadcast) or `full`."""
    return (ops.size(name, i) == 1) + (ops.size(name, i) == full) >= 1


def define_steel_attention(lib, ns: str) -> dict:
    size = ops.size
    b, hq, tq, tk = size("q", 0), size("q", 1), size("q", 2), size("k", 2)
    defined = {}
    for (d, dv), bk in STEEL_HEAD_DIMS.items():
        wn = 2 if d == 256 else 1
        nq, nk = ops.cdiv(tq, BQ), ops.cdiv(tk, bk)
        o_strides = (hq * tq * dv, tq * dv, dv)   # the output, (B, Hq, Tq, Dv) contiguous
        params = ops.struct(B=b, H=hq, D=d, qL=tq, kL=tk, gqa_factor=hq // size("k", 1), scale="scale", NQ=nq,
                            NK=nk, NQ_aligned=tq // BQ, NK_aligned=tk // bk, qL_rem=tq % BQ, kL_rem=tk % bk,
                            qL_off=tk - tq, Q_strides=_strides("q"), K_strides=_strides("k"),
                            V_strides=_strides("v"), O_strides=o_strides)
        shapes = [ops.dim("q") == 4, ops.dim("k") == 4, ops.dim("v") == 4,
                  size("q", 3) == d, size("k", 3) == d, size("v", 3) == dv,
                  size("k", 0) == b, size("v", 0) == b, size("k", 1) >= 1, size("v", 1) == size("k", 1),
                  size("v", 2) == tk, hq % size("k", 1) == 0, tq >= 1, tk >= 1,
                  # a causal block whose queries see no key would divide by an empty sum
                  ops.arg("causal") * tq <= tk]
        mask_shape = [ops.dim("mask") == 4, _fits("mask", 0, b), _fits("mask", 1, hq), _fits("mask", 2, tq),
                      size("mask", 3) == tk]
        common = dict(outputs={"O": ops.empty((b, hq, tq, dv), "q")},
                      threads=(nq * 32, hq * WM, b * wn), group_size=(32, WM, wn))
        constants = dict(align_Q=tq % BQ == 0, align_K=tk % bk == 0, do_causal="causal", has_sinks=False,
                         save_lse=False)
        base = f"steel_attention_{d}_{dv}"
        defined[base] = ops.define(
            f"{ns}::{base}(Tensor q, Tensor k, Tensor v, float scale, bool causal) -> Tensor", lib, _kernels(d, dv),
            bind={"Q": "q", "K": "k", "V": "v", "params": params}, constants=dict(constants, has_mask=False),
            require=shapes, **common)
        for suffix, mask_type in (("mask", None), ("bool_mask", "bool_")):
            defined[f"{base}_{suffix}"] = ops.define(
                f"{ns}::{base}_{suffix}(Tensor q, Tensor k, Tensor v, Tensor mask, float scale, bool causal) -> Tensor",
                lib, _kernels(d, dv, mask_type),
                bind={"Q": "q", "K": "k", "V": "v", "params": params,
                      "mask_params": ops.struct(M_strides=_broadcast_strides("mask"))},
                constants=dict(constants, has_mask=True), require=shapes + mask_shape, **common)
    return defined

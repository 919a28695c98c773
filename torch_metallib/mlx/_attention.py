"""Scaled dot-product attention for a few queries per head (sdpa_vector.h:
sdpa_vector_{type}_{D}_{Dv}), as MLX's ``fast.scaled_dot_product_attention`` launches it
for decoding: one threadgroup of 1,024 threads (32 SIMD-groups, each taking every 32nd key)
per query head and query, grid (B * Hq * 1024, Tq, 1).

A kernel is compiled for one key head dimension D and one value head dimension Dv and
reads and writes that many elements per head whatever the tensors hold, so both are
preconditions; there is one operator per (D, Dv) MLX builds. Keys and values are shared
by Hq / Hkv query heads (grouped-query attention). ``causal`` aligns the mask to the end,
as MLX does: query i of Tq sees keys 0 .. N - Tq + i.
"""

import torch

from .. import ops

__all__ = ["define_attention", "HEAD_DIMS"]

HEAD_DIMS = [(64, 64), (96, 64), (96, 96), (128, 128), (192, 128), (192, 192), (256, 256), (512, 512)]
_TYPE_NAMES = {torch.float32: "float", torch.float16: "float16_t", torch.bfloat16: "bfloat16_t"}
GROUP = 1024


def define_attention(lib, ns: str) -> dict:
    size = ops.size
    defined = {}
    for d, dv in HEAD_DIMS:
        name = f"sdpa_vector_{d}_{dv}"
        defined[name] = ops.define(
            f"{ns}::{name}(Tensor q, Tensor k, Tensor v, float scale, bool causal) -> Tensor", lib,
            {dtype: f"sdpa_vector_{type_name}_{d}_{dv}" for dtype, type_name in _TYPE_NAMES.items()},
            bind={"queries": "q", "keys": "k", "values": "v", "gqa_factor": size("q", 1) // size("k", 1),
                  "N": size("k", 2), "k_head_stride": size("k", 2) * size("k", 3), "k_seq_stride": size("k", 3),
                  "v_head_stride": size("v", 2) * size("v", 3), "v_seq_stride": size("v", 3)},
            outputs={"out": ops.empty((size("q", 0), size("q", 1), size("q", 2), size("v", 3)), "q")},
            constants=dict(has_mask=False, query_transposed=False, do_causal="causal", bool_mask=False,
                           float_mask=False, has_sinks=False),
            threads=(size("q", 0) * size("q", 1) * GROUP, size("q", 2), 1), group_size=(GROUP, 1, 1),
            require=[ops.dim("q") == 4, ops.dim("k") == 4, ops.dim("v") == 4,
                     size("q", 3) == d, size("k", 3) == d, size("v", 3) == dv,
                     size("k", 0) == size("q", 0), size("v", 0) == size("q", 0),
                     size("v", 1) == size("k", 1), size("v", 2) == size("k", 2), size("k", 2) >= 1,
                     size("k", 1) >= 1, size("q", 1) % size("k", 1) == 0])
    return defined

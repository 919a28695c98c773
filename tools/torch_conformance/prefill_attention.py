"""PyTorch's prefill (steel, MLX-style flash) attention kernels (Attention.metal), as Attention.mm calls them.

``prefill_attention_<T>_bq<BQ>_bk<BK>_bd<D>_wm<WM>_wn<WN>_hm<0|1>_dc<0|1>_mask<M>``: no function
constants; everything is in the name and in ``PrefillAttnParams`` (B, H, D, qL, kL,
gqa_factor, scale, softcapping, then Q/K/V/O strides (batch, head, sequence) in elements, the
head dimension contiguous) and ``PrefillAttnMaskParams`` (``M_strides``: batch, head, query,
key; the kernel reads the key dimension with stride 1 and never reads ``M_strides[3]``).

* Threadgroups (ceil(qL / BQ), H, B) of WM * WN * 32 threads; the kv head is
  ``head / gqa_factor``.
* Q is multiplied by ``T(scale * log2(e))`` and rounded to T (AIR: ``fmul float %scale,
  0x3FF7154760000000`` then ``fptrunc float to half`` before the threadgroup tile is scaled in
  place): scores are in base 2, accumulated in float, softmax with ``fast::exp2``.
* ``hm1``: ``mask<float16|bfloat16|float32>`` is added to the score after a multiply by
  log2(e) (AIR: ``llvm.fmuladd.f32(mask, 0x3FF7154760000000, score)``), i.e. in natural
  units like SDPA's additive mask; ``maskbool_`` attends where the mask is true.
  ``hm0`` kernels ignore ``mask`` and ``mask_params`` (reflected unused).
* ``dc1``: top-left causal (query r sees keys 0..r, whatever qL and kL are).
* ``softcapping``: 1.0 means none (the host's value; tanh capping is not checked).

The reference is ``torch.nn.functional.scaled_dot_product_attention`` in float64 on the same
(rounded) inputs, with Q replaced by the kernel's rounded ``T(Q * T(scale * log2 e))`` and
scale ln 2 (that is the kernel's base-2 softmax exactly), the same mask, causality and GQA.
Output O is written through strides (stored (B, qL, H, D)) inside sentinel storage.
"""

import math
import re
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from .buffers import sentinel_view, untouched
from .compare import mismatch
from .inputs import generator, values
from .structs import argument, pack

_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
_NAME = re.compile(r"^prefill_attention_(float16|bfloat16|float32)_bq(\d+)_bk(\d+)_bd(\d+)_wm(\d+)_wn(\d+)"
                   r"_hm([01])_dc([01])_mask(float16|bfloat16|float32|bool_)$")
# (B, H, H_kv, qL, kL): partial query and key blocks, GQA, qL != kL (causal top-left).
_CASES = [(1, 2, 1, 37, 45), (2, 2, 2, 20, 13)]
_LOG2E = 1.44269504089


def parse(name: str) -> Optional[Tuple]:
    match = _NAME.match(name)
    if not match:
        return None
    t, bq, bk, bd, wm, wn, hm, dc, mask = match.groups()
    return ("prefill_attention", _DTYPES[t], int(bq), int(bk), int(bd), int(wm), int(wn), hm == "1", dc == "1",
            torch.bool if mask == "bool_" else _DTYPES[mask])


def _reference(queries, keys, vals, mask, causal, scale, h, hkv, t):
    # The kernel's scaled, rounded Q (float scale * log2e, rounded to T; Q * that in T).
    factor = torch.tensor(scale, dtype=torch.float32) * torch.tensor(_LOG2E, dtype=torch.float32)
    factor = factor.to(t)
    q2 = (queries * factor).double()  # T * T, rounded once to T: the kernel's TransformScale<T>
    attn_mask = None
    if mask is not None:
        attn_mask = mask if mask.dtype == torch.bool else mask.double()
    return F.scaled_dot_product_attention(q2, keys.double(), vals.double(), attn_mask=attn_mask, is_causal=causal,
                                          scale=math.log(2), enable_gqa=h != hkv)


def check(function, device: str) -> Tuple[str, str]:
    if device != "cpu":
        raise NotImplementedError("CPU tensors only")
    _, t, bq, bk, d, wm, wn, has_mask, causal, mask_t = parse(function.name)
    gen = generator(function.name)
    group = wm * wn * 32
    for b, h, hkv, ql, kl in _CASES:
        scale = 1 / math.sqrt(d) * 1.5
        queries = values(b * h * ql * d, t, "unit", gen).reshape(b, h, ql, d)
        # Keys and values stored (B, kL, H_kv, D): heads and sequence by strides.
        keys = values(b * kl * hkv * d, t, "unit", gen).reshape(b, kl, hkv, d).transpose(1, 2)
        vals = values(b * kl * hkv * d, t, "any", gen).reshape(b, kl, hkv, d).transpose(1, 2)
        mask = None
        if has_mask and mask_t == torch.bool:
            mask = torch.rand(b, 1, ql, kl, generator=gen) < 0.6
            mask[..., 0] = True  # no fully masked query
            mask = mask.expand(b, h, ql, kl)  # head stride 0
        elif has_mask:
            mask = (torch.rand(b, h, ql, kl, generator=gen, dtype=torch.float64) * -3).to(mask_t)
        storage, out = sentinel_view((b, h, ql, d), t, order=(0, 2, 1, 3))
        strides = lambda x: (x.stride(0), x.stride(1), x.stride(2))  # noqa: E731
        params = pack(argument(function, "params"), dict(
            B=b, H=h, D=d, qL=ql, kL=kl, gqa_factor=h // hkv, scale=scale, softcapping=1.0,
            Q_strides=strides(queries), K_strides=strides(keys), V_strides=strides(vals), O_strides=strides(out)))
        m = mask if mask is not None else torch.zeros(1, dtype=mask_t)
        m_strides = tuple(mask.stride()) if mask is not None else (0, 0, 0, 0)
        mask_params = pack(argument(function, "mask_params"), dict(M_strides=m_strides))
        function(queries, keys, vals, out, params, mask_params, m,
                 threads=(-(-ql // bq) * group, h, b), group_size=(group, 1, 1))
        want = _reference(queries, keys, vals, mask, causal, scale, h, hkv, t)
        label = f"B={b} H={h} H_kv={hkv} qL={ql} kL={kl}"
        if not untouched(storage, out):
            return "wrong", f"{label}: O written outside its elements"
        problem = mismatch(out.flatten(), want.flatten(), "special")
        if problem:
            return "wrong", f"{label}: O: {problem}"
    return "correct", ""

"""PyTorch's vector scaled-dot-product-attention kernels (Attention.metal), as Attention.mm calls them.

Layout and masking are read from torch 2.13's AIR (the stored source is older; its
``has_mask`` flag and ``uint3 mask_strides`` are gone):

* ``sdpa_vector_<T>_<D>_<V>_<mask>``: one threadgroup of 32 SIMD-groups (1,024 threads) per
  (batch * heads, query): threadgroups (B * H, Q, 1). Queries, keys and values by element
  strides: ``qkv_head_strides``, ``qkv_seq_strides`` (x, y, z = q, k, v) and
  ``qkv_batch_strides_heads`` (x, y, z = q, k, v batch strides, w = H); the kv head is
  ``head / gqa_factor``; ``out`` is contiguous (B, H, Q, V). ``N``: keys.
* ``<mask>``: ``masknone``; ``masknone_causal`` skips key i > query index (``icmp sgt`` of the
  key index against ``tid.y``: torch's top-left causal mask); ``maskbool`` attends where
  the mask is true; ``mask<T>`` is added to the scaled score (``fadd`` after
  ``simd_sum``). ``uint4 mask_strides``: x = key, y = query, z = head, w = batch (AIR:
  offset ``x * key + y * tid.y + w * batch + z * head``), in elements.
* ``sdpa_vector_2pass_1_<T>_<D>_<V>_<mask>``: threadgroups (B * H, Q, 32) of 8 SIMD-groups;
  block b takes keys ``i`` with ``(i / 8) % 32 == b``; writes its unnormalised partial
  output (T, (B, H, Q, 32, V)), and float ``sums`` and ``maxs`` ((B, H, Q, 32)) of its
  scaled scores.
* ``sdpa_vector_2pass_2_<T>_<D>``: threadgroups (B * H, Q) of 1,024 threads; combines the
  32 partials into ``out``.

The reference is ``torch.nn.functional.scaled_dot_product_attention`` in float64 with the
same mask, causality, scale and GQA, on the same (rounded) inputs; for ``2pass_1`` the
per-block max, sum of exponentials and partial output in float64; ``2pass_2`` runs on
``2pass_1``'s (masknone) outputs and is compared with the full attention.
"""

import math
import re
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from .buffers import sentinel_view, untouched
from .compare import mismatch
from .dtypes import METAL_DTYPES
from .inputs import generator, values

_T = r"(float|half|bfloat)"
_NAME = re.compile(rf"^sdpa_vector(?:_(2pass_1))?_{_T}_(\d+)_(\d+)_mask(none_causal|none|bool|float|half|bfloat)$")
_PASS2 = re.compile(rf"^sdpa_vector_2pass_2_{_T}_(\d+)$")
_BLOCKS, _BN = 32, 8
# (B, H, H_kv, Q, N): GQA, several queries; single pass over more than 32 keys, two passes
# over more than 32 blocks of 8.
_CASES = {"single": [(1, 2, 2, 1, 5), (2, 4, 2, 3, 70)], "2pass": [(1, 2, 1, 2, 300), (2, 2, 2, 1, 257)]}


def parse(name: str) -> Optional[Tuple]:
    match = _NAME.match(name)
    if match:
        scheme, t, d, v, mask = match.groups()
        if mask not in ("none_causal", "none", "bool") and mask != t:
            return None
        return ("sdpa_vector" + ("_2pass" if scheme else ""), scheme or "single", METAL_DTYPES[t], int(d), int(v),
                mask)
    match = _PASS2.match(name)
    if match:
        t, d = match.groups()
        return "sdpa_vector_2pass", "2pass_2", METAL_DTYPES[t], int(d), int(d), "none"
    return None


def _inputs(gen, t, shape, d, v, mask_kind):
    b, h, hkv, q, n = shape
    queries = values(b * h * q * d, t, "unit", gen).reshape(b, h, q, d)
    # Keys and values stored (B, N, H_kv, D): heads and sequence by strides.
    keys = values(b * n * hkv * d, t, "unit", gen).reshape(b, n, hkv, d).transpose(1, 2)
    vals = values(b * n * hkv * v, t, "any", gen).reshape(b, n, hkv, v).transpose(1, 2)
    mask = None
    if mask_kind == "bool":
        mask = torch.rand(b, 1, q, n, generator=gen) < 0.6
        mask[..., 0] = True  # no fully masked query
        mask = mask.expand(b, h, q, n)  # head stride 0
    elif mask_kind not in ("none", "none_causal"):
        mask = (torch.rand(b, h, q, n, generator=gen, dtype=torch.float64) * -3).to(t)
    return queries, keys, vals, mask


def _common(queries, keys, vals, mask, h, hkv, n, scale):
    kw = dict(gqa_factor=h // hkv, N=n, scale=scale,
              qkv_head_strides=(queries.stride(1), keys.stride(1), vals.stride(1)),
              qkv_seq_strides=(queries.stride(2), keys.stride(2), vals.stride(2)),
              qkv_batch_strides_heads=(queries.stride(0), keys.stride(0), vals.stride(0), h))
    if mask is not None:
        kw.update(mask=mask, mask_strides=(mask.stride(3), mask.stride(2), mask.stride(1), mask.stride(0)))
    return kw


def _reference(queries, keys, vals, mask, causal, scale, h, hkv):
    attn_mask = None
    if mask is not None:
        attn_mask = mask if mask.dtype == torch.bool else mask.double()
    return F.scaled_dot_product_attention(queries.double(), keys.double(), vals.double(), attn_mask=attn_mask,
                                          is_causal=causal, scale=scale, enable_gqa=h != hkv)


def _blocks(queries, keys, vals, mask, causal, scale, h, hkv):
    """Per block of 2pass_1, in float64: (max, sum of exp(score - max), partial output)."""
    g = h // hkv
    k, v = keys.double().repeat_interleave(g, 1), vals.double().repeat_interleave(g, 1)
    scores = (queries.double() * scale) @ k.transpose(-1, -2)
    n, q = scores.shape[-1], scores.shape[-2]
    allowed = torch.ones_like(scores, dtype=torch.bool)
    if mask is not None and mask.dtype == torch.bool:
        allowed = mask.expand_as(scores).clone()
    elif mask is not None:
        scores = scores + mask.double()
    if causal:
        allowed &= torch.arange(n) <= torch.arange(q)[:, None]
    member = ((torch.arange(n) // _BN) % _BLOCKS)[:, None] == torch.arange(_BLOCKS)  # (N, 32)
    keep = allowed.unsqueeze(-2) & member.t()  # (B, H, Q, 32, N)
    s = scores.unsqueeze(-2).expand_as(keep).masked_fill(~keep, -math.inf)
    maxs = s.amax(-1)
    e = (s - maxs.unsqueeze(-1)).exp().nan_to_num(0.0)
    return maxs, e.sum(-1), torch.einsum("bhqkn,bhnv->bhqkv", e, v)


def _compare(label, pieces):
    for what, storage, got, want, tolerance in pieces:
        if not untouched(storage, got):
            return "wrong", f"{label}: {what} written outside its elements"
        problem = mismatch(got.flatten(), want.flatten(), tolerance)
        if problem:
            return "wrong", f"{label}: {what}: {problem}"
    return None


def check(function, device: str) -> Tuple[str, str]:
    if device != "cpu":
        raise NotImplementedError("CPU tensors only")
    _, scheme, t, d, v, mask_kind = parse(function.name)
    gen = generator(function.name)
    causal = mask_kind == "none_causal"
    for shape in _CASES["single" if scheme == "single" else "2pass"]:
        b, h, hkv, q, n = shape
        scale = 1 / math.sqrt(d) * 1.5
        queries, keys, vals, mask = _inputs(gen, t, shape, d, v, mask_kind)
        label = f"B={b} H={h} H_kv={hkv} Q={q} N={n}"
        want = _reference(queries, keys, vals, mask, causal, scale, h, hkv)
        kw = _common(queries, keys, vals, mask, h, hkv, n, scale)
        if scheme == "single":
            storage, out = sentinel_view((b, h, q, v), t)
            function(queries, keys, vals, out, threads=(b * h * 1024, q, 1), group_size=(1024, 1, 1), **kw)
            # Scores and softmax in float (precise::exp), output rounded once.
            bad = _compare(label, [("out", storage, out, want, "special")])
        elif scheme == "2pass_1":
            p_storage, partials = sentinel_view((b, h, q, _BLOCKS, v), t)
            s_storage, sums = sentinel_view((b, h, q, _BLOCKS), torch.float32)
            m_storage, maxs = sentinel_view((b, h, q, _BLOCKS), torch.float32)
            function(queries, keys, vals, partials, sums, maxs, threads=(b * h * 256, q, _BLOCKS),
                     group_size=(256, 1, 1), **kw)
            want_max, want_sum, want_out = _blocks(queries, keys, vals, mask, causal, scale, h, hkv)
            # A block with no key attended: the kernel's max is -inf or its -1e9 stand-in;
            # its sum and partial output are 0.
            empty = want_max == -math.inf
            got_max = torch.where(empty, torch.full_like(maxs, -math.inf), maxs)
            bad = _compare(label, [("partials", p_storage, partials, want_out, "special"),
                                   ("sums", s_storage, sums, want_sum, "special")])
            if bad is None and mismatch(got_max.flatten(), want_max.flatten(), "special"):
                bad = "wrong", f"{label}: maxs: {mismatch(got_max.flatten(), want_max.flatten(), 'special')}"
            if bad is None and not untouched(m_storage, maxs):
                bad = "wrong", f"{label}: maxs written outside its elements"
        else:
            # 2pass_2 combines what 2pass_1 (masknone) writes: inputs in float64 from the
            # reference, rounded to the kernel's types.
            want_max, want_sum, want_out = _blocks(queries, keys, vals, None, False, scale, h, hkv)
            partials, sums, maxs = want_out.to(t), want_sum.float(), want_max.float()
            storage, out = sentinel_view((b, h, q, v), t)
            function(partials, sums, maxs, out, threads=(b * h * 1024, q, 1), group_size=(1024, 1, 1))
            want = _reference(queries, keys, vals, None, False, scale, h, hkv)
            bad = _compare(label, [("out", storage, out, want, "special")])
        if bad:
            return bad
    return "correct", ""

"""PyTorch's merge sort and top-k kernels (Sort.metal, SortTopK, host code Sort.mm), run
as the host runs them and compared with torch.sort / torch.topk.

Names: ``<kind>_<T>_tptg<TPTG>[_u16][_stable]``. Every kernel sorts ``TN = 4`` elements per
thread, ``ELEMS = TPTG * 4`` per threadgroup, one-dimensional groups of TPTG threads; rows
go on ``gid.y``. The reflected signatures (torch 2.13, macos14) are:

* ``sort_block`` (one group per row, size <= ELEMS): ``inp, out_vals, out_idx (long),
  int size, long2 strides = (stride_sort, stride_seg), bool desc``; outputs contiguous
  [rows, size]. ``sort_block_topk`` adds ``int2 sel = (offset, count)`` ({0, k} for topk)
  and writes the sorted ranks [offset, offset + count) to [rows, count]; it is unstable.
* multi-block: ``mb_sort_block`` (same arguments; ``dv`` T, ``di`` uint or ushort for
  ``_u16``) sorts each ELEMS block of each row into [rows, size] contiguous buffers; then
  ``mb_merge`` passes ``(vi, ii, vo, io, int3 dims = (size, merge_tiles, n_blocks), desc)``
  with merge_tiles = 2, 4, ... while merge_tiles / 2 < n_blocks, ping-ponging the buffers;
  the last pass is ``mb_merge_final`` (long indices) or ``mb_merge_final_topk`` (+ ``sel``,
  output [rows, count]). The merges are stable (ties take the first run), so the pipeline
  is stable when its block sort is.
* ``_fkey`` (float: uint keys, half/bfloat: ushort keys): ``mb_sort_block_fkey`` writes
  ``to_radix_key(value, desc)``, which orders ascending whatever ``desc``; the intermediate
  merges are the key type's own ``mb_merge_<key>`` with desc = false, and
  ``mb_merge_final[_topk]_fkey`` decodes with the real ``desc``. Unstable.

Order is torch's: NaN greatest (last ascending, first descending). Stable kernels must
give torch.sort(stable=True)'s indices; unstable ones its values, and indices that are
distinct and point at those values. Every output and intermediate buffer has sentinel bytes
either side and starts as sentinel bytes inside.
"""

import re
from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from .buffers import bits, sibling
from .dtypes import METAL_DTYPES
from .inputs import generator

_PAD = 16
_SENTINEL = 0xA5
_KINDS = ("sort_block_topk", "sort_block", "mb_sort_block_fkey", "mb_sort_block", "mb_merge_final_topk_fkey",
          "mb_merge_final_topk", "mb_merge_final_fkey", "mb_merge_final", "mb_merge")
_TYPES = "|".join(k for k in METAL_DTYPES if k not in ("half2", "float2"))
_NAME = re.compile(rf"^({'|'.join(_KINDS)})_({_TYPES})_tptg(\d+)(_u16)?(_stable)?$")
_KEY = {"float": "uint", "half": "ushort", "bfloat": "ushort"}  # INSTANTIATE_FKEY_ALL


@dataclass
class Parsed:
    kind: str
    tname: str
    dtype: torch.dtype
    tptg: int
    u16: bool
    stable: bool

    @property
    def elems(self) -> int:
        return self.tptg * 4


def parse(name: str) -> Optional[Parsed]:
    m = _NAME.match(name)
    if not m:
        return None
    kind, tname, tptg, u16, stable = m.groups()
    return Parsed(kind, tname, METAL_DTYPES[tname], int(tptg), bool(u16), bool(stable))


def family(name: str) -> Optional[str]:
    p = parse(name)
    return p.kind if p else None


# --- buffers and inputs ------------------------------------------------------------------

class Buffer:
    """A [rows, n] tensor with _PAD sentinel elements either side, its inside sentinel too."""

    def __init__(self, dtype: torch.dtype, rows: int, n: int):
        size = torch.empty((), dtype=dtype).element_size()
        self.raw = torch.full((((rows * n) + 2 * _PAD) * size,), _SENTINEL, dtype=torch.uint8)
        self.edge = _PAD * size
        self.tensor = self.raw[self.edge:self.raw.numel() - self.edge].view(dtype).view(rows, n)

    def untouched(self) -> bool:
        return bool((self.raw[:self.edge] == _SENTINEL).all() and (self.raw[-self.edge:] == _SENTINEL).all())


def _inputs(dtype: torch.dtype, count: int, gen: torch.Generator) -> torch.Tensor:
    """Few distinct values (many ties, so stability shows) and each end of the type's range,
    where the kernels' padding (NaN or -inf, the type's max or lowest) lives."""
    if dtype == torch.bool:
        return torch.rand(count, generator=gen) < 0.5
    if dtype.is_floating_point:
        x = torch.randint(-24, 25, (count,), generator=gen).double() / 4
        special = torch.tensor([float("nan"), float("inf"), float("-inf"), -0.0, 0.0], dtype=torch.float64)
        where = torch.rand(count, generator=gen) < 0.04
        x[where] = special[torch.randint(0, 5, (int(where.sum()),), generator=gen)]
        return x.to(dtype)
    info = torch.iinfo(dtype) if dtype != torch.uint64 else None
    x = torch.randint(0, 50, (count,), generator=gen)
    if dtype.is_signed:
        x -= 25
    x = x.to(dtype) if dtype != torch.uint64 else x
    where = (torch.rand(count, generator=gen) < 0.04).nonzero().flatten()
    for j, i in enumerate(where.tolist()):
        if dtype == torch.uint64:
            x[i] = -1 if j % 2 else 0  # viewed as ulong: the max, and 0
        else:
            x[i] = info.max if j % 2 else info.min
    return x.view(torch.uint64) if dtype == torch.uint64 else x


def _ordered(x: torch.Tensor) -> torch.Tensor:
    """`x` in a dtype torch sorts the same way: float64 (NaN greatest), int64 (ulong with its
    sign bit flipped)."""
    if x.dtype == torch.uint64:
        return x.view(torch.int64) ^ torch.iinfo(torch.int64).min
    if x.dtype.is_floating_point:
        return x.double()
    return x.to(torch.int64)


def _same(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a, b = _ordered(a), _ordered(b)
    if a.dtype == torch.float64:
        return (a == b) | (a.isnan() & b.isnan())
    return a == b


def _first(mask: torch.Tensor) -> Tuple[int, int]:
    r, c = (~mask).nonzero()[0].tolist()
    return r, c


_SIGNED = {torch.uint16: torch.int16, torch.uint32: torch.int32, torch.uint64: torch.int64}


def _gather(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x.gather(1, index), also for the unsigned dtypes torch's CPU gather lacks."""
    if x.dtype in _SIGNED:
        return x.view(_SIGNED[x.dtype]).gather(1, index).view(x.dtype)
    return x.gather(1, index)


def check_sorted(x: torch.Tensor, vals: torch.Tensor, idx: torch.Tensor, desc: bool, stable: bool,
                 offset: int = 0, order: Optional[torch.Tensor] = None) -> Optional[str]:
    """`vals`, `idx` [rows, count] against ranks [offset, offset + count) of x [rows, size]
    sorted as torch does (or as `order`, x's values in a sortable dtype, sorts). Stable: the
    exact indices; else the values, and distinct indices into the row that point at them."""
    count = vals.shape[1]
    _, ref_idx = torch.sort(_ordered(x if order is None else order), dim=1, descending=desc, stable=True)
    ref_idx = ref_idx[:, offset:offset + count]
    if stable:
        ok = idx.to(torch.int64) == ref_idx
        if not bool(ok.all()):
            r, c = _first(ok)
            return f"row {r} rank {offset + c}: index {int(idx[r, c])}, torch.sort(stable) {int(ref_idx[r, c])}"
        ok = (bits(vals) == bits(_gather(x, ref_idx))).view(vals.shape)  # -0.0 and 0.0 too
        if x.dtype.is_floating_point:  # NaN payloads are no op's meaning (as buffers.exact)
            ok |= vals.isnan() & _gather(x, ref_idx).isnan()
        if not bool(ok.all()):
            r, c = _first(ok)
            return f"row {r} rank {offset + c}: value {vals[r, c].item()!r}, expected {x[r, ref_idx[r, c]].item()!r}"
        return None
    ok = _same(vals, _gather(x, ref_idx))
    if not bool(ok.all()):
        r, c = _first(ok)
        return f"row {r} rank {offset + c}: value {vals[r, c].item()!r}, expected {x[r, ref_idx[r, c]].item()!r}"
    i = idx.to(torch.int64)
    inside = (i >= 0) & (i < x.shape[1])
    if not bool(inside.all()):
        r, c = _first(inside)
        return f"row {r} rank {offset + c}: index {int(i[r, c])} outside the row of {x.shape[1]}"
    ok = _same(_gather(x, i), vals)
    if not bool(ok.all()):
        r, c = _first(ok)
        return f"row {r} rank {offset + c}: index {int(i[r, c])} holds {x[r, i[r, c]].item()!r}, value {vals[r, c].item()!r}"
    s = i.sort(dim=1).values
    if count > 1 and not bool((s[:, 1:] != s[:, :-1]).all()):
        r = int((s[:, 1:] == s[:, :-1]).any(1).nonzero()[0])
        return f"row {r}: an index appears twice"
    return None


def _input_layout(x: torch.Tensor, transposed: bool):
    """The tensor to bind and (stride_sort, stride_seg): rows contiguous, or stored [size,
    rows] (sorting along dim 0 of a contiguous tensor)."""
    if transposed:
        stored = x.t().contiguous()
        return stored, (1 * stored.shape[1], 1)
    return x.contiguous(), (1, x.shape[1])



# --- single block ------------------------------------------------------------------------

def _run_single(function, p: Parsed, case, gen) -> Optional[str]:
    rows, size, transposed, desc, k = case
    x = _inputs(p.dtype, rows * size, gen).view(rows, size)
    bound, strides = _input_layout(x, transposed)
    count = size if p.kind == "sort_block" else k
    vals, idx = Buffer(p.dtype, rows, count), Buffer(torch.int64, rows, count)
    args = [bound, vals.tensor, idx.tensor, size, strides, desc]
    if p.kind == "sort_block_topk":
        args.append((0, k))
    function(*args, threads=(p.tptg, rows, 1), group_size=(p.tptg, 1, 1))
    if not (vals.untouched() and idx.untouched()):
        return "wrote outside its outputs"
    return check_sorted(x, vals.tensor, idx.tensor, desc, p.stable)


# --- multi-block -------------------------------------------------------------------------

def _pipeline(function, p: Parsed):
    """The kernels the host chains for `p`: (block sort, intermediate merge, final merge,
    whether stable, whether keyed)."""
    t, n, u = p.tname, p.tptg, "_u16" if p.u16 else ""
    fkey = p.kind.endswith("_fkey")
    topk = "topk" in p.kind
    if fkey:
        block = sibling(function, f"mb_sort_block_fkey_{t}_tptg{n}{u}")
        merge = sibling(function, f"mb_merge_{_KEY[t]}_tptg{n}{u}")
        final = sibling(function, f"mb_merge_final{'_topk' if topk else ''}_fkey_{t}_tptg{n}{u}")
        return block, merge, final, False, True, topk
    stable = p.stable or p.kind != "mb_sort_block"  # merges are checked behind the stable block sort
    block = sibling(function, f"mb_sort_block_{t}_tptg{n}{u}{'_stable' if stable else ''}")
    merge = sibling(function, f"mb_merge_{t}_tptg{n}{u}")
    final = sibling(function, f"mb_merge_final{'_topk' if topk else ''}_{t}_tptg{n}{u}")
    return block, merge, final, stable and not topk, False, topk


def _run_multi(function, p: Parsed, case, gen) -> Optional[str]:
    rows, size, transposed, desc, k = case
    block, merge, final, stable, fkey, topk = _pipeline(function, p)
    e = p.elems
    n_blocks = -(-size // e)
    idx_t = torch.uint16 if p.u16 else torch.int32  # uint binds as int32
    key_t = {"float": torch.int32, "half": torch.int16, "bfloat": torch.int16}[p.tname] if fkey else p.dtype
    x = _inputs(p.dtype, rows * size, gen).view(rows, size)
    bound, strides = _input_layout(x, transposed)
    bufs = [(Buffer(key_t, rows, size), Buffer(idx_t, rows, size)) for _ in range(2)]
    group = dict(threads=(p.tptg * n_blocks, rows, 1), group_size=(p.tptg, 1, 1))
    block(bound, bufs[0][0].tensor, bufs[0][1].tensor, size, strides, desc, **group)
    if not all(b.untouched() for b in bufs[0]):
        return f"{block.name} wrote outside its outputs"
    if not fkey:  # each block sorted on its own
        for b in range(n_blocks):
            lo, hi = b * e, min(size, (b + 1) * e)
            problem = check_sorted(x[:, lo:hi], bufs[0][0].tensor[:, lo:hi],
                                   (bufs[0][1].tensor[:, lo:hi].to(torch.int64) & 0xFFFFFFFF) - lo, desc,
                                   block.name.endswith("_stable"))
            if problem:
                return f"after {block.name}, block {b}: {problem}"
    count = k if topk else size
    vals, idx = Buffer(p.dtype, rows, count), Buffer(torch.int64, rows, count)
    merge_desc = False if fkey else desc
    merge_tiles, src = 2, 0
    while merge_tiles // 2 < n_blocks:
        last = merge_tiles >= n_blocks
        vi, ii = bufs[src][0].tensor, bufs[src][1].tensor
        dims = (size, merge_tiles, n_blocks)
        if last:
            args = [vi, ii, vals.tensor, idx.tensor, dims, desc]
            if topk:
                args.append((0, k))
            final(*args, **group)
        else:
            merge(vi, ii, bufs[1 - src][0].tensor, bufs[1 - src][1].tensor, dims, merge_desc, **group)
            if not all(b.untouched() for b in bufs[1 - src]):
                return f"{merge.name} (merge_tiles {merge_tiles}) wrote outside its outputs"
            src = 1 - src
        merge_tiles *= 2
    if not (vals.untouched() and idx.untouched()):
        return f"{final.name} wrote outside its outputs"
    return check_sorted(x, vals.tensor, idx.tensor, desc, stable)


def _cases(p: Parsed):
    """(rows, size, transposed, desc, k)."""
    e = p.elems
    if p.kind in ("sort_block", "sort_block_topk"):
        sizes = [1, 37, e] if e > 37 else [1, 5, e]
        sizes = sorted(set([1, min(37, e), e - 3 if e > 3 else e, e]))
        cases = []
        for i, size in enumerate(sizes):
            k = max(1, size // 3) if p.kind == "sort_block_topk" else size
            cases.append((3, size, i % 2 == 1, i % 2 == 0, k))
            cases.append((2, size, False, i % 2 == 1, size if p.kind == "sort_block_topk" else size))
        return cases
    cases = [(2, 2 * e, False, False), (2, 3 * e + 37, True, True), (1, 5 * e - 1, False, True),
             (2, 2 * e - 5, False, True)]
    if p.u16 is False and p.dtype.itemsize <= 4 and e <= 512:
        cases.append((1, 9 * e + 1, True, False))
    out = []
    for rows, size, t, d in cases:
        out.append((rows, size, t, d, max(1, size // 3) if "topk" in p.kind else size))
    return out


def check(function, device: str) -> Tuple[str, str]:
    p = parse(function.name)
    gen = generator(function.name)
    runner = _run_single if p.kind in ("sort_block", "sort_block_topk") else _run_multi
    for case in _cases(p):
        problem = runner(function, p, case, gen)
        if problem:
            rows, size, transposed, desc, k = case
            return "wrong", (f"rows {rows} size {size}{' transposed' if transposed else ''} "
                             f"{'desc' if desc else 'asc'}{f' k {k}' if 'topk' in p.kind else ''}: {problem}")
    return "correct", ""

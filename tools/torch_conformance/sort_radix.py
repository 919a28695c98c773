"""PyTorch's LSD radix sort kernels (SortRadix.h, top-k in SortTopK), run pass by pass as
Sort.mm's radix path runs them, against torch.sort.

Per type (INSTANTIATE_RADIX): char, uchar, bool: RTPTG 512, EPT 8, 4-bit digits; half,
bfloat, short, ushort: 1024 x 4, 8 bits (``_tptg512``: 512 x 4); float, int, uint: 512 x
4, 8 bits. ``ELEMS = RTPTG * EPT`` per block, groups of RTPTG threads on (block, row); rows
contiguous. One pass per digit (shift = pass * RBITS), buffers ping-pong:

* ``radix_count(input, histograms, int3 (size, n_blocks, shift), bool desc)``: the
  histogram ``[row][digit][block]`` of ``to_radix_key(key, desc)``'s digit;
* ``radix_scan(histograms, int n_entries = RSIZE * n_blocks)``: one group of 1024 per row,
  exclusive scan in place; or ``radix_count_scan_*_mb4`` (one group per row, n_blocks <= 4)
  for both; or no scan at all, the ``_fused`` scatter scanning the counts itself (n_blocks
  <= kMaxFusedBlocks = 4);
* ``radix_scatter(keys_in, vals_in, keys_out, vals_out, offsets, int3 dims, bool2 (desc,
  first_pass))``: on the first pass the indices are the positions (vals_in unread); the
  last pass is ``_final`` (long indices), or ``_final_topk`` (+ ``int2 sel = (offset,
  count)``, ranks [offset, offset + count) to [rows, count]).

``to_radix_key`` maps NaN to the largest key (the smallest descending) and otherwise orders
by the bit pattern, so -0.0 sorts before 0.0 (key 0x7FFF... vs 0x8000...), where torch.sort
calls them equal: the reference orders -0.0 just below 0.0, else it is torch.sort(stable).
The sort is stable: exact indices. Histograms are checked after every count and scan.
"""

import re
from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from .buffers import sibling
from .dtypes import METAL_DTYPES
from .inputs import generator
from .sorting import Buffer, _inputs, check_sorted

# type -> (RTPTG, EPT, RBITS) as instantiated
_CONFIG = {"char": (512, 8, 4), "uchar": (512, 8, 4), "bool": (512, 8, 4), "half": (1024, 4, 8),
           "bfloat": (1024, 4, 8), "short": (1024, 4, 8), "ushort": (1024, 4, 8), "float": (512, 4, 8),
           "int": (512, 4, 8), "uint": (512, 4, 8)}
_NAME = re.compile(r"^radix_(count_scan|count|scatter_fused_final_topk|scatter_final_topk|scatter_fused_final|"
                   r"scatter_final|scatter_fused|scatter)_(" + "|".join(_CONFIG) +
                   r")_(\d)bit(_tptg512)?(_u16|_mb4)?$")
_FUSED_MAX = 4  # kMaxFusedBlocks, and radix_count_scan's MAX_BLOCKS (mb4)


@dataclass
class Parsed:
    kind: str       # count, count_scan, scan, scatter[_fused][_final][_topk]
    tname: str
    dtype: torch.dtype
    rtptg: int
    ept: int
    rbits: int
    tag: str        # "_8bit" or "_8bit_tptg512"
    u16: bool


def parse(name: str) -> Optional[Parsed]:
    if name == "radix_scan":
        return Parsed("scan", "float", torch.float32, 512, 4, 8, "_8bit", False)
    m = _NAME.match(name)
    if not m:
        return None
    kind, tname, bits, t512, suffix = m.groups()
    rtptg, ept, rbits = _CONFIG[tname]
    if t512:
        rtptg = 512
    if int(bits) != rbits:
        return None
    return Parsed(kind, tname, METAL_DTYPES[tname], rtptg, ept, rbits, f"_{bits}bit{t512 or ''}", suffix == "_u16")


def family(name: str) -> Optional[str]:
    p = parse(name)
    if p is None:
        return None
    return "radix_" + p.kind + ("_u16" if p.u16 else "")


def radix_key(x: torch.Tensor, desc: bool) -> torch.Tensor:
    """to_radix_key as int64 (SortRadix.h)."""
    nbits = x.element_size() * 8
    mask = (1 << nbits) - 1
    if x.dtype.is_floating_point:
        b = x.view({16: torch.int16, 32: torch.int32}[nbits]).to(torch.int64) & mask
        neg = b >> (nbits - 1)
        key = b ^ torch.where(neg == 1, mask, 1 << (nbits - 1))
        key = torch.where(x.isnan(), 0 if desc else mask, key ^ (mask if desc else 0))
        return key
    if x.dtype == torch.bool:
        key = x.to(torch.int64)
    elif x.dtype.is_signed:
        key = (x.to(torch.int64) & mask) ^ (1 << (nbits - 1))
    else:
        key = x.to(torch.int64) & mask
    return key ^ mask if desc else key


def _ordered_input(x: torch.Tensor) -> torch.Tensor:
    """What check_sorted sorts: -0.0 as the float64 just below 0.0 (see the docstring)."""
    if not x.dtype.is_floating_point:
        return x
    w = x.double()
    return torch.where((w == 0) & torch.signbit(w), torch.tensor(-5e-324, dtype=torch.float64), w)



def _histogram(keys: torch.Tensor, shift: int, rbits: int, elems: int, n_blocks: int) -> torch.Tensor:
    rows, size = keys.shape
    digit = (keys >> shift) & ((1 << rbits) - 1)
    block = torch.arange(size) // elems
    hist = torch.zeros(rows, 1 << rbits, n_blocks, dtype=torch.int64)
    for r in range(rows):
        hist[r].index_put_((digit[r], block), torch.ones(size, dtype=torch.int64), accumulate=True)
    return hist.view(rows, -1)


def _scheme(p: Parsed) -> str:
    """How the kernel under test is run: "scan" (count, radix_scan, scatter), "count_scan"
    or "fused"."""
    if p.kind == "count_scan":
        return "count_scan"
    if "fused" in p.kind:
        return "fused"
    return "scan"


def _run(function, p: Parsed, case, gen) -> Optional[str]:
    rows, size, desc, k = case
    scheme = _scheme(p)
    t, tag, u = p.tname, p.tag, "_u16" if p.u16 else ""
    topk = p.kind.endswith("topk")
    elems = p.rtptg * p.ept
    n_blocks = -(-size // elems)
    rsize = 1 << p.rbits
    passes = p.dtype.itemsize * 8 // p.rbits
    fused = "_fused" if scheme == "fused" else ""
    count_k = sibling(function, f"radix_count{'_scan' if scheme == 'count_scan' else ''}_{t}{tag}"
                       f"{'_mb4' if scheme == 'count_scan' else ''}")
    scan_k = sibling(function, "radix_scan") if scheme == "scan" else None
    scatter_k = sibling(function, f"radix_scatter{fused}_{t}{tag}{u}")
    final_k = sibling(function, f"radix_scatter{fused}_final{'_topk' if topk else ''}_{t}{tag}{u}")

    x = _inputs(p.dtype, rows * size, gen).view(rows, size)
    idx_t = torch.uint16 if p.u16 else torch.int32
    keys = [Buffer(p.dtype, rows, size) for _ in range(2)]
    vals = [Buffer(idx_t, rows, size) for _ in range(2)]
    keys[0].tensor.copy_(x)
    count = k if topk else size
    out_k, out_v = Buffer(p.dtype, rows, count), Buffer(torch.int64, rows, count)
    group = dict(threads=(p.rtptg * n_blocks, rows, 1), group_size=(p.rtptg, 1, 1))
    src = 0
    for i in range(passes):
        shift = i * p.rbits
        dims = (size, n_blocks, shift)
        kin = keys[src].tensor
        hist = Buffer(torch.int32, rows, rsize * n_blocks)
        expected = _histogram(radix_key(kin, desc), shift, p.rbits, elems, n_blocks)
        scanned = expected.cumsum(1) - expected
        if scheme == "count_scan":
            count_k(kin, hist.tensor, dims, desc, threads=(p.rtptg, rows, 1), group_size=(p.rtptg, 1, 1))
            stage = (count_k.name, scanned)
        else:
            count_k(kin, hist.tensor, dims, desc, **group)
            stage = (count_k.name, expected)
        if not hist.untouched():
            return f"pass {i}: {stage[0]} wrote outside the histograms"
        if not torch.equal(hist.tensor.to(torch.int64), stage[1]):
            return f"pass {i}: histograms after {stage[0]} differ from the digit counts"
        if scan_k is not None:
            scan_k(hist.tensor, rsize * n_blocks, threads=(1024, rows, 1), group_size=(1024, 1, 1))
            if not torch.equal(hist.tensor.to(torch.int64), scanned):
                return f"pass {i}: histograms after radix_scan differ from their exclusive scan"
        flags = (desc, i == 0)
        if i < passes - 1:
            scatter_k(kin, vals[src].tensor, keys[1 - src].tensor, vals[1 - src].tensor, hist.tensor, dims, flags,
                      **group)
            if not (keys[1 - src].untouched() and vals[1 - src].untouched()):
                return f"pass {i}: {scatter_k.name} wrote outside its outputs"
            src = 1 - src
        else:
            args = [kin, vals[src].tensor, out_k.tensor, out_v.tensor, hist.tensor, dims, flags]
            if topk:
                args.append((0, k))
            final_k(*args, **group)
    if not (out_k.untouched() and out_v.untouched()):
        return f"{final_k.name} wrote outside its outputs"
    return check_sorted(x, out_k.tensor, out_v.tensor, desc, True, order=_ordered_input(x))


def _cases(p: Parsed):
    """(rows, size, desc, k): one partial block, and several blocks (at most 4 where the
    scheme fuses the scan)."""
    elems = p.rtptg * p.ept
    topk = p.kind.endswith("topk")
    cases = [(3, 37, False), (2, elems, True), (2, 2 * elems + 100, False), (1, 4 * elems - 1, True)]
    if _scheme(p) == "scan":
        cases.append((1, 6 * elems + 5, False))
    return [(r, s, d, max(1, s // 3) if topk else s) for r, s, d in cases]


def check(function, device: str) -> Tuple[str, str]:
    p = parse(function.name)
    gen = generator(function.name)
    for case in _cases(p):
        problem = _run(function, p, case, gen)
        if problem:
            rows, size, desc, k = case
            return "wrong", f"rows {rows} size {size} {'desc' if desc else 'asc'} k {k}: {problem}"
    return "correct", ""

"""PyTorch's scans (ScanKernel.metal, host code ScanKernel.mm): ``<op>_<scheme>[_<n>...]_<types>``.

``op`` is cumsum, cumprod, logcumsumexp (one output) or cummin, cummax (values and int64
indices). ``types`` is one Metal type, or ``int_long`` for the fused int32 -> int64 scans
(read int, accumulate and write long). Every kernel accumulates in ``accum_t<T>``: float for
half and bfloat, the type itself otherwise (half2 included: its products and log-add-exps
round to half at every step). Threadgroups are one-dimensional; ``NREADS`` (elements per
thread) is baked in per registration: 2 where the accumulator is 8 bytes (long, float2),
else 4. Schemes, as the host dispatches them (``threads`` x ``group``):

* innermost: [rows, axis] contiguous, one threadgroup per row (``gid.y``); ``axis_size``
  (ulong); group ``ceil(axis / (32 NREADS)) * 32`` threads for axis <= 1024 NREADS, half that
  up to 2048 NREADS, else the pipeline's maximum. cummin/cummax bind values then indices.
* outer: [orows, axis, stride] contiguous, 32 x 32 tiles; ``axis_size, stride,
  stride_blocks = ceil(stride / 32)``; groups of ``32 / NREADS * 32`` threads, one per
  (orow, stride block) on ``gid.y``.
* innermost_transposed: input stored [axis, n_cols], scanned as its transpose, output
  [n_cols, axis] contiguous; ``axis_size, n_cols, stride_blocks``; like outer.
* tiny_innermost: [n_scans, axis <= 32]; ``axis_size, n_scans, rows_per_tg = 2048 / axis``
  (uint); groups of 256 threads, ``ceil(n_scans / rows_per_tg)`` of them.
* block_reduce -> block_carry (long contiguous axis): groups of 256 on (block, row);
  ``block_sums`` [rows, num_blocks] of accum_t holds each block's total; the carry pass
  folds the preceding blocks' totals itself (no scan of the sums in between).
* strided_block_reduce_BN -> scan_block_sums -> strided_block_carry_BN: [orows, axis,
  n_irows] split into blocks along the axis; ``block_sums[(orow * n_irows + irow) *
  num_blocks + block]``, scanned in place per scan line, then read as the carry-in of the
  next block; groups of ``BN / NREADS * 32`` threads on ``gid.y``.
* vec_block_reduce_VEC -> vec_block_carry_VEC: [orows, axis, VEC], groups of 64;
  ``block_sums[(orow * num_blocks + block) * VEC + c]``; the carry pass folds them itself.
* contig_decoupled (NREADS 16) and strided_decoupled_VEC_NREADS: single-pass decoupled
  look-back; each threadgroup claims its tile from ``tile_counter`` (zeroed). contig: the
  ``aggregates`` / ``inclusive`` words start at 0xFFFFFFFF (``kScanEmpty``); strided: a
  ``status`` word per tile starts at 0 (empty; 1 aggregate, 2 inclusive ready).

Block and tile sizes follow the host's formulas, so the shapes below make several blocks,
partial blocks and partial threadgroups. The intermediate block sums are checked too (a
wrong total names the pass that wrote it), and nothing outside any buffer may be written.
"""

import math
import re
from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch

from .buffers import sibling
from .compare import mismatch
from .dtypes import METAL_DTYPES, is_complex, is_integral, wide
from .elementwise import NoHarness
from .inputs import generator, values

_OPS = ("logcumsumexp", "cumsum", "cumprod", "cummin", "cummax")
# Longest first: "innermost_transposed" and "tiny_innermost" before "innermost".
_SCHEMES = {  # scheme -> how many numbers follow it in the name
    "innermost_transposed": 0, "tiny_innermost": 0, "innermost": 0, "outer": 0,
    "block_reduce": 0, "block_carry": 0, "scan_block_sums": 0, "contig_decoupled": 0,
    "strided_decoupled": 2, "strided_block_reduce": 1, "strided_block_carry": 1,
    "vec_block_reduce": 1, "vec_block_carry": 1,
}
_PAD = 16  # sentinel elements either side of every buffer a kernel writes
_SENTINEL = 0xA5


@dataclass
class Parsed:
    op: str
    scheme: str
    numbers: Tuple[int, ...]
    tag: str                # the type words as named: "float", "int_long"
    ti: torch.dtype         # input
    to: torch.dtype         # output


def parse(name: str) -> Optional[Parsed]:
    match = re.match(r"^(logcumsumexp|cumsum|cumprod|cummin|cummax)_(.+)$", name)
    if not match:
        return None
    op, rest = match.groups()
    for scheme, count in _SCHEMES.items():
        if not rest.startswith(scheme + "_"):
            continue
        words = rest[len(scheme) + 1:].split("_")
        numbers = []
        while words and words[0].isdigit():
            numbers.append(int(words.pop(0)))
        if len(numbers) != count or len(words) not in (1, 2) or any(w not in METAL_DTYPES for w in words):
            return None
        return Parsed(op, scheme, tuple(numbers), "_".join(words), METAL_DTYPES[words[0]], METAL_DTYPES[words[-1]])
    return None


def _accum(dtype: torch.dtype) -> torch.dtype:
    """``c10::metal::accum_t``: float for half and bfloat, else the type itself."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _n_reads(p: Parsed) -> int:
    """NREADS of the registration (ScanKernel.metal), which the host's ``scan_n_reads``
    mirrors: 2 for an 8-byte accumulator (long, int_long, float2), else 4."""
    acc = _accum(p.to)
    return 2 if acc in (torch.int64, torch.complex64) else 4


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


class _Buffer:
    """A buffer with sentinel bytes either side; its inside starts as sentinel bytes too,
    so an element the kernel never writes cannot pass as a result."""

    def __init__(self, dtype: torch.dtype, count: int, fill: Optional[int] = None):
        size = _size(dtype)
        self.raw = torch.full(((count + 2 * _PAD) * size,), _SENTINEL, dtype=torch.uint8)
        self.size = size
        self.tensor = self.raw[_PAD * size:(_PAD + count) * size].view(dtype)
        if fill is not None:
            self.tensor.fill_(fill)

    def bind(self) -> torch.Tensor:
        return torch.view_as_real(self.tensor) if is_complex(self.tensor.dtype) else self.tensor

    def untouched(self) -> bool:
        edge = _PAD * self.size
        return bool((self.raw[:edge] == _SENTINEL).all() and (self.raw[-edge:] == _SENTINEL).all())


def _bindable(t: torch.Tensor) -> torch.Tensor:
    return torch.view_as_real(t) if is_complex(t.dtype) else t


def _input(p: Parsed, count: int, gen: torch.Generator) -> torch.Tensor:
    """`count` inputs of the kernel's input type in a domain where the op stays finite and
    integers exact."""
    op, dtype = p.op, p.ti
    if op == "cumprod":
        if is_integral(dtype):
            # Mostly 1, some -1, a dozen 2s and a late 0: no product overflows int32 (the
            # kernels multiply with ``mul nsw``, where an overflow is undefined).
            x = torch.ones(count, dtype=torch.int64)
            x[torch.rand(count, generator=gen) < 0.03] = -1
            x[torch.randint(0, count, (min(12, count),), generator=gen)] = 2
            if count > 4:
                x[count - 3] = 0
            return x.to(dtype)
        # Magnitudes within 1% of 1 and a tenth of them negative: a product over 70,000
        # elements wanders within e^+-5, far from half's range.
        magnitude = torch.exp((torch.rand(count, generator=gen, dtype=torch.float64) * 2 - 1) * 0.01)
        if is_complex(dtype):
            angle = (torch.rand(count, generator=gen, dtype=torch.float64) * 2 - 1) * math.pi
            return torch.polar(magnitude, angle).to(dtype)
        sign = torch.where(torch.rand(count, generator=gen) < 0.1, -1.0, 1.0).double()
        return (magnitude * sign).to(dtype)
    if op == "cumsum" and dtype.is_floating_point:
        # Positive terms: a float sum's rounding error is relative to the sum of |x|, which
        # compare's relative tolerance then measures; signed terms cancel to sums far
        # smaller than the error accumulated over thousands of terms.
        return values(count, dtype, "positive", gen)
    x = values(count, dtype, "any", gen)
    if op == "logcumsumexp" and dtype == torch.complex32:
        # c10::metal::logaddexp for complex picks max = a.x > b.x ? a : b and min = a.x < b.x
        # ? a : b (AIR: two selects on ``fcmp ogt`` / ``fcmp olt`` of the real halves), so
        # where two partial results' real parts are equal both are b, and the result is
        # b + log(2): a's imaginary part is dropped. In half such ties are common
        # (logcumsumexp_innermost_half2, row of 1,000: element 255 combines 4.6523+0.2515i
        # with 4.6523-0.1713i into 5.3438-0.1713i; torch, and the sum, give 5.3254+0.0401i).
        # With every imaginary part within 1 +- 0.04 so are all partial results', and a tie
        # errs by at most 0.04, within half's tolerance: the real parts still vary freely.
        real = torch.view_as_real(x.to(torch.complex64))[:, 0].double()
        imag = 1 + (torch.rand(count, generator=gen, dtype=torch.float64) * 2 - 1) * 0.04
        return torch.complex(real, imag).to(dtype)
    if op == "logcumsumexp" and not is_complex(dtype):
        x[0] = float("-inf")  # log(0): the scan starts at -inf and recovers at the next term
    if op in ("cummin", "cummax") and dtype.is_floating_point and count > 8:
        # NaN wins and keeps winning; a later NaN takes over the index (as torch's CPU op).
        x[count * 2 // 3] = float("nan")
        x[count - 2] = float("nan")
    return x


def _reference(op: str, x: torch.Tensor, dim: int):
    w = x.to(wide(x.dtype))
    if op == "cumsum":
        return torch.cumsum(w, dim)
    if op == "cumprod":
        return torch.cumprod(w, dim)
    if op == "logcumsumexp":
        return torch.logcumsumexp(w, dim)
    return getattr(torch, op)(w, dim)


def _tolerance(op: str) -> str:
    """compare's tolerance; "log" is "special" for a complex logarithm's value."""
    return {"cummin": "exact", "cummax": "exact", "logcumsumexp": "log"}.get(op, "special")


def _nearest_branch(actual: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """`actual` moved by the multiple of 2 pi i nearest to `expected`.

    A complex logcumsumexp is a logarithm, defined up to 2 pi i. Both torch's CPU op and
    c10::metal::logaddexp return max + log1p(exp(min - max)), with an imaginary part that is
    not wrapped into (-pi, pi], so it depends on the order the terms are combined in: the
    kernel's tree (block_scan_impl, simd_scan) and torch's left fold can differ by 2 pi
    (logcumsumexp_outer_float2: 3.5702 where torch has -2.7130)."""
    a = actual.to(torch.complex128)
    turns = torch.round((a.imag - expected.imag) / (2 * math.pi))
    return (a - 2j * math.pi * turns).to(actual.dtype)


def _compare(label: str, buffer: _Buffer, expected: torch.Tensor, tolerance: str) -> Optional[str]:
    if not buffer.untouched():
        return f"wrote outside {label}"
    actual = buffer.tensor.flatten()
    expected = expected.flatten()
    if tolerance == "log":
        tolerance = "special"
        if is_complex(actual.dtype):
            actual = _nearest_branch(actual, expected)
    problem = mismatch(actual, expected, tolerance, half_complex=actual.dtype == torch.complex32)
    return f"{label}: {problem}" if problem else None


def _outputs(p: Parsed, count: int, expected, label: str = "output") -> List[Tuple[str, _Buffer, torch.Tensor, str]]:
    """Output buffers for `expected` (a tensor, or values and indices)."""
    if p.op in ("cummin", "cummax"):
        vals, idx = expected
        return [(label + " values", _Buffer(p.to, count), vals, "exact"),
                (label + " indices", _Buffer(torch.int64, count), idx, "exact")]
    return [(label, _Buffer(p.to, count), expected, _tolerance(p.op))]


def _first_problem(checks) -> Optional[str]:
    for label, buffer, expected, tolerance in checks:
        problem = _compare(label, buffer, expected, tolerance)
        if problem:
            return problem
    return None


def _bufs(outs) -> List[torch.Tensor]:
    return [b.bind() for _, b, _, _ in outs]


# --- one-pass schemes ------------------------------------------------------------------

def _innermost_group(n_reads: int, axis: int, limit: int) -> int:
    per_simd = n_reads * 32
    tg = limit
    if axis <= n_reads * 1024:
        tg = _ceil(axis, per_simd) * 32
    elif axis <= n_reads * 2048:
        tg = _ceil(axis // 2, per_simd) * 32
    return min(tg, limit)


def _run_innermost(function, p: Parsed, case, gen) -> Optional[str]:
    rows, axis = case
    x = _input(p, rows * axis, gen).reshape(rows, axis)
    outs = _outputs(p, rows * axis, _reference(p.op, x, 1))
    # cummin/cummax size their groups by the input's element size, the others by the
    # accumulator's: the same 2-or-4 either way.
    tg = _innermost_group(_n_reads(p), axis, function.max_total_threads_per_threadgroup or 1024)
    function(_bindable(x), *_bufs(outs), axis, threads=(tg, rows, 1), group_size=(tg, 1, 1))
    return _first_problem(outs)


def _run_outer(function, p: Parsed, case, gen) -> Optional[str]:
    orows, axis, stride = case
    x = _input(p, orows * axis * stride, gen).reshape(orows, axis, stride)
    outs = _outputs(p, x.numel(), _reference(p.op, x, 1))
    stride_blocks = _ceil(stride, 32)
    tg = 32 // _n_reads(p) * 32
    function(_bindable(x), *_bufs(outs), axis, stride, stride_blocks,
             threads=(tg, orows * stride_blocks, 1), group_size=(tg, 1, 1))
    return _first_problem(outs)


def _run_transposed(function, p: Parsed, case, gen) -> Optional[str]:
    axis, n_cols = case
    stored = _input(p, axis * n_cols, gen).reshape(axis, n_cols)
    logical = stored.t()  # [n_cols, axis], scanned along its last (physically outer) dim
    outs = _outputs(p, stored.numel(), _reference(p.op, logical, 1))
    stride_blocks = _ceil(n_cols, 32)
    tg = 32 // _n_reads(p) * 32
    function(_bindable(stored), *_bufs(outs), axis, n_cols, stride_blocks,
             threads=(tg, stride_blocks, 1), group_size=(tg, 1, 1))
    return _first_problem(outs)


def _run_tiny(function, p: Parsed, case, gen) -> Optional[str]:
    n_scans, axis = case
    x = _input(p, n_scans * axis, gen).reshape(n_scans, axis)
    outs = _outputs(p, x.numel(), _reference(p.op, x, 1))
    rows_per_tg = 2048 // axis  # TILE in scan_tiny_innermost
    groups = _ceil(n_scans, rows_per_tg)
    function(_bindable(x), *_bufs(outs), axis, n_scans, rows_per_tg, threads=256 * groups, group_size=256)
    return _first_problem(outs)


# --- multi-pass schemes ----------------------------------------------------------------


def _combine(op: str, x: torch.Tensor, dim: int) -> torch.Tensor:
    w = x.to(wide(x.dtype))
    return w.sum(dim) if op == "cumsum" else w.prod(dim)


def _scan(op: str, x: torch.Tensor, dim: int) -> torch.Tensor:
    return torch.cumsum(x, dim) if op == "cumsum" else torch.cumprod(x, dim)


def _need_sum_or_prod(p: Parsed) -> None:
    if p.op not in ("cumsum", "cumprod"):
        raise NoHarness(f"{p.scheme} is registered for cumsum and cumprod only")


def _run_block(function, p: Parsed, case, gen) -> Optional[str]:
    """block_reduce -> block_carry over [rows, axis], sized as scan_multiblock_mps_impl."""
    _need_sum_or_prod(p)
    rows, axis = case
    n_reads, acc, tg = _n_reads(p), _accum(p.to), 256
    max_blocks = max(1, axis // (tg * n_reads))
    num_blocks = min(max(math.isqrt(axis) // 4, 2), min(max_blocks, 4096))
    block_size = _ceil(axis, num_blocks)
    num_blocks = _ceil(axis, block_size)
    reduce = sibling(function, f"{p.op}_block_reduce_{p.tag}")
    carry = sibling(function, f"{p.op}_block_carry_{p.tag}")

    x = _input(p, rows * axis, gen).reshape(rows, axis)
    sums = _Buffer(acc, rows * num_blocks)
    padded = torch.nn.functional.pad(x.to(wide(x.dtype)), (0, num_blocks * block_size - axis),
                                     value=0 if p.op == "cumsum" else 1)
    totals = _combine(p.op, padded.reshape(rows, num_blocks, block_size), 2)
    outs = _outputs(p, x.numel(), _reference(p.op, x, 1))
    grid = (tg * num_blocks, rows, 1)
    reduce(_bindable(x), sums.bind(), axis, block_size, num_blocks, threads=grid, group_size=(tg, 1, 1))
    problem = _compare(f"block_sums after {reduce.name}", sums, totals, _tolerance(p.op))
    if problem:
        return problem
    carry(_bindable(x), *_bufs(outs), sums.bind(), axis, block_size, num_blocks,
          threads=grid, group_size=(tg, 1, 1))
    return _first_problem(outs)


def _strided_bn(p: Parsed) -> int:
    if p.scheme == "scan_block_sums":
        return 32  # every dtype has BN 32; the host uses it for n_irows > 24
    return p.numbers[0]


# n_irows for a tile width: the widest the host would fit into it (BN 32 also gets two tiles)
_IROWS = {8: [7], 12: [11], 16: [13], 24: [20], 32: [32, 45]}


def _run_strided(function, p: Parsed, case, gen) -> Optional[str]:
    """strided_block_reduce -> scan_block_sums -> strided_block_carry over [orows, axis,
    n_irows], sized as scan_strided_multiblock_mps_impl."""
    _need_sum_or_prod(p)
    orows, axis, n_irows = case
    bn, n_reads, acc = _strided_bn(p), _n_reads(p), _accum(p.to)
    tag = p.tag  # scan_block_sums_T runs between the passes of T's own scan
    out_type = {v: k for k, v in METAL_DTYPES.items()}[p.to]
    reduce = sibling(function, f"{p.op}_strided_block_reduce_{bn}_{tag}")
    scan_sums = sibling(function, f"{p.op}_scan_block_sums_{out_type}")
    carry = sibling(function, f"{p.op}_strided_block_carry_{bn}_{tag}")

    stride_blocks = _ceil(n_irows, bn)
    outer_groups = orows * stride_blocks
    num_blocks = max(_ceil(4096, outer_groups), 2)
    num_blocks = min(num_blocks, max(1, axis // 512))
    block_size = _ceil(_ceil(axis, num_blocks), 32) * 32
    num_blocks = _ceil(axis, block_size)
    n_scans = orows * n_irows
    tg = bn // n_reads * 32
    grid = (tg, orows * stride_blocks * num_blocks, 1)

    x = _input(p, orows * axis * n_irows, gen).reshape(orows, axis, n_irows)
    padded = torch.nn.functional.pad(x.to(wide(x.dtype)), (0, 0, 0, num_blocks * block_size - axis),
                                     value=0 if p.op == "cumsum" else 1)
    # [orows, n_irows, num_blocks]: the layout of block_sums
    totals = _combine(p.op, padded.reshape(orows, num_blocks, block_size, n_irows), 2).permute(0, 2, 1)
    sums = _Buffer(acc, n_scans * num_blocks)
    outs = _outputs(p, x.numel(), _reference(p.op, x, 1))
    args = (axis, n_irows, stride_blocks, block_size, num_blocks, orows)
    reduce(_bindable(x), sums.bind(), *args, threads=grid, group_size=(tg, 1, 1))
    problem = _compare(f"block_sums after {reduce.name}", sums, totals, _tolerance(p.op))
    if problem:
        return problem
    scan_sums(sums.bind(), num_blocks, threads=(256, n_scans, 1), group_size=(256, 1, 1))
    problem = _compare(f"block_sums after {scan_sums.name}", sums, _scan(p.op, totals, 2), _tolerance(p.op))
    if problem:
        return problem
    carry(_bindable(x), *_bufs(outs), sums.bind(), *args, threads=grid, group_size=(tg, 1, 1))
    return _first_problem(outs)


def _run_vec(function, p: Parsed, case, gen) -> Optional[str]:
    """vec_block_reduce -> vec_block_carry over [orows, axis, VEC], sized as
    scan_vec_multiblock_mps_impl."""
    _need_sum_or_prod(p)
    orows, axis = case
    vec, n_reads, acc, tg = p.numbers[0], _n_reads(p), _accum(p.to), 64
    tile = tg * n_reads
    num_blocks = max(_ceil(512, orows), 2)
    num_blocks = max(min(num_blocks, max(1, axis // tile)), 1)
    block_size = _ceil(_ceil(axis, num_blocks), tile) * tile
    num_blocks = _ceil(axis, block_size)
    reduce = sibling(function, f"{p.op}_vec_block_reduce_{vec}_{p.tag}")
    carry = sibling(function, f"{p.op}_vec_block_carry_{vec}_{p.tag}")
    grid = (tg, orows * num_blocks, 1)

    x = _input(p, orows * axis * vec, gen).reshape(orows, axis, vec)
    padded = torch.nn.functional.pad(x.to(wide(x.dtype)), (0, 0, 0, num_blocks * block_size - axis),
                                     value=0 if p.op == "cumsum" else 1)
    totals = _combine(p.op, padded.reshape(orows, num_blocks, block_size, vec), 2)  # [orows, block, VEC]
    sums = _Buffer(acc, orows * num_blocks * vec)
    outs = _outputs(p, x.numel(), _reference(p.op, x, 1))
    args = (axis, block_size, num_blocks, orows)
    reduce(_bindable(x), sums.bind(), *args, threads=grid, group_size=(tg, 1, 1))
    problem = _compare(f"block_sums after {reduce.name}", sums, totals, _tolerance(p.op))
    if problem:
        return problem
    carry(_bindable(x), *_bufs(outs), sums.bind(), *args, threads=grid, group_size=(tg, 1, 1))
    return _first_problem(outs)


# --- decoupled look-back ---------------------------------------------------------------

def _run_contig_decoupled(function, p: Parsed, case, gen) -> Optional[str]:
    """As scan_decoupled_mps_impl: tiles of 256 x 16, a zeroed counter, every aggregate and
    inclusive word at kScanEmpty (-1)."""
    _need_sum_or_prod(p)
    rows, axis = case
    tg, tile = 256, 256 * 16
    num_tiles = _ceil(axis, tile)
    total = rows * num_tiles
    x = _input(p, rows * axis, gen).reshape(rows, axis)
    outs = _outputs(p, x.numel(), _reference(p.op, x, 1))
    counter = _Buffer(torch.int32, 1, fill=0)
    aggregates = _Buffer(torch.int32, total, fill=-1)
    inclusive = _Buffer(torch.int32, total, fill=-1)
    function(_bindable(x), *_bufs(outs), counter.bind(), aggregates.bind(), inclusive.bind(), axis, num_tiles,
             threads=tg * total, group_size=tg)
    for label, buffer in (("tile_counter", counter), ("aggregates", aggregates), ("inclusive", inclusive)):
        if not buffer.untouched():
            return f"wrote outside {label}"
    if int(counter.tensor[0]) != total:
        return f"tile_counter ends at {int(counter.tensor[0])}, not {total}"
    return _first_problem(outs)


def _run_strided_decoupled(function, p: Parsed, case, gen) -> Optional[str]:
    """As scan_strided_decoupled_mps_impl over [orows, axis, VEC]: groups of 768 threads for
    VEC 2 else 512, a zeroed counter and status words; aggregates and inclusive words are
    left as they come (at::empty), read only once their status says so."""
    _need_sum_or_prod(p)
    orows, axis = case
    vec, n_reads = p.numbers
    tg = 768 if vec <= 2 else 512
    num_tiles = _ceil(axis, tg * n_reads)
    total = orows * num_tiles
    x = _input(p, orows * axis * vec, gen).reshape(orows, axis, vec)
    outs = _outputs(p, x.numel(), _reference(p.op, x, 1))
    counter = _Buffer(torch.int32, 1, fill=0)
    status = _Buffer(torch.int32, total, fill=0)
    aggregates = _Buffer(torch.int32, total * vec)
    inclusive = _Buffer(torch.int32, total * vec)
    function(_bindable(x), *_bufs(outs), counter.bind(), status.bind(), aggregates.bind(), inclusive.bind(),
             axis, num_tiles, threads=tg * total, group_size=tg)
    for label, buffer in (("tile_counter", counter), ("status", status), ("aggregates", aggregates),
                          ("inclusive", inclusive)):
        if not buffer.untouched():
            return f"wrote outside {label}"
    if not bool((status.tensor == 2).all()):
        return f"status words left unpublished: {status.tensor.tolist()[:8]}"
    return _first_problem(outs)


def _decoupled_tile(p: Parsed) -> int:
    if p.scheme == "contig_decoupled":
        return 256 * 16
    vec, n_reads = p.numbers
    return (768 if vec <= 2 else 512) * n_reads


_RUNNERS = {
    "innermost": _run_innermost, "outer": _run_outer, "innermost_transposed": _run_transposed,
    "tiny_innermost": _run_tiny, "block_reduce": _run_block, "block_carry": _run_block,
    "scan_block_sums": _run_strided, "strided_block_reduce": _run_strided, "strided_block_carry": _run_strided,
    "vec_block_reduce": _run_vec, "vec_block_carry": _run_vec,
    "contig_decoupled": _run_contig_decoupled, "strided_decoupled": _run_strided_decoupled,
}


def _cases(p: Parsed) -> list:
    """Shapes per scheme: axis lengths of 1 (or a few), a partial threadgroup, several
    iterations or blocks. half2 accumulates in half: its axes stay within 1,000."""
    s = p.scheme
    if s == "innermost":
        cases = [(4, 1), (3, 37), (2, 1000), (2, 5000)]
    elif s == "outer":
        cases = [(2, 1, 33), (3, 37, 5), (2, 300, 40), (1, 2000, 3)]
    elif s == "innermost_transposed":
        cases = [(1, 33), (37, 300), (1000, 45), (5000, 3)]
    elif s == "tiny_innermost":
        cases = [(50, 1), (700, 5), (300, 32), (4100, 3)]
    elif s in ("block_reduce", "block_carry"):
        cases = [(2, 37), (2, 3000), (3, 5000), (1, 70000)]  # 1, 2 (5), 4 (9), 66 blocks (NREADS 4 (2))
    elif s in ("strided_block_reduce", "strided_block_carry", "scan_block_sums"):
        cases = [(2, 37, n) for n in _IROWS[_strided_bn(p)]] + \
                [(2, 2000, n) for n in _IROWS[_strided_bn(p)]] + [(1, 5000, _IROWS[_strided_bn(p)][0])]
    elif s in ("vec_block_reduce", "vec_block_carry"):
        cases = [(3, 37), (2, 2000), (1, 5000)]
    else:  # decoupled: one tile, and several tiles with a partial last one
        tile = _decoupled_tile(p)
        cases = [(3, 37), (2, 2 * tile + 100)]
    if p.ti == torch.complex32:
        cases = [c for c in cases if max(c) <= 1000] or cases[:1]
    return cases


def check(function, device: str) -> Tuple[str, str]:
    p = parse(function.name)
    gen = generator(function.name)
    runner = _RUNNERS[p.scheme]
    for case in _cases(p):
        problem = runner(function, p, case, gen)
        if problem:
            return "wrong", f"{list(case)}: {problem}"
    return "correct", ""

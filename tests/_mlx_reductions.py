"""MLX's reduction kernels (all_reduce, row and column reductions, init_reduce, argmin / argmax)
called as MLX's host code calls them, and checked exactly against torch (tests/test_cpu_mlx_reductions.py
says how): the cases and checks it runs on the CPU and tests/test_cuda.py mirrors on a GPU."""

import contextlib
import math
import zlib
from typing import Dict, List, NamedTuple, Sequence, Tuple

import torch

import torch_metallib as tm


# --- types ---------------------------------------------------------------------------------

TAGS: Dict[str, torch.dtype] = {
    "bool_": torch.bool,
    "uint8": torch.uint8, "uint16": torch.uint16, "uint32": torch.uint32, "uint64": torch.uint64,
    "int8": torch.int8, "int16": torch.int16, "int32": torch.int32, "int64": torch.int64,
    "float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
}
METAL_TYPES: Dict[str, torch.dtype] = {
    "bool": torch.bool, "uchar": torch.uint8, "ushort": torch.uint16, "uint": torch.uint32,
    "ulong": torch.uint64, "char": torch.int8, "short": torch.int16, "int": torch.int32,
    "long": torch.int64, "half": torch.float16, "bfloat": torch.bfloat16, "float": torch.float32,
}
FLOATS = ("float32", "float16", "bfloat16")
SIGNIFICAND_BITS = {torch.float32: 24, torch.float16: 11, torch.bfloat16: 8}


BITS = {"bool_": 1, "uint8": 8, "int8": 8, "uint16": 16, "int16": 16, "uint32": 32, "int32": 32,
        "uint64": 64, "int64": 64}
SIGN64 = -(1 << 63)

OPS = ("sum", "prod", "max", "min")
MAIN_TAGS = ("float32", "float16", "bfloat16", "int32")
ALL_NUMERIC = ("float32", "float16", "bfloat16", "int32", "int8", "uint8", "int16", "uint16",
               "uint32", "int64", "uint64")
LOGICAL_TAGS = ("bool_", "int16", "int32", "int64", "float16", "bfloat16", "float32")
PROD_MAX_POWER = 14


def _generator(name: str, salt: int = 0) -> torch.Generator:
    """Seeded by the kernel name: inputs do not depend on test order."""
    return torch.Generator().manual_seed(zlib.crc32(name.encode()) * 7 + salt)


def _int_range(tag: str) -> Tuple[int, int]:
    bits = BITS[tag]
    if tag.startswith("uint"):
        return 0, (1 << bits) - 1
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1


def _randint(lo: int, hi: int, shape, gen) -> torch.Tensor:
    """Uniform integers in [lo, hi] as int64; for ranges wider than int64 (uint64), bit
    patterns (view them as uint64)."""
    if hi - lo < 2 ** 62:
        return torch.randint(0, hi - lo + 1, shape, generator=gen, dtype=torch.int64) + lo
    high = torch.randint(-(1 << 31), 1 << 31, shape, generator=gen, dtype=torch.int64)
    low = torch.randint(0, 1 << 32, shape, generator=gen, dtype=torch.int64)
    return (high << 32) | low


def _as_tag(values: torch.Tensor, tag: str) -> torch.Tensor:
    """int64 values (or uint64 bit patterns) as the tag's dtype."""
    if tag == "uint64":
        return values.view(torch.uint64)
    return values.to(TAGS[tag])


def _ordered_int64(x: torch.Tensor) -> torch.Tensor:
    """Integers as int64 in the same order (uint64: bit patterns with the sign bit flipped)."""
    if x.dtype == torch.uint64:
        return x.view(torch.int64) ^ SIGN64
    return x.to(torch.int64)


def _from_ordered_int64(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.uint64:
        return (x ^ SIGN64).view(torch.uint64)
    return x.to(dtype)


# --- inputs --------------------------------------------------------------------------------

def make_input(op: str, tag: str, shape: Sequence[int], per_output: int, gen) -> torch.Tensor:
    """Values for reducing groups of `per_output` elements with `op` whose exact results
    every accumulation order reaches (see the module docstring)."""
    dtype = TAGS[tag]
    if op in ("and", "or"):
        # About half the outputs see a zero ("and") or a non-zero ("or") element.
        keep = 0.5 ** (1.0 / per_output)
        truthy = torch.rand(shape, generator=gen) < (keep if op == "and" else 1.0 - keep)
        if tag == "bool_":
            return truthy
        if tag in FLOATS:
            values = (torch.randn(shape, generator=gen) * 10).to(dtype)
            special = torch.rand(shape, generator=gen)
            values[special < 0.05] = float("nan")       # NaN is true
            values[special > 0.95] = float("-inf")
            values[values == 0] = 1
            falsy = torch.where(torch.rand(shape, generator=gen) < 0.5, -0.0, 0.0).to(dtype)  # -0.0 is false
        else:
            lo, hi = _int_range(tag)
            values = _randint(lo, hi, shape, gen)
            values[values == 0] = 1
            values, falsy = _as_tag(values, tag), torch.zeros(shape, dtype=dtype)
        return torch.where(truthy, values, falsy)
    if op in ("max", "min"):
        if tag in FLOATS:
            values = (torch.randn(shape, generator=gen) * 1000).to(dtype)
            special = torch.rand(shape, generator=gen)
            values[special < 0.01] = float("inf")
            values[special > 0.99] = float("-inf")
            return values
        if tag == "bool_":
            return torch.rand(shape, generator=gen) < 0.5
        lo, hi = _int_range(tag)
        return _as_tag(_randint(lo, hi, shape, gen), tag)
    if op == "sum":
        if tag in FLOATS:
            limit = 2 ** SIGNIFICAND_BITS[dtype]
            # magnitudes 1..3, non-zero with a density that puts the expected positive
            # (and negative) total at limit / 4
            density = min(1.0, limit / (4.0 * per_output))
            magnitude = torch.randint(1, 4, shape, generator=gen)
            sign = torch.randint(0, 2, shape, generator=gen) * 2 - 1
            nonzero = torch.rand(shape, generator=gen) < density
            return (magnitude * sign * nonzero).to(dtype)
        bound = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767), "uint16": (0, 65535),
                 "int32": (-(1 << 17), 1 << 17), "uint32": (0, 1 << 18),
                 "int64": (-(1 << 40), 1 << 40), "uint64": (0, 1 << 41)}[tag]
        return _as_tag(_randint(*bound, shape, gen), tag)
    if op == "prod":
        signed = not tag.startswith("uint")
        sign = (torch.randint(0, 2, shape, generator=gen) * 2 - 1) if signed else torch.ones(shape, dtype=torch.int64)
        pick = torch.rand(shape, generator=gen)
        rate = min(0.25, 3.0 / per_output)
        if tag in FLOATS:
            values = sign.double()
            values[pick < rate] *= 2.0
            values[pick > 1.0 - rate] *= 0.5
            return values.to(dtype)
        values = sign.clone()
        values[pick < rate] *= 2
        return _as_tag(values, tag)
    raise AssertionError(op)


def probe_positions(n_out: int, per_output: int) -> torch.Tensor:
    """For each output, the position (in its group, row-major over the reduced axes) of
    the element its result must depend on: the first, the last, then spread out."""
    pos = (torch.arange(n_out) * 7919 + 3) % per_output
    pos[0::3] = per_output - 1
    pos[1::3] = 0
    return pos


def plant(op: str, tag: str, x: torch.Tensor, axes: Sequence[int], positions=None) -> torch.Tensor:
    """Makes each output's result hinge on one element (probe_positions), so that a kernel
    that skips or misplaces it fails; random data alone decides max/min/and/or from a few
    elements. Every fourth output keeps the random data (infinities included); the others:
    * max / min: the other elements squeezed into half the range (floats: made finite,
      |x| <= 2**14) and the probe beyond them, a different value from output to output;
    * and / or: half of them all truthy (falsy) but the probe, the other half all truthy
      (falsy), so that both results occur;
    * sum: the probe made non-zero (the float16 / bfloat16 data is sparse);
    * prod: the probe a factor 2 (+-1 elsewhere decide only signs, unsigned ones nothing)."""
    axes = list(axes)
    kept = [a for a in range(x.dim()) if a not in axes]
    order = kept + axes
    dtype = x.dtype
    # torch cannot index_put uint16/32/64: integers are edited as int64 (max/min: in an
    # order-preserving int64 space, where uint64 spans the whole int64 range)
    integer = not dtype.is_floating_point and dtype != torch.bool
    ordered = integer and op in ("max", "min")
    if ordered:
        x = _ordered_int64(x)
    elif integer:
        x = x.view(torch.int64) if dtype == torch.uint64 else x.to(torch.int64)  # uint64 data < 2**63
    moved = x.permute(order).contiguous()
    n_out = math.prod(x.shape[a] for a in kept)
    groups = moved.view(n_out, -1)
    per_output = groups.shape[1]
    pos = probe_positions(n_out, per_output) if positions is None else positions
    rows = torch.arange(n_out)
    chosen = rows % 4 != 3
    rows, pos, index = rows[chosen], pos[chosen], torch.arange(int(chosen.sum()))
    if op == "sum":
        probe = groups[rows, pos]
        groups[rows, pos] = torch.where(probe == 0, torch.ones_like(probe), probe)
    elif op == "prod":
        probe = groups[rows, pos]
        groups[rows, pos] = torch.where(probe.abs() == 1, probe * 2, probe)
    elif op in ("max", "min"):
        body = groups[rows]
        sign = 1 if op == "max" else -1
        if dtype.is_floating_point:
            body = torch.nan_to_num(body.double(), posinf=0.0, neginf=0.0).clamp(-2.0 ** 14, 2.0 ** 14)
            probe = sign * (60000.0 - 32.0 * (index % 64)).double()
        elif dtype == torch.bool:
            body = torch.zeros_like(body) if op == "max" else torch.ones_like(body)
            probe = torch.full((len(rows),), op == "max")
        else:  # ordered int64
            wide = body
            lo, hi = (-(1 << 63), (1 << 63) - 1) if tag == "uint64" else _int_range(tag)
            step = index % 64
            if op == "max":      # the others in [lo/2, hi/2], the probe above hi/2
                body, probe = wide // 2, hi - step
            elif lo < 0:         # the others in [lo/2, hi/2], the probe below lo/2
                body, probe = wide // 2, lo + step
            else:                # unsigned: the others in [(hi+1)/2, hi], the probe below
                body, probe = wide // 2 + (hi + 1) // 2, lo + step
        body = body.to(groups.dtype)
        body[index, pos] = probe.to(groups.dtype)
        groups[rows] = body
    elif op in ("and", "or"):
        truthy = torch.ones((), dtype=groups.dtype)
        falsy = torch.zeros((), dtype=groups.dtype)
        fill, probe = (truthy, falsy) if op == "and" else (falsy, truthy)
        groups[rows] = fill
        marked = index % 2 == 0
        groups[rows[marked], pos[marked]] = probe
    result = moved.permute([order.index(a) for a in range(x.dim())]).contiguous()
    if ordered:
        return _from_ordered_int64(result, dtype)
    if integer:
        return result.view(torch.uint64) if dtype == torch.uint64 else result.to(dtype)
    return result


# --- references ----------------------------------------------------------------------------

def reference(op: str, x: torch.Tensor, dims: Tuple[int, ...], out_dtype: torch.dtype) -> torch.Tensor:
    """torch's reduction of x over dims, in float64 / int64, rounded once to out_dtype."""
    if op in ("and", "or"):
        truth = x != 0  # NaN is true, -0.0 is false
        return (truth.all(dim=dims) if op == "and" else truth.any(dim=dims)).to(out_dtype) \
            if dims else truth.to(out_dtype)
    if x.dtype.is_floating_point:
        wide = x.double()
        result = {"sum": lambda: wide.sum(dim=dims), "prod": lambda: _prod(wide, dims),
                  "max": lambda: wide.amax(dim=dims), "min": lambda: wide.amin(dim=dims)}[op]()
        return result.to(out_dtype)
    if x.dtype == torch.bool:
        wide = x.to(torch.int64)
        result = wide.amax(dim=dims) if op == "max" else wide.amin(dim=dims)
        return result.to(out_dtype)
    if op in ("max", "min"):
        wide = _ordered_int64(x)
        result = wide.amax(dim=dims) if op == "max" else wide.amin(dim=dims)
        return _from_ordered_int64(result, out_dtype)
    wide = x.to(torch.int64) if x.dtype != torch.uint64 else x.view(torch.int64)  # inputs < 2**63
    result = wide.sum(dim=dims) if op == "sum" else _prod(wide, dims)
    return result.view(torch.uint64) if out_dtype == torch.uint64 else result.to(out_dtype)


def identity(op: str, dtype: torch.dtype) -> torch.Tensor:
    """The identity of op in dtype, from torch's type limits (MLX's Op::init)."""
    if op in ("sum", "or"):
        return torch.zeros((), dtype=dtype)
    if op in ("prod", "and"):
        return torch.ones((), dtype=dtype)
    if dtype == torch.bool:
        return torch.tensor(op == "min")
    if dtype.is_floating_point:
        return torch.tensor(-math.inf if op == "max" else math.inf, dtype=dtype)
    info = torch.iinfo(dtype)
    return torch.tensor(info.min if op == "max" else info.max, dtype=dtype)


def _prod(x: torch.Tensor, dims: Tuple[int, ...]) -> torch.Tensor:
    for d in sorted(dims, reverse=True):
        x = x.prod(dim=d)
    return x


def check_exactness(op: str, x: torch.Tensor, dims: Tuple[int, ...]) -> None:
    """The preconditions under which every summation / multiplication order is exact."""
    if op == "sum" and x.dtype.is_floating_point:
        limit = 2 ** SIGNIFICAND_BITS[x.dtype]
        wide = x.double()
        assert wide.clamp(min=0).sum(dim=dims).max() <= limit, "data: positive sum too large to be exact"
        assert (-wide).clamp(min=0).sum(dim=dims).max() <= limit, "data: negative sum too large to be exact"
    elif op == "prod":
        wide = x.double().abs()
        assert (wide == 2).sum(dim=dims).max() <= PROD_MAX_POWER, "data: too many factors 2"
        assert (wide == 0.5).sum(dim=dims).max() <= PROD_MAX_POWER, "data: too many factors 0.5"


def assert_same(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    """Exactly equal, bit for bit (so -0.0 != 0.0, and bools are bytes 0 or 1)."""
    got, want = got.flatten(), want.flatten()
    assert got.dtype == want.dtype and got.shape == want.shape, (name, got.dtype, want.dtype, got.shape, want.shape)
    if got.dtype == torch.bool:
        g, w = got.view(torch.uint8).long(), want.view(torch.uint8).long()
    elif got.dtype.is_floating_point:
        g, w = got.view({2: torch.int16, 4: torch.int32}[got.element_size()]).long(), \
            want.view({2: torch.int16, 4: torch.int32}[want.element_size()]).long()
    else:
        g, w = _ordered_int64(got), _ordered_int64(want)
    bad = (g != w).nonzero().flatten()
    if len(bad):
        shown = ", ".join(f"[{i}] got {got[i].item()!r} want {want[i].item()!r}" for i in bad[:6].tolist())
        raise AssertionError(f"{name}: {len(bad)} of {got.numel()} outputs differ: {shown}")


# --- launching -----------------------------------------------------------------------------

def out_dtype_of(fn) -> torch.dtype:
    return METAL_TYPES[fn.arguments[1].type_name]


def guarded(n: int, dtype: torch.dtype) -> torch.Tensor:
    """n elements plus a guard element, every byte 0xA5."""
    out = torch.empty(n + 1, dtype=dtype)
    out.view(torch.uint8).fill_(0xA5)
    return out


def run(fn, x: torch.Tensor, n_out: int, *args, threads, group_size, out_dtype=None) -> torch.Tensor:
    """Runs fn(x, out, *args) into a guarded output and returns the first n_out elements."""
    out = guarded(n_out, out_dtype or out_dtype_of(fn))
    fn(x, out, *args, threads=threads, group_size=group_size)
    assert bool((out[n_out:].view(torch.uint8) == 0xA5).all()), f"{fn.name}: wrote past its {n_out} outputs"
    result = out[:n_out]
    if result.dtype == torch.bool:
        raw = result.view(torch.uint8)
        assert bool((raw <= 1).all()), f"{fn.name}: bool outputs that are not 0 or 1: {raw.unique().tolist()}"
    return result


def contiguous_strides(shape: Sequence[int]) -> List[int]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return strides[::-1]


def _or_zero(values: List[int]) -> List[int]:
    return values if values else [0]  # MLX encodes a 0 for empty vectors


def _roundup(n: int, m: int) -> int:
    return (n + m - 1) // m * m


def row_threadgroup_size(row_size: int) -> int:
    """reduce.cpp threadgroup_size_from_row_size."""
    if row_size <= 512:
        return 32
    if row_size <= 1024:
        return 128
    return min(1024, _roundup((row_size + 3) // 4, 32))


class Layout(NamedTuple):
    """A contiguous input reduced over `axes`, as reduce.cpp's Row/ColReduceArgs."""
    shape: Tuple[int, ...]
    axes: Tuple[int, ...]

    @property
    def strides(self):
        return contiguous_strides(self.shape)

    @property
    def kept(self):
        return [a for a in range(len(self.shape)) if a not in self.axes]

    @property
    def n_out(self):
        return math.prod(self.shape[a] for a in self.kept)

    @property
    def per_output(self):
        return math.prod(self.shape[a] for a in self.axes)

    # row reductions: the last axis is reduced
    def row_args(self):
        shape, strides = self.shape, self.strides
        others = [a for a in self.axes if a != len(shape) - 1]
        kept = self.kept
        return (shape[-1], math.prod(shape[a] for a in others),
                _or_zero([shape[a] for a in kept]), _or_zero([strides[a] for a in kept]), len(kept),
                _or_zero([shape[a] for a in others]), _or_zero([strides[a] for a in others]), len(others))

    # column reductions: the axes after the last reduced one are kept and contiguous
    @property
    def last(self):
        return max(self.axes)

    @property
    def columns(self):
        return math.prod(self.shape[self.last + 1:])

    @property
    def outer(self):
        return [a for a in self.kept if a < self.last]

    @property
    def total_rows(self):
        return self.per_output

    def col_args(self):
        shape, strides = self.shape, self.strides
        outer = self.outer
        return (shape[self.last], self.columns,
                _or_zero([shape[a] for a in outer]), _or_zero([strides[a] for a in outer]), len(outer),
                [shape[a] for a in self.axes], [strides[a] for a in self.axes], len(self.axes),
                math.prod(shape[a] for a in self.axes[:-1]))

    def col_blocks(self, x: torch.Tensor, block_of_row: torch.Tensor, blocks: int, op: str, out_dtype):
        """References for the per-block partial results of a two-pass column reduction:
        row r (the reduced positions in row-major order) goes to block block_of_row[r]."""
        outer = self.outer
        trailing = list(range(self.last + 1, len(self.shape)))
        moved = x.permute(outer + list(self.axes) + trailing).reshape(
            max(1, math.prod(self.shape[a] for a in outer)), self.total_rows, self.columns)
        parts = []
        for b in range(blocks):
            rows = (block_of_row == b).nonzero().flatten()
            if len(rows):
                parts.append(reference(op, moved[:, rows, :], (1,), out_dtype).flatten())
            else:  # a block past the last row keeps the identity
                parts.append(identity(op, out_dtype).expand(moved.shape[0] * moved.shape[2]))
        return torch.stack(parts)


# --- the kernels under test ----------------------------------------------------------------

class Case(NamedTuple):
    kernel: str
    family: str
    n: int        # the _1_ / _2_ / _5_ variant, 0 where there is none
    op: str
    tag: str


def _variant_pairs(n: int) -> List[Tuple[str, str]]:
    """(op, tag) pairs for the _2_ and _5_ variants: each op and each main dtype once."""
    tags = MAIN_TAGS if n == 2 else MAIN_TAGS[1:] + MAIN_TAGS[:1]
    return list(zip(OPS, tags))


def _family_name(family: str, n: int, large: bool, op: str, tag: str) -> str:
    if family == "row_reduce_simple":
        return f"row_reduce_simple_{op}{tag}"
    large_part = "_large" if large else ""
    tile = "_32_32" if family in ("col_reduce_looped", "col_reduce_2pass") else ""
    return f"{family}{large_part}_{n}{tile}_reduce_{op}{tag}"


ROW_FAMILIES = ("row_reduce_small", "row_reduce_looped", "row_reduce_simple")
COL_FAMILIES = ("col_reduce_small", "col_reduce_longcolumn", "col_reduce_looped", "col_reduce_2pass")


def _strided_cases(families) -> List[Case]:
    cases = []
    for family in families:
        variants = (1,) if family == "row_reduce_simple" else (1, 2, 5)
        for n in variants:
            pairs = [(op, tag) for op in OPS for tag in MAIN_TAGS] + [("and", "bool_"), ("or", "bool_")] \
                if n == 1 else _variant_pairs(n)
            for op, tag in pairs:
                cases.append(Case(_family_name(family, n, False, op, tag), family, n, op, tag))
        if family != "row_reduce_simple":
            for op, tag in (("sum", "float32"), ("max", "int32")):
                cases.append(Case(_family_name(family, 1, True, op, tag), family, 1, op, tag))
    return cases


ALL_REDUCE_CASES = [Case(f"all_reduce_{op}{tag}", "all_reduce", 0, op, tag)
                    for op in OPS for tag in ALL_NUMERIC] + \
                   [Case(f"all_reduce_{op}{tag}", "all_reduce", 0, op, tag)
                    for op in ("and", "or") for tag in LOGICAL_TAGS]
ROW_CASES = _strided_cases(ROW_FAMILIES)
COL_CASES = _strided_cases(COL_FAMILIES)
INIT_CASES = [Case(f"init_reduce_{op}{tag}", "init_reduce", 0, op, tag)
              for op, tags in (("sum", ("int32", "int64", "uint32", "uint64", "float16", "bfloat16", "float32")),
                               ("prod", ("int32", "int64", "uint32", "uint64", "float16", "bfloat16", "float32")),
                               ("max", ("bool_",) + ALL_NUMERIC),
                               ("min", ("bool_",) + ALL_NUMERIC),
                               ("and", ("bool_",)), ("or", ("bool_",)))
              for tag in tags]
ARG_CASES = [Case(f"{op}_{tag}", "arg_reduce", 0, op, tag) for tag in TAGS for op in ("argmin", "argmax")]

ALL_CASES = ALL_REDUCE_CASES + ROW_CASES + COL_CASES + INIT_CASES + ARG_CASES


def _ids(cases):
    return [case.kernel for case in cases]


# --- all_reduce ----------------------------------------------------------------------------

def check_all_reduce(mlx_lib, case):
    """reduce_all.h: one threadgroup over the whole input (reduce.cpp, in_size <= 4096), then
    the first pass of larger inputs: one threadgroup per row of row_size elements, the last
    row short."""
    fn = mlx_lib[case.kernel]
    out_dtype = out_dtype_of(fn)
    # one threadgroup: 3001 elements, 751 threads rounded up to 768 (24 SIMD-groups); the
    # result must depend on the first and last element, the edges of a thread's 4 and of
    # the 768 * 4 block, and one elsewhere
    n = 3001
    group = _roundup((n + 3) // 4, 32)
    base = make_input(case.op, case.tag, (n,), n, _generator(case.kernel))
    for probe in (0, n - 1, 3, 4, 127, 128, 2999, 1777):
        x = plant(case.op, case.tag, base.clone(), (0,), positions=torch.tensor([probe]))
        check_exactness(case.op, x, (0,))
        got = run(fn, x, 1, n, n, threads=group, group_size=group)
        assert_same(f"{case.kernel} (element {probe} decides)", got, reference(case.op, x, (0,), out_dtype))
    # first pass of the two-pass reduction: 23 rows of 218 (the last one of 194), 64 threads each
    n, rows = 5008, 23
    row_size = (n + rows - 1) // rows
    x = make_input(case.op, case.tag, (rows, row_size), row_size, _generator(case.kernel, 1))
    x = plant(case.op, case.tag, x, (1,)).flatten()[:n].contiguous()
    group = _roundup(min((row_size + 3) // 4, 1024), 32)
    got = run(fn, x, rows, n, row_size, threads=(group, rows, 1), group_size=group)
    chunks = [x[r * row_size:(r + 1) * row_size] for r in range(rows)]
    for chunk in chunks:
        check_exactness(case.op, chunk, (0,))
    want = torch.stack([reference(case.op, chunk, (0,), out_dtype) for chunk in chunks])
    assert_same(case.kernel + " (rows)", got, want)


# --- row reductions ------------------------------------------------------------------------

# Per (family, variant): (input shape, reduced axes, output grid (width, height)).
# row_reduce_small: row <= 64; a thread per output when the non-row reductions are few
# ((non_row < 32 and row <= 8) or non_row <= 8), else a SIMD-group per output.
# row_reduce_looped: row > 64, a threadgroup per output (32 threads up to 512, 128 up to 1024,
# then one per 4 elements). row_reduce_simple: contiguous rows, 4 per threadgroup (the last
# threadgroup steps back to stay inside the output).
ROW_LAYOUTS = {
    ("row_reduce_small", 1): [((37, 13), (1,), (37, 1)),            # a thread per output
                              ((4, 9, 3), (2,), (9, 4)),            # ... on a 2-D grid
                              ((6, 40, 5), (1, 2), (6, 1))],        # a SIMD-group per output
    ("row_reduce_small", 2): [((2, 9, 3, 5), (0, 2, 3), (9, 1)),
                              ((3, 6, 4, 10), (0, 2, 3), (3, 2))],
    ("row_reduce_small", 5): [((2, 2, 5, 2, 7), (0, 1, 3, 4), (5, 1)),
                              ((2, 3, 5, 2, 11), (0, 1, 3, 4), (5, 1))],
    ("row_reduce_looped", 1): [((12, 3, 150), (1, 2), (4, 3)),
                               ((3, 1101), (1,), (3, 1))],          # 276 -> 288 threads
    ("row_reduce_looped", 2): [((2, 5, 3, 100), (0, 2, 3), (5, 1)),
                               ((2, 3, 2, 700), (0, 2, 3), (3, 1))],  # 128 threads
    ("row_reduce_looped", 5): [((2, 2, 4, 2, 90), (0, 1, 3, 4), (2, 2))],
    ("row_reduce_simple", 1): [((37, 150), (1,), (37, 1)),
                               ((9, 1030), (1,), (9, 1))],
}


def check_row_reduce(mlx_lib, case):
    fn = mlx_lib[case.kernel]
    out_dtype = out_dtype_of(fn)
    for index, (shape, axes, (width, height)) in enumerate(ROW_LAYOUTS[case.family, case.n]):
        layout = Layout(shape, axes)
        assert width * height == layout.n_out
        x = make_input(case.op, case.tag, shape, layout.per_output, _generator(case.kernel, index))
        x = plant(case.op, case.tag, x, axes)
        check_exactness(case.op, x, axes)
        want = reference(case.op, x, axes, out_dtype)
        row = shape[-1]
        if case.family == "row_reduce_simple":
            group = row_threadgroup_size(row)
            if x.element_size() == 8:
                group = min(group, 512)
            got = run(fn, x, layout.n_out, row, layout.n_out,
                      threads=(group, (width + 3) // 4, height), group_size=group)
        elif case.family == "row_reduce_small":
            args = layout.row_args()
            non_row = args[1]
            if (non_row < 32 and row <= 8) or non_row <= 8:
                threads, group = (width, height, 1), min(width, 1024)
            else:
                threads, group = (32, width, height), 32
            got = run(fn, x, layout.n_out, *args, threads=threads, group_size=group)
        else:
            group = row_threadgroup_size(row)
            got = run(fn, x, layout.n_out, *layout.row_args(), threads=(group, width, height), group_size=group)
        assert_same(f"{case.kernel} {shape} over {axes}", got, want)


# --- column reductions ---------------------------------------------------------------------

# Per (family, variant): (input shape, reduced axes, output grid (width, height)) where the
# grid counts the outputs before the columns (the kept axes after the last reduced one).
# col_reduce_small: rows (reduction size x other reductions) < 32; threadgroups of
# (columns / 4 up to 32) x (rows up to 8) threads, some of them past the last column.
# col_reduce_longcolumn: fewer than 32 columns, rows >= 1024: 32 blocks of partial results.
# col_reduce_looped: 32 x 32 tiles, 256 threads. col_reduce_2pass: rows > 256, 32 blocks.
COL_LAYOUTS = {
    ("col_reduce_small", 1): [((5, 9, 70), (1,), (5, 1)),
                              ((4, 3, 10), (1,), (2, 2)),
                              # 38 column blocks: 2 threadgroups of 32 x 3 per output row, lanes
                              # past the last column return before the barrier (Apple GPUs let
                              # finished threads pass a barrier; MLX relies on it)
                              ((4, 3, 150), (1,), (4, 1))],
    ("col_reduce_small", 2): [((3, 4, 5, 10), (0, 2), (4, 1))],
    ("col_reduce_small", 5): [((2, 2, 3, 7, 6), (0, 1, 3), (3, 1))],
    ("col_reduce_longcolumn", 1): [((3, 1100, 5), (1,), (3, 1))],
    ("col_reduce_longcolumn", 2): [((4, 3, 300, 7), (0, 2), (3, 1))],
    ("col_reduce_longcolumn", 5): [((2, 2, 2, 300, 6), (0, 1, 3), (2, 1))],
    ("col_reduce_looped", 1): [((3, 100, 70), (1,), (3, 1)),
                               ((2, 3, 50, 33), (2,), (3, 2))],
    ("col_reduce_looped", 2): [((3, 2, 40, 45), (0, 2), (2, 1))],
    ("col_reduce_looped", 5): [((2, 2, 3, 30, 40), (0, 1, 3), (3, 1))],
    ("col_reduce_2pass", 1): [((3, 300, 40), (1,), (3, 1))],
    ("col_reduce_2pass", 2): [((3, 2, 100, 40), (0, 2), (2, 1))],
    ("col_reduce_2pass", 5): [((2, 2, 2, 80, 33), (0, 1, 3), (2, 1))],
}
BLOCKS = 32  # outer blocks of the two-pass column reductions (reduce.cpp, fewer than 32768 rows)


def _second_pass(mlx_lib, case: Case, partial: torch.Tensor, n_out: int, out_tag: str) -> torch.Tensor:
    """What reduce.cpp runs on the partial results: col_reduce_looped_1_32_32 over the 32 blocks."""
    fn = mlx_lib[_family_name("col_reduce_looped", 1, False, case.op, out_tag)]
    partial = partial.contiguous()
    return run(fn, partial, n_out, BLOCKS, n_out, [0], [0], 0, [BLOCKS], [n_out], 1, 1, 0,
               threads=(256 * ((n_out + 31) // 32), 1, 1), group_size=256)


def check_col_reduce(mlx_lib, case):
    fn = mlx_lib[case.kernel]
    out_dtype = out_dtype_of(fn)
    out_tag = next(tag for tag, dtype in TAGS.items() if dtype == out_dtype)
    for index, (shape, axes, (width, height)) in enumerate(COL_LAYOUTS[case.family, case.n]):
        layout = Layout(shape, axes)
        outer, columns, rows = layout.n_out // layout.columns, layout.columns, layout.total_rows
        assert width * height == outer
        x = make_input(case.op, case.tag, shape, layout.per_output, _generator(case.kernel, index))
        x = plant(case.op, case.tag, x, axes)
        check_exactness(case.op, x, axes)
        want = reference(case.op, x, axes, out_dtype)
        name = f"{case.kernel} {shape} over {axes}"
        args = layout.col_args()
        if case.family == "col_reduce_small":
            assert rows < 32
            blocks = (columns + 3) // 4
            group_x, group_y = min(blocks, 32), min(8, rows)
            groups_x = (blocks + group_x - 1) // group_x
            # Lanes past the last column return before the barrier: Apple GPUs and the
            # parallel schedule let them pass; the debug schedules report it (Metal leaves it
            # undefined), so this launch keeps the parallel one under TORCH_METALLIB_CPU_SCHEDULE.
            lanes_past_the_end = groups_x * group_x > blocks and group_y > 1
            with tm.cpu_schedule("parallel") if lanes_past_the_end else contextlib.nullcontext():
                got = run(fn, x, layout.n_out, *args, threads=(groups_x * group_x, width * group_y, height),
                          group_size=(group_x, group_y, 1))
        elif case.family == "col_reduce_looped":
            got = run(fn, x, layout.n_out, *args, 0,
                      threads=(256 * ((columns + 31) // 32), width, height), group_size=256)
        elif case.family == "col_reduce_longcolumn":
            assert columns < 32 and rows >= 1024 and height == 1
            group_y = min(32, (rows + BLOCKS - 1) // BLOCKS)
            partial = run(fn, x, BLOCKS * layout.n_out, *args, layout.n_out,
                          threads=(width * columns, group_y, BLOCKS), group_size=(columns, group_y, 1))
            # thread row lid.y of block z reads rows z * group_y + lid.y, then every 32 * group_y
            block_of_row = (torch.arange(rows) // group_y) % BLOCKS
            want_partial = layout.col_blocks(x, block_of_row, BLOCKS, case.op, out_dtype)
            assert_same(name + " (partial results)", partial, want_partial)
            got = _second_pass(mlx_lib, case, partial.view(BLOCKS, layout.n_out), layout.n_out, out_tag)
        else:  # col_reduce_2pass
            assert rows > 256 and height == 1
            partial = run(fn, x, BLOCKS * layout.n_out, *args, 0, outer,
                          threads=(256 * ((columns + 31) // 32), width * BLOCKS, 1), group_size=256)
            # block b reads the 32-row tiles b, b + 32, b + 64, ...
            block_of_row = (torch.arange(rows) // 32) % BLOCKS
            want_partial = layout.col_blocks(x, block_of_row, BLOCKS, case.op, out_dtype)
            assert_same(name + " (partial results)", partial, want_partial)
            got = _second_pass(mlx_lib, case, partial.view(BLOCKS, layout.n_out), layout.n_out, out_tag)
        assert_same(name, got, want)


# --- init_reduce ---------------------------------------------------------------------------

def check_init_reduce(mlx_lib, case):
    """reduce_init.h: what an empty reduction gives, the op's identity (torch: sum and
    prod of an empty tensor; the type's limits for max/min, +-inf for floats)."""
    fn = mlx_lib[case.kernel]
    dtype = METAL_TYPES[fn.arguments[0].type_name]
    if case.op in ("sum", "prod"):
        empty = torch.empty(0, dtype=torch.float64 if dtype.is_floating_point else torch.int64)
        want = (empty.sum() if case.op == "sum" else empty.prod()).to(dtype)
    else:
        want = identity(case.op, dtype)
    for threads in ((300, 1, 1), (7, 5, 1)):
        n = threads[0] * threads[1]
        out = guarded(n, dtype)
        fn(out, threads=threads, group_size=(min(threads[0], 256), 1, 1))
        assert bool((out[n:].view(torch.uint8) == 0xA5).all()), f"{case.kernel}: wrote past {n}"
        assert_same(f"{case.kernel} {threads}", out[:n], want.expand(n))


# --- argmin / argmax -----------------------------------------------------------------------

def _arg_input(op: str, tag: str, shape, axis: int, gen) -> torch.Tensor:
    """Few distinct values, so rows have ties (MLX and torch both return the first index of
    the extreme value); integer types include their extremes (signed/unsigned mix-ups),
    floats +-inf. In every other row the extreme is unique and sits at a probe position
    (first, last, spread out), so that the result depends on reading that element."""
    if tag == "bool_":
        choices = torch.tensor([False, True])
        weights = torch.ones(2)
    elif tag in FLOATS:
        choices = torch.tensor([-math.inf, -3.5, -1.0, 0.0, 2.25, 7.0, math.inf], dtype=TAGS[tag])
        weights = torch.tensor([0.02, 0.2, 0.2, 0.2, 0.2, 0.16, 0.02])
    else:
        lo, hi = _int_range(tag)
        values = [lo, lo + 1, -1, 0, 1, hi - 1, hi] if lo < 0 else [lo, lo + 1, 2, (hi + 1) // 2, hi - 1, hi]
        choices = _as_tag(torch.tensor([v - (1 << 64) if v >= 1 << 63 else v for v in values]), tag)
        weights = torch.ones(len(values))
    moved_shape = [shape[a] for a in range(len(shape)) if a != axis] + [shape[axis]]
    n_out, size = math.prod(moved_shape[:-1]), shape[axis]
    picks = torch.multinomial(weights, n_out * size, replacement=True, generator=gen).view(n_out, size)
    extreme = len(choices) - 1 if op == "argmax" else 0
    planted = torch.arange(0, n_out, 2)
    if len(choices) > 2:  # the others from the values strictly between the extremes
        inner = torch.randint(1, len(choices) - 1, (len(planted), size), generator=gen)
    else:
        inner = torch.full((len(planted), size), 1 - extreme)
    inner[torch.arange(len(planted)), probe_positions(n_out, size)[planted]] = extreme
    picks[planted] = inner
    return choices[picks].view(moved_shape).movedim(-1, axis).contiguous()


def _arg_reference(op: str, x: torch.Tensor, dim: int) -> torch.Tensor:
    """torch.argmax / argmin (first index of the extreme) on an order-preserving copy."""
    if x.dtype.is_floating_point:
        wide = x.double()
    else:
        wide = _ordered_int64(x) if x.dtype != torch.bool else x.to(torch.int64)
    return (wide.argmax(dim=dim) if op == "argmax" else wide.argmin(dim=dim)).to(torch.int32)


# (input shape, reduced axis, threadgroup size): a strided axis, the last axis with several
# loops over it and 3 SIMD-groups, a short last axis with lanes reading past its end.
ARG_LAYOUTS = [((5, 300, 7), 1, 64), ((4, 1000), 1, 96), ((9, 45), 1, 32)]


def check_arg_reduce(mlx_lib, case):
    """arg_reduce.metal: a threadgroup per output, N_READS = 4 per thread, SIMD shuffles of
    (index, value) pairs and a threadgroup of per-SIMD-group winners."""
    fn = mlx_lib[case.kernel]
    for index, (shape, axis, group) in enumerate(ARG_LAYOUTS):
        x = _arg_input(case.op, case.tag, shape, axis, _generator(case.kernel, index))
        strides = contiguous_strides(shape)
        kept = [a for a in range(len(shape)) if a != axis]
        out_shape = [shape[a] for a in kept]
        n_out = math.prod(out_shape)
        got = run(fn, x, n_out, out_shape, [strides[a] for a in kept], contiguous_strides(out_shape),
                  len(kept), strides[axis], shape[axis],
                  threads=(group, n_out, 1), group_size=group, out_dtype=torch.int32)
        assert_same(f"{case.kernel} {shape} over {axis}", got, _arg_reference(case.op, x, axis))

"""MLX's scan kernels (sum, prod, max, min; inclusive or exclusive, forward or reversed, contiguous
or strided) called as MLX's host code calls them and checked exactly against torch: the cases
and the check tests/test_cpu_mlx_scans.py runs on the CPU and tests/test_cuda.py mirrors on a GPU."""

import math

import torch
SENTINEL = 0xA5
TAIL = 64  # sentinel bytes after each output buffer


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _seed(*parts) -> int:
    """A stable seed from the test parameters (Python's hash() of str is salted per run)."""
    return sum((i + 1) * ord(c) for i, c in enumerate("/".join(map(str, parts)))) % (2 ** 31)


def _output(shape, dtype):
    """(out, raw): `out` views the front of `raw`, a byte buffer prefilled with SENTINEL that
    holds TAIL more bytes after the output."""
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    raw = torch.full((nbytes + TAIL,), SENTINEL, dtype=torch.uint8)
    return raw[:nbytes].view(dtype).view(shape), raw


def _assert_tail(raw):
    tail = raw[-TAIL:]
    assert bool((tail == SENTINEL).all()), f"bytes written past the output: {tail.tolist()}"


def _assert_equal(out, expected, what=""):
    if out.dtype == torch.bool:  # compare bytes: an unwritten 0xA5 is no valid bool
        out, expected = out.view(torch.uint8), expected.view(torch.uint8)
    if out.is_complex():
        out, expected = torch.view_as_real(out), torch.view_as_real(expected)
    if not torch.equal(out, expected):
        bad = (out != expected).nonzero()
        first = tuple(bad[0].tolist())
        raise AssertionError(f"{what}: {len(bad)} of {out.numel()} elements differ; first at {first}: "
                             f"got {out[first].item()!r}, expected {expected[first].item()!r}")


# --- scans -----------------------------------------------------------------------------------

# MLX type name -> (torch dtype holding it, kind, bits). Unsigned 16/32/64-bit types travel in
# the signed torch dtype of the same width (the bits are what the kernel reads).
SCAN_TYPES = {
    "bool_": (torch.bool, "bool", 8),
    "uint8": (torch.uint8, "unsigned", 8),
    "uint16": (torch.int16, "unsigned", 16),
    "uint32": (torch.int32, "unsigned", 32),
    "uint64": (torch.int64, "unsigned", 64),
    "int8": (torch.int8, "signed", 8),
    "int16": (torch.int16, "signed", 16),
    "int32": (torch.int32, "signed", 32),
    "int64": (torch.int64, "signed", 64),
    "float16": (torch.float16, "float", 16),
    "float32": (torch.float32, "float", 32),
    "bfloat16": (torch.bfloat16, "float", 16),
    "complex64": (torch.complex64, "complex", 64),
}
OPS = ("sum", "prod", "max", "min")
# (layout, inclusive, reverse): the eight kernels of each (op, type).
ALL_VARIANTS = [(layout, inclusive, reverse) for layout in ("contig", "strided")
                for inclusive in (True, False) for reverse in (False, True)]
# Four of the eight, still covering each layout with each flag value.
SOME_VARIANTS = [("contig", True, False), ("contig", False, True),
                 ("strided", True, True), ("strided", False, False)]
FULL_TYPES = ("float32", "float16", "bfloat16", "int32", "int64", "uint64")
OTHER_TYPES = ("bool_", "uint8", "uint16", "uint32", "int8", "int16")

CONTIG_SHAPE = (2, 3, 1000)  # lines (z, y) x axis; 1000 is no multiple of N_READS * 32
CONTIG_GROUP = 64            # -> 4 passes per line (N_READS 4) or 8 (N_READS 2)
STRIDED_SHAPE = (2, 70, 45)  # matrices x axis x stride: 3 row blocks of 32, 2 column blocks


def _scan_name(layout, inclusive, reverse, op, type_name):
    out_name = "int32" if (op == "sum" and type_name == "bool_") else type_name
    return (f"{layout}_scan_{'reverse_' if reverse else ''}{'inclusive' if inclusive else 'exclusive'}"
            f"_{op}_{type_name}_{out_name}")


def _out_dtype(op, type_name):
    return torch.int32 if (op == "sum" and type_name == "bool_") else SCAN_TYPES[type_name][0]


def _n_reads(type_name):
    return 4 if SCAN_TYPES[type_name][0].itemsize <= 4 else 2


def _scan_data(op, type_name, shape, g):
    dtype, kind, bits = SCAN_TYPES[type_name]
    n = math.prod(shape)
    if kind == "complex":
        if op == "sum":  # Gaussian integers: every partial sum is exact
            return torch.complex(torch.randint(-3, 4, shape, generator=g).float(),
                                 torch.randint(-3, 4, shape, generator=g).float())
        # units 1, i, -1, -i times rare 2 or 1/2: every partial product is exact
        unit = torch.tensor([1, 1j, -1, -1j], dtype=torch.complex64)[torch.randint(0, 4, shape, generator=g)]
        r = torch.rand(shape, generator=g)
        return unit * torch.where(r < 0.01, 2.0, torch.where(r < 0.02, 0.5, 1.0))
    if op in ("max", "min"):
        if kind == "bool":  # rare Trues for max (any), rare Falses for min (all)
            r = torch.rand(shape, generator=g)
            return r < 0.004 if op == "max" else r > 0.004
        if kind == "float":
            return (torch.randn(shape, generator=g) * 100).to(dtype)
        # arbitrary bit patterns: the whole range, top bit included
        return torch.randint(0, 256, (n * bits // 8,), generator=g, dtype=torch.uint8).view(dtype).view(shape)
    if op == "sum":
        if kind == "bool":
            return torch.rand(shape, generator=g) < 0.5
        if kind == "float":  # small integers: every partial sum is exact in any order
            return torch.randint(-1, 2, shape, generator=g).to(dtype)
        a = {8: 1, 16: 20, 32: 10 ** 6, 64: 2 ** 40}[bits]
        low = -a if kind == "signed" else 0
        return torch.randint(low, a + 1, shape, generator=g).to(dtype)  # uint8 sums wrap (defined)
    # prod
    r = torch.rand(shape, generator=g)
    if kind == "bool":
        return r > 0.003
    if kind == "float":  # +-1 with rare 2 or 1/2: every partial product is exact
        sign = torch.where(torch.rand(shape, generator=g) < 0.5, -1.0, 1.0)
        return (sign * torch.where(r < 0.01, 2.0, torch.where(r < 0.02, 0.5, 1.0))).to(dtype)
    x = torch.where(r < (0.0015 if bits == 8 else 0.003), 2, 1)  # int8 holds 2**6 at most
    if kind == "signed":
        x = x * torch.where(torch.rand(shape, generator=g) < 0.5, -1, 1)
    x.view(-1)[n // 2] = 0
    return x.to(dtype)


def _shift(res, dim, identity):
    """Exclusive from inclusive along `dim`: identity first, then all but the last."""
    first = torch.full_like(res.narrow(dim, 0, 1), identity)
    return torch.cat([first, res.narrow(dim, 0, res.shape[dim] - 1)], dim)


def _scan_reference(x, op, type_name, inclusive, reverse, dim):
    """torch's cumsum / cumprod / cummax / cummin (or logcumsumexp) in the dtype of the output."""
    dtype, kind, bits = SCAN_TYPES[type_name]
    out_dtype = _out_dtype(op, type_name)
    if reverse:
        x = x.flip(dim)
    key = None
    if op == "logaddexp":
        v, identity = x.double(), -math.inf
        res = torch.logcumsumexp(v, dim)
    elif op in ("sum", "prod"):
        if kind == "float" or kind == "complex":
            v = x.to(torch.complex128) if kind == "complex" else x.double()
        else:
            v = x.long()  # unsigned bit patterns in signed storage: same result modulo 2**bits
        identity = 0 if op == "sum" else 1
        res = torch.cumsum(v, dim) if op == "sum" else torch.cumprod(v, dim)
    else:
        if kind == "float":
            v = x.double()
            identity = -math.inf if op == "max" else math.inf
        elif kind == "bool":
            v, identity = x.long(), (0 if op == "max" else 1)
        elif kind == "unsigned" and dtype != torch.uint8:
            # Flipping the top bit maps unsigned order onto the signed order of the storage.
            key = torch.tensor(-(2 ** (bits - 1)), dtype=dtype)
            v = (x ^ key).long()
            info = torch.iinfo(dtype)
            identity = info.min if op == "max" else info.max  # = unsigned 0 / 2**bits - 1
        else:
            v = x.long()
            info = torch.iinfo(dtype)
            identity = info.min if op == "max" else info.max
        res = (torch.cummax(v, dim) if op == "max" else torch.cummin(v, dim)).values
    if not inclusive:
        res = _shift(res, dim, identity)
    if reverse:
        res = res.flip(dim)
    if out_dtype == torch.bool:
        return res != 0
    res = res.to(out_dtype)  # integers: truncation, i.e. wrap-around
    return res ^ key if key is not None else res


def _run_scan(mlx_lib, name, x, out_dtype, layout, n_reads):
    out, raw = _output(x.shape, out_dtype)
    if layout == "contig":
        z, y, size = x.shape
        mlx_lib[name](x, out, size, threads=(CONTIG_GROUP, y, z), group_size=(CONTIG_GROUP, 1, 1))
    else:
        matrices, size, stride = x.shape
        blocks = (stride + 31) // 32
        group = (32 // n_reads) * 32
        mlx_lib[name](x, out, size, stride, blocks, threads=(group, blocks, matrices), group_size=(group, 1, 1))
    _assert_tail(raw)
    return out


def _check_exact_scan(mlx_lib, op, type_name, layout, inclusive, reverse):
    name = _scan_name(layout, inclusive, reverse, op, type_name)
    shape = CONTIG_SHAPE if layout == "contig" else STRIDED_SHAPE
    dim = 2 if layout == "contig" else 1
    x = _scan_data(op, type_name, shape, _generator(_seed(op, type_name, layout)))
    expected = _scan_reference(x, op, type_name, inclusive, reverse, dim)
    _check_preconditions(x, op, type_name, dim)
    out = _run_scan(mlx_lib, name, x, _out_dtype(op, type_name), layout, _n_reads(type_name))
    _assert_equal(out, expected, name)


def _check_preconditions(x, op, type_name, dim):
    """The data generators promise exact float results and no signed overflow; make sure."""
    dtype, kind, bits = SCAN_TYPES[type_name]
    if kind == "float" and op == "sum":  # integers below 2**(mantissa bits + 1) are exact
        limit = {torch.float32: 2 ** 24, torch.float16: 2 ** 11, torch.bfloat16: 2 ** 8}[dtype]
        assert x.double().cumsum(dim).abs().max().item() <= limit
    if kind == "float" and op == "prod":  # powers of two within the normal range of half
        assert x.double().abs().log2().cumsum(dim).abs().max().item() <= 14
    if kind == "signed":
        full = torch.cumsum(x.long(), dim) if op == "sum" else torch.cumprod(x.long(), dim)
        if op in ("sum", "prod"):
            assert full.abs().max().item() < 2 ** (bits - 1)


FULL_CASES = [(op, t, *v) for op in OPS for t in FULL_TYPES for v in ALL_VARIANTS]
OTHER_CASES = [(op, t, *v) for op in OPS for t in OTHER_TYPES for v in SOME_VARIANTS]


def _case_id(case):
    op, type_name, layout, inclusive, reverse = case
    return _scan_name(layout, inclusive, reverse, op, type_name)


def check_scan_exact(mlx_lib, case):
    """cumsum / cumprod / cummax / cummin, all exact: integers (wrapping where unsigned),
    integer-valued float sums, power-of-two float products, and float max / min (no
    arithmetic). Compared with torch bit for bit."""
    _check_exact_scan(mlx_lib, *case)

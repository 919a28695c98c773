"""The conformance cases of tests/test_cpu_conformance.py (Apple-built MLX kernels against torch,
on inputs inside each op's domain, into guarded outputs: that module's docstring says how) and
the checks that run them, shared with the GPU backends' mirrors (tests/test_cuda.py,
test_metal_sim.py, test_mps.py), plus the checks of the project's fixture kernels."""

import math
import struct
from typing import Dict, NamedTuple, Tuple

import pytest
import torch

from _mlx_families import (ALL_TYPES, DTYPES, FLOAT_TYPES, GROUP_2D, MAIN_TYPES, SIZE_1D, SIZE_2D_EXACT, binary_inputs,
                           binary_ops, binary_out_tag, binary_reference, cast_input, cast_reference, compare,
                           element_before, generator, grid_2d, random_bools, sentinel_like, unary_input, unary_ops,
                           unary_reference, untouched, work_per_thread)


# --- tolerances -----------------------------------------------------------------------------
# Why: host libm / MLX's polynomials vs the correctly rounded value (torch, float64) differ by a few ulp.
#
# op: (float32 ulps, float16/bfloat16 ulps, floor). Check: |got - want| <= ulps * eps(dtype) *
# max(|want|, floor, smallest normal); floor > 0 where the result crosses zero by cancellation.
# References for these ops are torch in float64 rounded once to the kernel's type; float16 and
# bfloat16 kernels compute in float (or half arithmetic: Sigmoid, LogAddExp) and round, hence
# their own budget. Worst seen on this suite (x86-64, glibc): 1.7 ulp (float32 ErfInv), 1.2 ulp
# (float16 Sigmoid). Float ops not listed are exact, down to the sign of zero: add, subtract,
# multiply, divide, sqrt, floor, ceil, round, abs, negative, sign, square, maximum, minimum,
# remainder, floor-divide, divmod, select, comparisons, casts, fp8, arange.
# Float32 Expm1 and Erf are compared with MLX's own algorithm replayed in float32
# (_mlx_families.mlx_expm1f / mlx_erff): MLX's expm1f reduces its argument with the high part
# of ln 2 only, so it is up to ~150 ulp off the true value on [-8, 8], on the GPU as well.
TOLERANCES: Dict[str, Tuple[float, float, float]] = {
    "Exp": (2, 1, 0.0), "Expm1": (2, 1, 0.0), "Log": (2, 1, 0.0), "Log2": (2, 1, 0.0),
    "Log10": (2, 1, 0.0), "Log1p": (2, 1, 0.0), "Sin": (2, 1, 0.0), "Cos": (2, 1, 0.0),
    "Tan": (2, 1, 0.0), "ArcSin": (2, 1, 0.0), "ArcCos": (2, 1, 0.0), "ArcTan": (2, 1, 0.0),
    "Sinh": (2, 1, 0.0), "Cosh": (2, 1, 0.0), "Tanh": (3, 1, 0.0), "ArcSinh": (2, 1, 0.0),
    "ArcCosh": (2, 1, 0.0), "ArcTanh": (2, 1, 0.0), "Erf": (2, 1, 0.0), "ErfInv": (3, 1, 0.0),
    "Sigmoid": (2, 2, 0.0), "Rsqrt": (2, 1, 0.0), "Power": (2, 1, 0.0), "LogAddExp": (2, 2, 1.0),
    "ArcTan2": (2, 1, 0.0),
}


def tolerance(op: str, tag: str) -> Tuple[float, float]:
    """(ulps, floor) for `op` on float type `tag`; (0, 0) = exact."""
    f32, half, floor = TOLERANCES.get(op, (0, 0, 0.0))
    return (f32 if tag == "float32" else half), floor


def check(name: str, got: torch.Tensor, want: torch.Tensor, op: str = "", tag: str = "") -> None:
    ulps, floor = tolerance(op, tag) if tag in FLOAT_TYPES else (0, 0.0)
    problem = compare(got, want.to(got.dtype) if got.dtype != want.dtype else want, ulps, floor)
    assert problem is None, f"{name}: {problem}"


def check_tail(name: str, out: torch.Tensor, written: int) -> None:
    """Nothing written past the grid's elements, nor just before the output's first one."""
    assert untouched(out[written:]), f"{name}: wrote past the {written} elements of its grid"
    assert untouched(element_before(out)), f"{name}: wrote before its output's first element"


# --- parametrization ------------------------------------------------------------------------

class Case(NamedTuple):
    family: str   # "v", "vv", "g2", "copy_g1", ...
    kernel: str
    op: str       # MLX op, "copy", "arange", ...
    tag: str      # input type tag
    out: str      # output type tag

    @property
    def id(self) -> str:
        return self.kernel


def _unary_cases(family: str, tags) -> list:
    cases = []
    for tag in tags:
        for op in unary_ops(tag):
            cases.append(Case(family, f"{family}_{op}{tag}{tag}", op, tag, tag))
    return cases


def _binary_cases(family: str, tags) -> list:
    return [Case(family, f"{family}_{op}{tag}", op, tag, binary_out_tag(op, tag))
            for tag in tags for op in binary_ops(tag)]


COPY_SUBSET = sorted({(s, d) for s in MAIN_TYPES for d in MAIN_TYPES} | {(t, t) for t in ALL_TYPES})


def _copy_cases(family: str, pairs) -> list:
    return [Case(f"copy_{family}", f"{family}_copy{s}{d}", "copy", s, d) for s, d in pairs]


ALL_PAIRS = [(s, d) for s in ALL_TYPES for d in ALL_TYPES]
NARROW = [t for t in ALL_TYPES if work_per_thread(t) > 1]  # types with an n-variant

UNARY_CASES = (
    _unary_cases("v", ALL_TYPES)
    + _unary_cases("v2", MAIN_TYPES + ("int64", "uint8"))
    + _unary_cases("vn", MAIN_TYPES + ("uint8", "int16"))
    + _unary_cases("gn1", MAIN_TYPES)
    + _unary_cases("gn4large", ("float32", "int32"))
)


SELECT_CASES = ([Case("v", f"v_Select{t}", "Select", t, t) for t in ALL_TYPES]
                + [Case("vn", f"vn_Select{t}", "Select", t, t) for t in MAIN_TYPES])
BINARY_CASES = (
    _binary_cases("vv", ALL_TYPES)
    + _binary_cases("sv", MAIN_TYPES + ("int64", "uint8"))
    + _binary_cases("vs", MAIN_TYPES + ("int64", "uint8"))
    + _binary_cases("ss", MAIN_TYPES)
    + _binary_cases("vv2", MAIN_TYPES + ("int64",))
    + _binary_cases("sv2", ("float32", "int64"))
    + _binary_cases("vs2", ("float32", "int64"))
    + _binary_cases("vvn", MAIN_TYPES + ("uint8", "int16"))
    + _binary_cases("svn", ("float32", "int32", "bool_"))
    + _binary_cases("vsn", ("float32", "int32", "bool_"))
)
STRIDED_BINARY_CASES = (
    _binary_cases("g1", MAIN_TYPES) + _binary_cases("g2", MAIN_TYPES) + _binary_cases("g3", MAIN_TYPES)
    + _binary_cases("gn2", MAIN_TYPES)
    + [c for f in ("g1large", "g2large", "g3large", "gn4large") for c in _binary_cases(f, ("float32", "int32"))]
)
COPY_CASES = (
    _copy_cases("s", ALL_PAIRS) + _copy_cases("v", ALL_PAIRS)
    + _copy_cases("s2", COPY_SUBSET) + _copy_cases("v2", COPY_SUBSET)
    + _copy_cases("sn", [(s, d) for s, d in COPY_SUBSET if d in NARROW])
    + _copy_cases("vn", [(s, d) for s, d in COPY_SUBSET if d in NARROW])
)
LARGE_COPY_TYPES = ("float32", "int32", "float16", "bool_")
LARGE_COPY_PAIRS = [(s, d) for s in LARGE_COPY_TYPES for d in LARGE_COPY_TYPES]
STRIDED_COPY_CASES = (
    _copy_cases("g1", COPY_SUBSET) + _copy_cases("g2", COPY_SUBSET) + _copy_cases("g3", COPY_SUBSET)
    + _copy_cases("gn2", COPY_SUBSET)
    + [c for f in ("g1large", "g2large", "g3large", "gn4large") for c in _copy_cases(f, LARGE_COPY_PAIRS)]
    # strided destinations (same type in and out)
    + [Case(f"copy_{f}", f"{f}_copy{t}{t}", "copy", t, t) for t in MAIN_TYPES
       for f in ("gg1", "gg2", "gg3", "ggn2", "gg1large", "gg2large", "gg3large", "ggn4large")]
)
ARANGE_CASES = [Case("arange", f"arange{t}", "arange", t, t) for t in ALL_TYPES if t != "bool_"]


def params(cases):
    return [pytest.param(case, id=case.id) for case in cases]


# --- strided layouts and launches ------------------------------------------------------------

def _permuted(values: torch.Tensor, shape) -> torch.Tensor:
    """`values` as a non-contiguous view of `shape` (storage laid out in reversed axis order)."""
    return values.reshape(tuple(reversed(shape))).permute(*reversed(range(len(shape))))


SHAPE_2D = (67, 61)       # threads (61, 67)
SHAPE_3D = (5, 7, 33)     # threads (33, 7, 5)
SHAPE_ND = (3, 4, 5, 33)  # gn2 / gn4large: 2 or 4 elements per thread along the last axis (33)
GROUP_3D = (8, 4, 2)      # 33 = 4 * 8 + 1, 7 = 4 + 3, 5 = 2 * 2 + 1: partial groups on every axis


class Operand(NamedTuple):
    """A strided input: what the kernel gets (a tensor whose data_ptr is the element at
    index 0, and strides in elements, possibly negative) and its logical value."""
    pointer: torch.Tensor
    strides: list
    value: torch.Tensor


def _view(t: torch.Tensor) -> Operand:
    return Operand(t, list(t.stride()), t)


def _flipped(view: torch.Tensor, dims) -> Operand:
    """`view` read backwards along `dims`: negative strides, which torch views cannot
    express; the kernel gets a pointer to the element that comes first that way."""
    strides, offset = list(view.stride()), view.storage_offset()
    for d in dims:
        offset += (view.shape[d] - 1) * strides[d]
        strides[d] = -strides[d]
    same_width = {torch.uint16: torch.int16, torch.uint32: torch.int32, torch.uint64: torch.int64}
    signed = same_width.get(view.dtype, view.dtype)  # torch has no flip for uint16/32/64
    return Operand(view.as_strided((1,), (1,), offset), strides, view.view(signed).flip(dims).view(view.dtype))


def _layouts(shape, values_a, values_b):
    """(a, b) over `shape`, from value generators (count -> 1-D tensor), both non-contiguous:
    1-D: a every other element from offset 1, b backwards (stride -1);
    2-D: a transposed, b with its rows backwards (negative row stride);
    3-D: a permuted, b broadcast along axis 0 (stride 0);
    N-D: a permuted, b every other element of the last axis (offset 1), backwards along axis 1."""
    numel = math.prod(shape)
    if len(shape) == 1:
        return _view(values_a(2 * numel + 1)[1::2]), _flipped(values_b(numel), (0,))
    a = _view(_permuted(values_a(numel), shape))
    if len(shape) == 2:
        return a, _flipped(values_b(numel).reshape(shape), (0,))
    if len(shape) == 3:
        return a, _view(values_b(numel // shape[0]).reshape(1, *shape[1:]).expand(*shape))
    wide = (*shape[:-1], 2 * shape[-1] + 1)
    return a, _flipped(values_b(math.prod(wide)).reshape(wide)[..., 1::2], (1,))


def _launch_general(k, family: str, shape, operands, outs, out_strides=()) -> None:
    """Calls a strided kernel: g1/g2/g3 (and their `large` twins) take one stride list per
    input (then per output, for the gg copies); gn1/gn2/gn4large take the shape, the stride
    lists and ndim, and cover the last axis 1, 2 or 4 elements per thread."""
    numel = math.prod(shape)
    strides = [op.strides for op in operands] + list(out_strides)
    pointers = [op.pointer for op in operands]
    if family in ("g1", "g1large"):
        k(*pointers, *outs, *[s[0] for s in strides], threads=numel)
    elif family in ("g2", "g2large", "g3", "g3large"):
        k(*pointers, *outs, *strides, threads=tuple(reversed(shape)),
          group_size=GROUP_2D if len(shape) == 2 else GROUP_3D)
    else:
        per_thread = {"gn1": 1, "gn2": 2, "gn4large": 4}[family]
        threads = (-(-shape[-1] // per_thread), shape[-2], math.prod(shape[:-2]))
        k(*pointers, *outs, list(shape), *strides, len(shape), threads=threads, group_size=GROUP_3D)


STRIDED_SHAPES = {"g1": (SIZE_1D,), "g2": SHAPE_2D, "g3": SHAPE_3D, "gn2": SHAPE_ND, "gn4large": SHAPE_ND,
                  "g1large": (SIZE_1D,), "g2large": SHAPE_2D, "g3large": SHAPE_3D}


# --- unary ------------------------------------------------------------------------------------

def check_unary(mlx_lib, case):
    k, op, tag = mlx_lib[case.kernel], case.op, case.tag
    gen = generator(case.kernel)
    if case.family in ("gn1", "gn4large"):  # in_shape, in_strides, ndim; 1 or 4 per thread
        shape = SHAPE_3D if case.family == "gn1" else SHAPE_ND
        numel = math.prod(shape)
        values = lambda n: unary_input(op, tag, n, gen)  # noqa: E731
        permuted, other = _layouts(shape, values, values)
        x = permuted if case.family == "gn1" else other  # N-D: sliced and backwards
        out = sentinel_like(numel, case.out)
        _launch_general(k, case.family, shape, (x,), [out])
        check(case.kernel, out[:numel], unary_reference(op, x.value, tag).contiguous().flatten(), op, tag)
        check_tail(case.kernel, out, numel)
        return
    per_thread = 1 if case.family == "v" else work_per_thread(tag)
    if case.family == "v2":
        size = SIZE_2D_EXACT if per_thread == 1 else SIZE_1D
        launch = dict(threads=(61, 67) if per_thread == 1 else grid_2d(size, per_thread), group_size=GROUP_2D)
    else:
        size = SIZE_1D
        launch = dict(threads=-(-size // per_thread))
    x = unary_input(op, tag, size, gen)
    out = sentinel_like(size, case.out)
    k(x, out, size, **launch)
    check(case.kernel, out[:size], unary_reference(op, x, tag), op, tag)
    check_tail(case.kernel, out, size)


def check_select(mlx_lib, case):
    k, tag = mlx_lib[case.kernel], case.tag
    gen = generator(case.kernel)
    size = SIZE_1D
    cond = random_bools(size, gen)
    b, c = binary_inputs("Add", tag, size, gen)
    out = sentinel_like(size, tag)
    per_thread = 1 if case.family == "v" else work_per_thread(tag)
    k(cond, b, c, out, size, threads=-(-size // per_thread))
    # On bits: torch before 2.13 has no where() for uint16/32/64.
    signed = {torch.uint16: torch.int16, torch.uint32: torch.int32, torch.uint64: torch.int64}.get(b.dtype, b.dtype)
    check(case.kernel, out[:size], torch.where(cond, b.view(signed), c.view(signed)).view(b.dtype))
    check_tail(case.kernel, out, size)


# --- binary -----------------------------------------------------------------------------------

def _outputs(case: Case, size: int):
    return [sentinel_like(size, case.out) for _ in range(2 if case.op == "DivMod" else 1)]


def _check_binary(case: Case, outs, want, size: int) -> None:
    wants = want if isinstance(want, tuple) else (want,)
    assert len(wants) == len(outs)
    for which, (out, w) in enumerate(zip(outs, wants)):
        name = case.kernel + ("" if len(outs) == 1 else (" quotient", " remainder")[which])
        check(name, out[:size], w.contiguous().flatten(), case.op, case.tag)
        check_tail(name, out, size)


def check_binary_contiguous(mlx_lib, case):
    k, op, tag, family = mlx_lib[case.kernel], case.op, case.tag, case.family
    gen = generator(case.kernel)
    kind = family.rstrip("2n")  # vv / sv / vs / ss
    per_thread = work_per_thread(tag) if family.endswith(("2", "n")) else 1
    if family.endswith("2"):
        size = SIZE_2D_EXACT if per_thread == 1 else SIZE_1D
        launch = dict(threads=(61, 67) if per_thread == 1 else grid_2d(size, per_thread), group_size=GROUP_2D)
    else:
        size = SIZE_1D
        launch = dict(threads=-(-size // per_thread))
    a, b = binary_inputs(op, tag, size, gen)
    if kind[0] == "s":
        a = a[:1].clone()
    if kind[1] == "s":
        b = b[:1].clone()
    outs = _outputs(case, size)
    args = [a, b, *outs] + ([] if kind == "ss" else [size])
    k(*args, **launch)
    want = binary_reference(op, a.expand(size), b.expand(size), tag)
    _check_binary(case, outs, want, size)


def check_binary_strided(mlx_lib, case):
    k, op, tag, family = mlx_lib[case.kernel], case.op, case.tag, case.family
    gen = generator(case.kernel)
    shape = STRIDED_SHAPES[family]
    numel = math.prod(shape)
    a, b = _layouts(shape, lambda n: binary_inputs(op, tag, n, gen)[0],
                    lambda n: binary_inputs(op, tag, n, gen)[1])
    outs = _outputs(case, numel)
    _launch_general(k, family, shape, (a, b), outs)
    _check_binary(case, outs, binary_reference(op, a.value, b.value, tag), numel)


# --- copies -----------------------------------------------------------------------------------

def check_copy_contiguous(mlx_lib, case):
    k, family = mlx_lib[case.kernel], case.family[len("copy_"):]
    gen = generator(case.kernel)
    per_thread = work_per_thread(case.out) if family in ("s2", "v2", "sn", "vn") else 1
    if family in ("s2", "v2"):
        size = SIZE_2D_EXACT if per_thread == 1 else SIZE_1D
        launch = dict(threads=(61, 67) if per_thread == 1 else grid_2d(size, per_thread), group_size=GROUP_2D)
    else:
        size = SIZE_1D
        launch = dict(threads=-(-size // per_thread))
    src = cast_input(case.tag, case.out, size, gen)
    if family.startswith("s"):
        src = src[5:6].clone()
    out = sentinel_like(size, case.out)
    k(src, out, size, **launch)
    check(case.kernel, out[:size], cast_reference(src.expand(size), case.out))
    check_tail(case.kernel, out, size)


def check_copy_strided(mlx_lib, case):
    k, family = mlx_lib[case.kernel], case.family[len("copy_"):]
    gen = generator(case.kernel)
    general = family[1:] if family.startswith("gg") else family  # gg2 -> g2, ggn2 -> gn2
    shape = STRIDED_SHAPES[general]
    numel = math.prod(shape)
    values = lambda n: cast_input(case.tag, case.out, n, gen)  # noqa: E731
    a, b = _layouts(shape, values, values)
    src = a if len(shape) == 3 else b  # permuted / backwards / backwards / sliced and backwards
    want = cast_reference(src.value, case.out).contiguous().flatten()
    if family.startswith("gg"):  # strided destination: every other element of a buffer
        wide = (*shape[:-1], 2 * shape[-1] + 1)
        base = sentinel_like(math.prod(wide), case.out, extra=0).reshape(wide)
        dst = base[..., 1::2]
        _launch_general(k, general, shape, (src,), [dst], [list(dst.stride())])
        # bools are read back as bytes (copying a bool tensor would normalize them)
        raw = base.view(torch.uint8) if case.out == "bool_" else base
        check(case.kernel, raw[..., 1::2].contiguous().flatten(),
              want.to(torch.uint8) if case.out == "bool_" else want)
        assert untouched(raw[..., 0::2]), f"{case.kernel}: wrote between the destination's strided elements"
        return
    out = sentinel_like(numel, case.out)
    _launch_general(k, general, shape, (src,), [out])  # gn copies: ndim is buffer(5), after the gap
    check(case.kernel, out[:numel], want)
    check_tail(case.kernel, out, numel)


# --- arange -----------------------------------------------------------------------------------

# tag: (start, step, size): every value, and index * step, exact in the type (and index
# itself exact in float16/bfloat16, which `index * step` converts it to).
ARANGE = {
    "float32": (-100.5, 0.125, SIZE_1D), "float16": (-3.5, 0.25, 2047), "bfloat16": (-20.0, 0.5, 255),
    "int8": (-120, 3, 83), "uint8": (5, 2, 125), "int16": (-30000, 13, SIZE_1D), "uint16": (7, 15, SIZE_1D),
    "int32": (-2_000_000_000, 900_001, SIZE_1D), "uint32": (100, 1_000_003, SIZE_1D),
    "int64": (-(1 << 40), (1 << 30) + 7, SIZE_1D), "uint64": (1 << 40, (1 << 33) + 1, SIZE_1D),
}


def check_arange(mlx_lib, case):
    start, step, size = ARANGE[case.tag]
    out = sentinel_like(size, case.tag)
    mlx_lib[case.kernel](start, step, out, threads=size)
    if case.tag in FLOAT_TYPES:
        want = (torch.arange(size, dtype=torch.float64) * step + start).to(DTYPES[case.tag])
    else:
        want = (torch.arange(size, dtype=torch.int64) * step + start).to(DTYPES[case.tag])
    check(case.kernel, out[:size], want)
    check_tail(case.kernel, out, size)


# --- the project's fixture kernels ----------------------------------------------------------

def _exact_floats(n: int, seed: int) -> torch.Tensor:
    """Multiples of 1/8 in [-64, 64]: products with the scales below and sums are exact,
    fused (llvm.fmuladd) or not."""
    return torch.randint(-512, 513, (n,), generator=torch.Generator().manual_seed(seed)).float() / 8


def check_fixture_vector_add_float(fixtures_lib):
    n = SIZE_1D
    a, b = _exact_floats(n, 1), _exact_floats(n, 2)
    out = sentinel_like(n, "float32")
    fixtures_lib.vector_add_float(a, b, out, threads=n)
    check("vector_add_float", out[:n], a + b)
    check_tail("vector_add_float", out, n)


def check_fixture_scale_shift_float(fixtures_lib, as_tensor):
    n = SIZE_1D
    x = _exact_floats(n, 3)
    scale, shift = (torch.tensor(0.75, dtype=torch.float64), torch.tensor(-1.25)) if as_tensor else (0.75, -1.25)
    out = sentinel_like(n, "float32")
    fixtures_lib.scale_shift_float(x, out, scale, shift, threads=n)
    check("scale_shift_float", out[:n], x * 0.75 - 1.25)
    check_tail("scale_shift_float", out, n)


def check_fixture_struct_arg_axpy(fixtures_lib):
    n, limit, alpha = SIZE_1D, 4000, 0.375
    x, y = _exact_floats(n + 1, 4), _exact_floats(n + 1, 5)
    y0 = y.clone()
    params_bytes = struct.pack("<fI", alpha, limit)  # struct Params { float alpha; uint n; }
    fixtures_lib.struct_arg_axpy(x, y, params_bytes, threads=n)
    check("struct_arg_axpy", y[:limit], alpha * x[:limit] + y0[:limit])
    check("struct_arg_axpy (i >= p.n)", y[limit:], y0[limit:])  # the guard held


def check_fixture_function_constant_scale(fixtures_lib, use_bias, alpha):
    n = SIZE_1D
    x, bias = _exact_floats(n, 6), _exact_floats(n, 7)
    out = sentinel_like(n, "float32")
    k = fixtures_lib.function_constant_scale
    if use_bias:
        k(x, out, bias, threads=n, constants={"use_bias": True, "alpha": alpha})
        want = alpha * x + bias
    else:  # `bias` exists only when use_bias is true: it is omitted
        k(x, out, threads=n, constants={"use_bias": False, "alpha": alpha})
        want = alpha * x + 0.0  # `+ 0.0f` in the source: -0.0 becomes +0.0
    check("function_constant_scale", out[:n], want)
    check_tail("function_constant_scale", out, n)

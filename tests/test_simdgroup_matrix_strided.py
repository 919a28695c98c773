"""The (pointer, extents, strides, origin) form of ``simdgroup_matrix_8x8_load`` / ``_store``
that Xcode 26's compiler emits (MLX's mac26 library, mlx-kquant): hand-written kernels that
move an 8x8 matrix between buffers, checked against torch indexing of the same memory, and
a product whose operands come through the new form."""

import pytest
import torch

from tests import _air_modules as air

_TYPES = {"float": ("f32", torch.float32), "half": ("f16", torch.float16), "bfloat": ("bf16", torch.bfloat16)}
SENTINEL = -7.0


def _vector(pair) -> str:
    return f"<2 x i64> <i64 {pair[0]}, i64 {pair[1]}>"


def _copy_kernel(element: str, load, store):
    """``out <- store(load(src))``: `load` and `store` are (extents, strides, origin)."""
    suffix = _TYPES[element][0]
    matrix = f"<64 x {element}>"
    load_name = f"air.simdgroup_matrix_8x8_load.v64{suffix}.p1{suffix}"
    store_name = f"air.simdgroup_matrix_8x8_store.v64{suffix}.p1{suffix}"
    body = [f"%m = call {matrix} @{load_name}(ptr addrspace(1) %src, "
            + ", ".join(_vector(v) for v in load) + ") #2",
            f"call void @{store_name}({matrix} %m, ptr addrspace(1) %out, "
            + ", ".join(_vector(v) for v in store) + ") #2"]
    declarations = [f"declare {matrix} @{load_name}(ptr addrspace(1), <2 x i64>, <2 x i64>, <2 x i64>) #1",
                    f"declare void @{store_name}({matrix}, ptr addrspace(1), <2 x i64>, <2 x i64>, <2 x i64>) #1"]
    name = f"copy_{element}_{abs(hash((load, store))) % 10**8}"
    text = air.module_text(name, body, [("src", element, "air.read"), ("out", element, "air.read_write")],
                           declarations, collective=True)
    return air.library(name, text)[name]


ROW_MAJOR_8 = ((8, 8), (1, 8), (0, 0))


def _run(element, load, store, src, out_shape):
    dtype = _TYPES[element][1]
    src = src.to(dtype)
    out = torch.full(out_shape, SENTINEL, dtype=dtype)
    _copy_kernel(element, load, store)(src, out, threads=32, group_size=32)
    return src, out


@pytest.mark.parametrize("element", list(_TYPES))
def test_load_row_major_transposed_offset_and_clipped(element):
    g = torch.Generator().manual_seed(26)
    memory = torch.randn(16 * 12, generator=g)
    cases = {  # load operands -> the matrix, by torch indexing of memory as 16 rows of 12
        "row-major": (((12, 8), (1, 12), (0, 0)), lambda s: s[:8, :8]),
        "transposed": (((8, 12), (12, 1), (0, 0)), lambda s: s[:8, :8].T),
        "origin": (((12, 16), (1, 12), (2, 3)), lambda s: s[3:11, 2:10]),
    }
    for label, (load, expect) in cases.items():
        src, out = _run(element, load, ROW_MAJOR_8, memory, (8, 8))
        assert torch.equal(out, expect(src.view(16, 12))), label
    # Extents (5 columns, 6 rows) cut the window at origin (1, 1): the rest reads as zero.
    src, out = _run(element, ((5, 6), (1, 12), (1, 1)), ROW_MAJOR_8, memory, (8, 8))
    expected = torch.zeros(8, 8, dtype=src.dtype)
    expected[:5, :4] = src.view(16, 12)[1:6, 1:5]
    assert torch.equal(out, expected)


@pytest.mark.parametrize("element", list(_TYPES))
def test_store_transposed_offset_and_clipped(element):
    g = torch.Generator().manual_seed(27)
    matrix = torch.randn(64, generator=g)
    src, out = _run(element, ROW_MAJOR_8, ((8, 12), (12, 1), (0, 0)), matrix, (10, 12))
    expected = torch.full((10, 12), SENTINEL, dtype=src.dtype)
    expected[:8, :8] = src.view(8, 8).T
    assert torch.equal(out, expected)
    # Origin (column 3, row 1) of a 12-wide memory, cut at 9 columns and 6 rows: elements
    # outside are not written.
    src, out = _run(element, ROW_MAJOR_8, ((9, 6), (1, 12), (3, 1)), matrix, (10, 12))
    expected = torch.full((10, 12), SENTINEL, dtype=src.dtype)
    expected[1:6, 3:9] = src.view(8, 8)[:5, :6]
    assert torch.equal(out, expected)


def test_product_of_operands_loaded_in_the_new_form():
    """D = A^T * B + C with A loaded transposed from a 10-wide memory and D stored
    row-major into a 16-wide one: the staged product sees the new form's fragments."""
    load = "air.simdgroup_matrix_8x8_load.v64f32.p1f32"
    store = "air.simdgroup_matrix_8x8_store.v64f32.p1f32"
    product = "air.simdgroup_matrix_8x8_multiply_accumulate.v64f32.v64f32.v64f32.v64f32"
    m = "<64 x float>"
    body = [f"%a = call {m} @{load}(ptr addrspace(1) %a_mem, {_vector((8, 10))}, {_vector((10, 1))}, {_vector((0, 0))}) #2",
            f"%b = call {m} @{load}(ptr addrspace(1) %b_mem, {_vector((8, 8))}, {_vector((1, 8))}, {_vector((0, 0))}) #2",
            f"%c = call {m} @{load}(ptr addrspace(1) %c_mem, {_vector((8, 8))}, {_vector((1, 8))}, {_vector((0, 0))}) #2",
            f"%d = call {m} @{product}({m} %a, {m} %b, {m} %c) #2",
            f"call void @{store}({m} %d, ptr addrspace(1) %d_mem, {_vector((16, 8))}, {_vector((1, 16))}, {_vector((0, 0))}) #2"]
    declarations = [f"declare {m} @{load}(ptr addrspace(1), <2 x i64>, <2 x i64>, <2 x i64>) #1",
                    f"declare void @{store}({m}, ptr addrspace(1), <2 x i64>, <2 x i64>, <2 x i64>) #1",
                    f"declare {m} @{product}({m}, {m}, {m}) #1"]
    arguments = [("a_mem", "float", "air.read"), ("b_mem", "float", "air.read"), ("c_mem", "float", "air.read"),
                 ("d_mem", "float", "air.read_write")]
    kernel = air.library("product_new_form", air.module_text("product_new_form", body, arguments, declarations,
                                                             collective=True))["product_new_form"]
    g = torch.Generator().manual_seed(28)
    a, b, c = (torch.randint(-8, 8, shape, generator=g).float() for shape in ((8, 10), (8, 8), (8, 8)))
    d = torch.full((8, 16), SENTINEL)
    kernel(a, b, c, d, threads=32, group_size=32)
    assert torch.equal(d[:, :8], a[:, :8].T @ b + c)  # small integers: exact in float
    assert (d[:, 8:] == SENTINEL).all()


# (operand type, accumulator type) pairs that MLX's attention, llama.cpp and others use.
PRODUCT_TYPES = [("float", "float"), ("half", "float"), ("half", "half"), ("bfloat", "float")]


@pytest.mark.parametrize("operands, accumulator", PRODUCT_TYPES)
@pytest.mark.parametrize("lanes", [32, 16])
def test_product_of_each_type(operands, accumulator, lanes):
    """D = A * B + C with A and B of `operands` type, C and D of `accumulator` type (MLX's
    attention, llama.cpp and others use each pair). With 16 lanes, the absent lanes'
    elements (rows 4-7 of every matrix) count as zeros, and only rows 0-3 of D are stored."""
    ab, cd = _TYPES[operands][0], _TYPES[accumulator][0]
    product = f"air.simdgroup_matrix_8x8_multiply_accumulate.v64{cd}.v64{ab}.v64{ab}.v64{cd}"
    calls, declarations = [], [f"declare <64 x {accumulator}> @{product}(<64 x {operands}>, <64 x {operands}>, "
                                                                        f"<64 x {accumulator}>) #1"]
    for element in dict.fromkeys((operands, accumulator)):
        suffix = _TYPES[element][0]
        declarations += [f"declare <64 x {element}> @air.simdgroup_matrix_8x8_load.v64{suffix}.p1{suffix}"
                         f"(ptr addrspace(1), <2 x i64>, <2 x i64>, <2 x i64>) #1"]
    declarations.append(f"declare void @air.simdgroup_matrix_8x8_store.v64{cd}.p1{cd}(<64 x {accumulator}>, "
                        f"ptr addrspace(1), <2 x i64>, <2 x i64>, <2 x i64>) #1")
    row_major = ", ".join(_vector(v) for v in ROW_MAJOR_8)
    for name, element in (("a", operands), ("b", operands), ("c", accumulator)):
        suffix = _TYPES[element][0]
        calls.append(f"%{name} = call <64 x {element}> @air.simdgroup_matrix_8x8_load.v64{suffix}.p1{suffix}"
                     f"(ptr addrspace(1) %{name}_mem, {row_major}) #2")
    calls += [f"%d = call <64 x {accumulator}> @{product}(<64 x {operands}> %a, <64 x {operands}> %b, "
              f"<64 x {accumulator}> %c) #2",
              f"call void @air.simdgroup_matrix_8x8_store.v64{cd}.p1{cd}(<64 x {accumulator}> %d, "
              f"ptr addrspace(1) %d_mem, {row_major}) #2"]
    arguments = [("a_mem", operands, "air.read"), ("b_mem", operands, "air.read"),
                 ("c_mem", accumulator, "air.read"), ("d_mem", accumulator, "air.read_write")]
    name = f"product_{operands}_{accumulator}"
    kernel = air.library(name, air.module_text(name, calls, arguments, declarations, collective=True))[name]
    g = torch.Generator().manual_seed(29)
    a, b, c = (torch.randint(-8, 8, (8, 8), generator=g).float() for _ in range(3))
    d = torch.full((8, 8), SENTINEL, dtype=_TYPES[accumulator][1])
    kernel(a.to(_TYPES[operands][1]), b.to(_TYPES[operands][1]), c.to(_TYPES[accumulator][1]), d,
           threads=lanes, group_size=lanes)
    rows = 8 if lanes == 32 else 4  # the rows lanes 0-15 hold
    b[rows:] = 0
    assert torch.equal(d[:rows].float(), a[:rows] @ b + c[:rows])  # small integers: exact in every type
    assert (d[rows:] == SENTINEL).all()

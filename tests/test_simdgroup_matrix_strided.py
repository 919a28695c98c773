"""The (pointer, extents, strides, origin) form of ``simdgroup_matrix_8x8_load`` / ``_store``
that Xcode 26's compiler emits (MLX's mac26 library, mlx-kquant): hand-written kernels that
move an 8x8 matrix between buffers, checked against torch indexing of the same memory, and
a product whose operands come through the new form."""

import pytest
import torch

from _simdgroup_matrix import _TYPES, PRODUCT_TYPES, ROW_MAJOR_8, SENTINEL, _vector, check_product_of_each_type
from tests import _air_modules as air


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


@pytest.mark.parametrize("operands, accumulator", PRODUCT_TYPES)
@pytest.mark.parametrize("lanes", [32, 16])
def test_product_of_each_type(operands, accumulator, lanes):
    check_product_of_each_type(operands, accumulator, lanes)

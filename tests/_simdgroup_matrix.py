"""simdgroup matrices in the (pointer, extents, strides, origin) form Xcode 26 emits, written
as hand-made AIR (tests/_air_modules.py): the product of each operand and accumulator type,
which tests/test_simdgroup_matrix_strided.py runs on the CPU and tests/test_cuda.py on a GPU."""

import torch

import _air_modules as air

_TYPES = {"float": ("f32", torch.float32), "half": ("f16", torch.float16), "bfloat": ("bf16", torch.bfloat16)}
SENTINEL = -7.0


def _vector(pair) -> str:
    return f"<2 x i64> <i64 {pair[0]}, i64 {pair[1]}>"


ROW_MAJOR_8 = ((8, 8), (1, 8), (0, 0))


# (operand type, accumulator type) pairs that MLX's attention, llama.cpp and others use.
PRODUCT_TYPES = [("float", "float"), ("half", "float"), ("half", "half"), ("bfloat", "float")]


def check_product_of_each_type(operands, accumulator, lanes):
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

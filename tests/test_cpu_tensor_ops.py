"""Metal 4's matmul2d on cooperative tensors in hand-written AIR (air/tensor_ops.py):
the descriptor's mode, the element types and the descriptors the CPU backend refuses.
MLX's NAX GEMMs (tests/test_cpu_mlx_nax.py) check the lane layout on real kernels.

The kernel: one SIMD-group; A (16x16) all `a`, B (16x32) all `b`, C (16x32) all `c`, each
lane filling its share through get_element_pointer, then run, then every lane writes its
16 elements of C to out[lane * 16 + e]. Every element of A*B is then 16*a*b whatever the
layout, so the results isolate what the layout cannot: mode 0 (multiply) ignores C, mode 1
(multiply_accumulate) adds it, half and bfloat operands are converted exactly.
"""

import pytest
import torch

import torch_metallib as tm
from tests import _air_modules as air

PREFIX = "__tensorops_impl_matmul2d_op_"
DESCRIPTOR = "i32 {operand}, i32 {m}, i32 32, i32 16, i8 0, i8 0, i8 1, i32 {mode}"
TYPES = {"f32": (0x10000020, "float", torch.float32), "f16": (0x10000010, "half", torch.float16),
         "b16": (0x90000010 - (1 << 32), "bfloat", torch.bfloat16)}  # as AIR prints the i32
DESCRIPTOR_PARAMS = "i32, i32, i32, i32, i8, i8, i8, i32"
DECLARATIONS = [
    f'declare void @{PREFIX}cooperative_tensor_init({DESCRIPTOR_PARAMS}, ptr, i32, i32, i32, i32) '
    'section "air.externally_defined"',
    f'declare ptr @{PREFIX}cooperative_tensor_get_element_pointer({DESCRIPTOR_PARAMS}, ptr, i16, i32, i32, i32) '
    'section "air.externally_defined"',
]


def _kernel(name: str, operand_type: str, mode: int, a: float, b: float, c: float, m: int = 16) -> str:
    code, element, _ = TYPES[operand_type]
    types = f"i32 {code}, i32 {code}, i32 {TYPES['f32'][0]}"
    run = f"run_cooperative_{operand_type}_{operand_type}_f32"
    body = ["%desc = alloca [20 x i8], align 4"]
    for offset, value in ((0, f"i32 {m}"), (4, "i32 32"), (8, "i32 16"), (12, "i8 0"), (13, "i8 0"),
                          (14, "i8 1"), (16, f"i32 {mode}")):
        body += [f"%d{offset} = getelementptr i8, ptr %desc, i32 {offset}", f"store {value}, ptr %d{offset}"]
    for operand, count, value, type_name in ((0, 8, a, element), (1, 16, b, element), (2, 16, c, "float")):
        descriptor = DESCRIPTOR.format(operand=operand, m=m, mode=mode)
        body += [f"%s{operand} = alloca [64 x i8], align 16",
                 f"call void @{PREFIX}cooperative_tensor_init({descriptor}, ptr %s{operand}, {types}, i32 32) #2"]
        for e in range(count):
            body += [f"%p{operand}.{e} = call ptr @{PREFIX}cooperative_tensor_get_element_pointer({descriptor}, "
                     f"ptr %s{operand}, i16 {e}, {types}) #2",
                     f"%v{operand}.{e} = fptrunc double {value} to {type_name}",
                     f"store {type_name} %v{operand}.{e}, ptr %p{operand}.{e}"]
        body.append(f"%whole{operand} = call ptr @{PREFIX}cooperative_tensor_get_element_pointer({descriptor}, "
                    f"ptr %s{operand}, i16 -1, {types}) #2")
    body.append(f"call void @{PREFIX}{run}(ptr %desc, ptr %whole0, ptr %whole1, ptr %whole2, i32 32) #2")
    for e in range(16):
        body += [f"%c{e} = load float, ptr %p2.{e}", f"%at{e} = mul i64 %gid64, 16",
                 f"%i{e} = add i64 %at{e}, {e}", f"%o{e} = getelementptr float, ptr addrspace(1) %out, i64 %i{e}",
                 f"store float %c{e}, ptr addrspace(1) %o{e}"]
    declarations = DECLARATIONS + [f'declare void @{PREFIX}{run}(ptr, ptr, ptr, ptr, i32) '
                                   'section "air.externally_defined"']
    return air.module_text(name, body, [("out", "float", "air.read_write")], declarations, True)


def _run(operand_type: str, mode: int, a: float, b: float, c: float, m: int = 16) -> torch.Tensor:
    text = _kernel("k_matmul2d", operand_type, mode, a, b, c, m)
    library = tm.pack([tm.FunctionSource("k_matmul2d", air.library("k_matmul2d", text)["k_matmul2d"].bitcode)])
    out = torch.full((32 * 16,), float("nan"))
    tm.load(library)["k_matmul2d"](out, threads=32, group_size=32)
    return out


@pytest.mark.parametrize("mode,expected", [(0, 16 * 1.5 * -2.0), (1, 16 * 1.5 * -2.0 + 100.0)])
def test_mode_decides_whether_c_is_added(mode, expected):
    assert torch.equal(_run("f32", mode, 1.5, -2.0, 100.0), torch.full((512,), expected))


@pytest.mark.parametrize("operand_type", ["f16", "b16"])
def test_half_and_bfloat_operands_are_converted_exactly(operand_type):
    """0.1 rounded to the operand type, squared and summed 16 times in float: exact here."""
    _, _, dtype = TYPES[operand_type]
    a = torch.tensor(0.1, dtype=dtype).double()
    expected = (16 * a * a).float()
    assert torch.equal(_run(operand_type, 0, 0.1, 0.1, 7.0), expected.expand(512))


def test_a_descriptor_off_the_16_grid_is_refused():
    with pytest.raises(tm.UnsupportedKernelError, match="M, N, K = 8, 32, 16"):
        _run("f32", 1, 1.0, 1.0, 0.0, m=8)


# === operands in device memory: Metal 4 tensors (air/private_tensors.py) ==========

I8, I32 = 0x20000008, 0x20000020
TENSOR_DECLARATIONS = [
    "declare i16 @air.get_descriptor_size_tensor(i16, i16)",
    "declare void @air.init_strided_private_tensor.i32.global(ptr, i16, ptr addrspace(1), ptr, ptr, i8)",
    "declare void @air.slice_private_tensor_private_tensor.s.i32(ptr, ptr, i16, ptr, ptr)",
    "declare i32 @air.get_extent_private_tensor.i32(ptr, i16, i16)",
    f'declare void @{PREFIX}cooperative_tensor_init({DESCRIPTOR_PARAMS}, ptr, i32, i32, i32, i32) '
    'section "air.externally_defined"',
    f'declare ptr @{PREFIX}cooperative_tensor_get_element_pointer({DESCRIPTOR_PARAMS}, ptr, i16, i32, i32, i32) '
    'section "air.externally_defined"',
    f'declare i16 @{PREFIX}cooperative_tensor_num_elements({DESCRIPTOR_PARAMS}, ptr, i32, i32, i32) '
    'section "air.externally_defined"',
    f'declare i1 @{PREFIX}cooperative_tensor_is_valid_element({DESCRIPTOR_PARAMS}, ptr, i16, i32, i32, i32, i32) '
    'section "air.externally_defined"',
    f'declare void @{PREFIX}cooperative_tensor_get_coordinate({DESCRIPTOR_PARAMS}, ptr, i16, ptr, i32, i32, i32, '
    'i32, i32) section "air.externally_defined"',
    f'declare void @{PREFIX}run_cooperative_dv_i8_dv_i8_i32(ptr, ptr, i32, ptr, i32, ptr, i32) '
    'section "air.externally_defined"',
]


def _int32_array(name: str, values) -> list:
    """%<name>: a thread-memory array of the i32 `values` (extents, strides, offsets)."""
    lines = [f"%{name} = alloca [{len(values)} x i32], align 4"]
    for i, value in enumerate(values):
        lines += [f"%{name}{i} = getelementptr i32, ptr %{name}, i32 {i}", f"store i32 {value}, ptr %{name}{i}"]
    return lines


def _tensor(name: str, data: str, extents, strides, slice_at=None, slice_extents=None) -> list:
    """%<name>: a rank-2 device tensor descriptor over `data` (then sliced, if asked)."""
    lines = [f"%{name}.size = call i16 @air.get_descriptor_size_tensor(i16 2, i16 4) #2",
             f"%{name}.bytes = zext i16 %{name}.size to i64", f"%{name} = alloca i8, i64 %{name}.bytes, align 8"]
    lines += _int32_array(f"{name}.e", extents) + _int32_array(f"{name}.s", strides)
    lines.append(f"call void @air.init_strided_private_tensor.i32.global(ptr %{name}, i16 2, ptr addrspace(1) "
                 f"%{data}, ptr %{name}.e, ptr %{name}.s, i8 1) #2")
    if slice_at is None:
        return lines
    lines += [f"%{name}.whole = alloca i8, i64 %{name}.bytes, align 8",
              f"call void @llvm.memcpy.p0.p0.i64(ptr %{name}.whole, ptr %{name}, i64 %{name}.bytes, i1 false)"]
    lines += _int32_array(f"{name}.o", slice_at) + _int32_array(f"{name}.x", slice_extents)
    lines.append(f"call void @air.slice_private_tensor_private_tensor.s.i32(ptr %{name}, ptr %{name}.whole, i16 2, "
                 f"ptr %{name}.o, ptr %{name}.x) #2")
    return lines


def _integer_kernel(k_extent: int, c: int, a_slice=None, b_rows=None) -> str:
    """out[r * 16 + c] = (A @ B + c)[r, c] for A (16 x K) and B (K x 16) char tensors, K
    dynamic (-1: A's extent), written by each lane through is_valid_element and
    get_coordinate; a_slice: (offsets, extents) of the view of A that the product reads;
    b_rows: B's rows (K's by default)."""
    descriptor = "i32 {operand}, i32 16, i32 16, i32 -1, i8 0, i8 0, i8 0, i32 1"
    types = f"i32 {I8}, i32 {I8}, i32 {I32}"
    dest = descriptor.format(operand=2)
    body = ["%desc = alloca [20 x i8], align 4"]
    for offset, value in ((0, "i32 16"), (4, "i32 16"), (8, "i32 -1"), (12, "i8 0"), (13, "i8 0"),
                          (14, "i8 0"), (16, "i32 1")):
        body += [f"%d{offset} = getelementptr i8, ptr %desc, i32 {offset}", f"store {value}, ptr %d{offset}"]
    a_extents = (k_extent, 16) if a_slice is None else (k_extent + 8, 16)
    body += _tensor("ta", "a", a_extents, (1, a_extents[0]), *(a_slice or (None, None)))
    body += _tensor("tb", "b", (16, b_rows or k_extent), (1, 16))
    body += ["%ct = alloca [32 x i8], align 4",
             f"call void @{PREFIX}cooperative_tensor_init({dest}, ptr %ct, {types}, i32 32) #2",
             f"%count = call i16 @{PREFIX}cooperative_tensor_num_elements({dest}, ptr %ct, i32 {I8}, i32 {I8}, "
             "i32 32) #2"]
    for e in range(8):
        body += [f"%p{e} = call ptr @{PREFIX}cooperative_tensor_get_element_pointer({dest}, ptr %ct, i16 {e}, "
                 f"{types}) #2", f"store i32 {c}, ptr %p{e}"]
    body += [f"%whole = call ptr @{PREFIX}cooperative_tensor_get_element_pointer({dest}, ptr %ct, i16 -1, {types}) #2",
             f"call void @{PREFIX}run_cooperative_dv_i8_dv_i8_i32(ptr %desc, ptr %ta, i32 2, ptr %tb, i32 2, "
             "ptr %whole, i32 32) #2",
             "%at = alloca [2 x i32], align 4", "br label %loop", "loop:",
             "%i = phi i16 [ 0, %entry ], [ %next, %step ]", "%more = icmp ult i16 %i, %count",
             "br i1 %more, label %body, label %done", "body:",
             f"%valid = call i1 @{PREFIX}cooperative_tensor_is_valid_element({dest}, ptr %ct, i16 %i, {types}, "
             "i32 32) #2", "br i1 %valid, label %write, label %step", "write:",
             f"call void @{PREFIX}cooperative_tensor_get_coordinate({dest}, ptr %ct, i16 %i, ptr %at, i32 {I32}, "
             f"i32 32, {types}) #2",
             "%column = load i32, ptr %at", "%row.p = getelementptr i32, ptr %at, i32 1", "%row = load i32, ptr %row.p",
             "%row16 = mul i32 %row, 16", "%index = add i32 %row16, %column", "%index.w = zext i32 %index to i64",
             f"%element = call ptr @{PREFIX}cooperative_tensor_get_element_pointer({dest}, ptr %ct, i16 %i, "
             f"{types}) #2", "%value = load i32, ptr %element",
             "%o = getelementptr i32, ptr addrspace(1) %out, i64 %index.w", "store i32 %value, ptr addrspace(1) %o",
             "br label %step", "step:", "%next = add i16 %i, 1", "br label %loop", "done:"]
    declarations = TENSOR_DECLARATIONS + ["declare void @llvm.memcpy.p0.p0.i64(ptr, ptr, i64, i1)"]
    return air.module_text("k_integer", body, [("a", "i8", "air.read"), ("b", "i8", "air.read"),
                                               ("out", "i32", "air.read_write")], declarations, True)


def _run_integer(a, b, k_extent, c, a_slice=None):
    text = _integer_kernel(k_extent, c, a_slice, b.shape[0])
    library = tm.pack([tm.FunctionSource("k_integer", air.library("k_integer", text)["k_integer"].bitcode)])
    out = torch.full((256,), -1, dtype=torch.int32)
    tm.load(library)["k_integer"](a, b, out, threads=32, group_size=32)
    return out.view(16, 16)


def _wrapped(values: torch.Tensor) -> torch.Tensor:
    return ((values + 2 ** 31) % 2 ** 32 - 2 ** 31).to(torch.int32)


def test_integer_product_of_device_tensors_is_exact_and_wraps():
    """char x char -> int with K dynamic (taken from A's extent, 40: no multiple of 16),
    every product at the extremes, accumulated onto C near INT_MAX so the sum wraps."""
    g = torch.Generator().manual_seed(5)
    a = torch.randint(-128, 128, (16, 40), generator=g, dtype=torch.int8)
    b = torch.randint(-128, 128, (40, 16), generator=g, dtype=torch.int8)
    a[0], b[:, 0] = -128, -128  # 40 * 16384 = 655,360 in element (0, 0)
    c = 2 ** 31 - 300_000
    expected = _wrapped(a.long() @ b.long() + c)
    assert bool((a.long() @ b.long() + c > 2 ** 31 - 1).any()), "the test must wrap somewhere"
    assert torch.equal(_run_integer(a, b, 40, c), expected)


def test_a_slice_is_the_view_the_product_reads():
    """A stored 16 x 48, sliced at column 8 to 40 columns: the product sees A[:, 8:48]."""
    g = torch.Generator().manual_seed(6)
    a = torch.randint(-128, 128, (16, 48), generator=g, dtype=torch.int8)
    b = torch.randint(-128, 128, (40, 16), generator=g, dtype=torch.int8)
    expected = _wrapped(a[:, 8:].long() @ b.long())
    assert torch.equal(_run_integer(a, b, 40, 0, a_slice=((8, 0), (40, 16))), expected)


def test_a_slice_past_the_source_is_clamped():
    """Asking 64 columns from column 8 of 48 gives 40, so K is 40 although B has 64 rows
    (unclamped, K would be 64 and A's view would run into its next row)."""
    g = torch.Generator().manual_seed(7)
    a = torch.randint(-128, 128, (16, 48), generator=g, dtype=torch.int8)
    b = torch.randint(-128, 128, (64, 16), generator=g, dtype=torch.int8)
    expected = _wrapped(a[:, 8:].long() @ b[:40].long())
    assert torch.equal(_run_integer(a, b, 40, 0, a_slice=((8, 0), (64, 16))), expected)


def test_several_simdgroups_as_one_scope_are_refused():
    """matmul2d<desc, execution_simdgroups<4>> spreads one operand over 128 threads (as
    mlx-kquant's indexer kernels do); the CPU backend runs one SIMD-group, and says so."""
    scope = ("define internal i64 @_ZN3mpp10tensor_ops17__mutmul2d_detail16__operand_layoutIN5metal20"
             "execution_simdgroupsILm4EEE19thread_storage_sizeEv() {\n  ret i64 0\n}\n")
    text = _integer_kernel(40, 0) + scope
    library = tm.pack([tm.FunctionSource("k_integer", air.library("k_integer", text)["k_integer"].bitcode)])
    a, b = torch.zeros(16, 40, dtype=torch.int8), torch.zeros(40, 16, dtype=torch.int8)
    with pytest.raises(tm.UnsupportedKernelError, match=r"execution_simdgroups<4>"):
        tm.load(library)["k_integer"](a, b, torch.zeros(256, dtype=torch.int32), threads=32, group_size=32)

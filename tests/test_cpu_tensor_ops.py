"""Metal 4's matmul2d on cooperative tensors in hand-written AIR (backends/cpu/tensor_ops.py):
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

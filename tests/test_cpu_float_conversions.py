"""Conversions LLVM's host backend leaves to a runtime library (csrc/cpu/float_conversions):
JIT-compiled code that truncates float to bfloat calls ``__truncsfbf2``, which the process
only has because torch_metallib registers it. Bits are compared with torch's rounding."""

import ctypes

import llvmlite.binding as llvm
import pytest
import torch

from torch_metallib.backends.cpu import jit as _cpu_jit

_MODULE = """
define i16 @to_bfloat(float %x) {
  %b = fptrunc float %x to bfloat
  %i = bitcast bfloat %b to i16
  ret i16 %i
}
"""


def test_float_to_bfloat_rounds_to_nearest_even_as_torch_does():
    host = _cpu_jit.host()  # registers the runtime symbols with LLVM
    module = llvm.parse_assembly(_MODULE)
    module.triple = host.triple
    # A target machine of its own: the engine owns it and deletes it with itself.
    machine = llvm.Target.from_triple(host.triple).create_target_machine(
        cpu=host.cpu, features=llvm.get_host_cpu_features().flatten(), codemodel="jitdefault")
    if b"__truncsfbf2" not in machine.emit_object(module):
        pytest.skip(f"{host.cpu} converts to bfloat natively (AVX512-BF16): no library call to resolve")
    engine = llvm.create_mcjit_compiler(module, machine)
    engine.finalize_object()
    to_bfloat = ctypes.CFUNCTYPE(ctypes.c_uint16, ctypes.c_float)(engine.get_function_address("to_bfloat"))
    g = torch.Generator().manual_seed(7)
    bits = torch.cat([
        torch.randint(-2**31, 2**31, (20000,), generator=g, dtype=torch.int64),
        # halfway cases (lower half exactly 0x8000) with even and odd upper halves
        torch.arange(0, 2**16, 97, dtype=torch.int64) << 16 | 0x8000,
        torch.tensor([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7F7FFFFF, 0x00000001, 0x007FFFFF,
                      0x7FC00000, 0x7F800001, 0xFFBFFFFF], dtype=torch.int64),
    ]).to(torch.int32)
    values = bits.view(torch.float32)
    expected = values.to(torch.bfloat16).view(torch.int16).to(torch.int64) & 0xFFFF
    actual = torch.tensor([to_bfloat(v) for v in values.tolist()], dtype=torch.int64)
    del engine  # kept alive until the calls are done
    nan = values.isnan()
    assert torch.equal(actual[~nan], expected[~nan])
    assert ((actual[nan] & 0x7F80) == 0x7F80).all() and ((actual[nan] & 0x7F) != 0).all()  # still NaN

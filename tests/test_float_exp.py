"""``fast_exp`` on floats, inline (air/float_exp.py): the same bits as the libm ``expf``
call it replaces, on hosts whose libm is glibc 2.28 or later with FMA (the variant
x86-64 CPUs with FMA run; elsewhere libm's bits are another library's, so the comparison
is skipped). The definition was checked by hand over all 2^32 inputs (30 s); here over
every 251st bit pattern, the edges of glibc's slow path, and through kernels in its
scalar, vector and half forms (with its rare cases behind a branch, and selected as vector
lanes compile it).
"""

import ctypes
import ctypes.util
import math
import platform
import struct

import llvmlite.binding as llvm
import pytest
import torch

import _air_modules as air
from torch_metallib.air.float_exp import define_fast_exp_float
from torch_metallib.backends.cpu.jit import host


def _glibc_fma() -> bool:
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return False
    name, version = platform.libc_ver()
    if name != "glibc" or tuple(int(p) for p in version.split(".")[:2]) < (2, 28):
        return False
    with open("/proc/cpuinfo") as cpuinfo:
        return " fma " in f" {cpuinfo.read()} ".replace("\n", " ")


pytestmark = pytest.mark.skipif(not _glibc_fma(), reason="libm is not glibc >= 2.28 on an x86-64 CPU with FMA")

_libm = ctypes.CDLL(ctypes.util.find_library("m"))
_libm.expf.restype, _libm.expf.argtypes = ctypes.c_float, [ctypes.c_float]


def _bits(value: float) -> int:
    return struct.unpack("<I", struct.pack("<f", value))[0]


def _edges() -> list:
    """Bit patterns around every boundary of glibc's expf: its slow path (|x| >= 88), the
    overflow and underflow thresholds, zeros, denormals, infinities and NaNs."""
    centres = [0.0, -0.0, 88.0, -88.0, float.fromhex("0x1.62e42ep6"), -float.fromhex("0x1.9fe368p6"),
               -float.fromhex("0x1.9d1d9ep6"), 1e-45, -1e-45, 1.0, -1.0, math.inf, -math.inf]
    patterns = set()
    for centre in centres:
        bits = _bits(centre)
        patterns.update((bits + d) & 0xFFFFFFFF for d in range(-300, 301))
    patterns.update([0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FA00000, 0xFF800001])  # quiet and signalling NaNs
    return sorted(patterns)


_HARNESS = """
declare float @expf(float)
{needs}
{definition}
define i64 @mismatches(i64 %first, i64 %end, i64 %step, ptr %where) {{
entry:
  br label %loop
loop:
  %i = phi i64 [ %first, %entry ], [ %next, %tail ]
  %count = phi i64 [ 0, %entry ], [ %count.next, %tail ]
  %narrow = trunc i64 %i to i32
  %x = bitcast i32 %narrow to float
  %ours = call float @ours(float %x)
  %libm = call float @expf(float %x)
  %a = bitcast float %ours to i32
  %b = bitcast float %libm to i32
  %differ = icmp ne i32 %a, %b
  br i1 %differ, label %record, label %tail
record:
  store i64 %i, ptr %where
  br label %tail
tail:
  %add = zext i1 %differ to i64
  %count.next = add i64 %count, %add
  %next = add i64 %i, %step
  %more = icmp ult i64 %next, %end
  br i1 %more, label %loop, label %done
done:
  ret i64 %count
}}
"""


@pytest.mark.parametrize("branches", [True, False])  # without: vector lanes' form, its rare cases selected
def test_definition_matches_libm_bit_for_bit_over_a_strided_sweep(branches):
    definition, needs = define_fast_exp_float("ours", branches)
    assert (" br i1 " in definition) == branches
    module = llvm.parse_assembly(_HARNESS.format(needs="\n".join(needs), definition=definition))
    module.verify()
    llvm.load_library_permanently(ctypes.util.find_library("m"))
    machine = host()  # the native target initialized; the engine owns the machine it is given, so its own
    llvm.initialize_native_asmprinter()  # (host() leaves it to its first compile: run alone, this test is first)
    engine = llvm.create_mcjit_compiler(module, llvm.Target.from_triple(machine.triple).create_target_machine(
        cpu=machine.cpu, features=llvm.get_host_cpu_features().flatten(), opt=3))
    engine.finalize_object()
    sweep = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                             ctypes.POINTER(ctypes.c_int64))(engine.get_function_address("mismatches"))
    where = ctypes.c_int64(-1)
    assert sweep(0, 1 << 32, 251, ctypes.byref(where)) == 0, f"first difference at bits {where.value:#010x}"
    for bits in _edges():
        assert sweep(bits, bits + 1, 1, ctypes.byref(where)) == 0, f"differs at bits {bits:#010x}"


def _libm_expf(x: torch.Tensor) -> torch.Tensor:
    return torch.tensor([_libm.expf(v) for v in x.tolist()], dtype=torch.float32)


def test_kernels_scalar_vector_and_half_forms():
    g = torch.Generator().manual_seed(0)
    edges = torch.tensor(_edges(), dtype=torch.int64).to(torch.int32).view(torch.float32)
    x = torch.cat([torch.rand(4000, generator=g) * 240 - 120, edges])
    x = x[: x.numel() // 4 * 4]
    scalar = torch.empty_like(x)
    air.lane_kernel("air.fast_exp.f32", "float", ["float"])(x, scalar, threads=x.numel())
    assert torch.equal(scalar.view(torch.int32), _libm_expf(x).view(torch.int32))
    vector = torch.empty_like(x)
    air.lane_kernel("air.fast_exp.v4f32", "<4 x float>", ["<4 x float>"])(x, vector, threads=x.numel() // 4)
    assert torch.equal(vector.view(torch.int32), scalar.view(torch.int32))
    # Half: computed in float, rounded once.
    h = (torch.rand(4000, generator=g) * 22 - 11).half()
    half = torch.empty_like(h)
    air.lane_kernel("air.fast_exp.f16", "half", ["half"])(h, half, threads=h.numel())
    assert torch.equal(half, _libm_expf(h.float()).half())

// Conversions LLVM's host backend leaves to a runtime library call, which the process does
// not have (glibc and GCC 12's libgcc do not provide them), so JIT-compiled kernels resolve
// them here (registered in dispatch_bindings.cpp).
#pragma once

extern "C" {
// `fptrunc float to bfloat` on CPUs without AVX512-BF16 (LLVM's __truncsfbf2): round to
// nearest even; a NaN stays a quiet NaN. The result's bits travel in a half register.
_Float16 tm_rt_truncsfbf2(float value);
}

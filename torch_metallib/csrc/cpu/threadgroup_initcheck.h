// Checked execution's threadgroup initcheck: a read of threadgroup memory that no thread of
// its threadgroup has written during the launch is reported (as KernelMemoryError, through
// the running CheckedLaunch). backends/cpu/bounds_checks.py puts the calls below beside the
// bounds checks of threadgroup accesses; only checked code has them.
//
// Each threadgroup allocation (a threadgroup argument's buffer, a threadgroup variable)
// has a shadow of one byte per byte, made empty when a threadgroup starts on this OS thread
// (a threadgroup runs on one OS thread from start to end, its threads as coroutines), set
// by stores and atomics, and read by loads.
#pragma once

#include <cstdint>

extern "C" {
// (x, y, z): the thread's position in grid, or x = -1 where the check context's thread holds.
// Reports a read of [p, p + bytes) that is not all written; returns p.
void* tm_rt_tg_read(void* p, uint64_t bytes, int32_t x, int32_t y, int32_t z);
// Marks [p, p + bytes) written (a store or an atomic).
void tm_rt_tg_write(void* p, uint64_t bytes, int32_t x, int32_t y, int32_t z);
// Threadgroup memory was handed to code the checks cannot see (a SIMD-group matrix store, an
// async copy, memcpy): every byte counts as written for the rest of the threadgroup.
void tm_rt_tg_unseen(int32_t x, int32_t y, int32_t z);
}

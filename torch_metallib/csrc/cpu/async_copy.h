// SIMD-group asynchronous copies (air.simdgroup_async_copy_1d/_2d) on the CPU: the leading
// lane of the SIMD-group copies at once, when every lane has arrived (air/async_copies.py),
// so the copy is complete before any lane goes on and waiting for its event is a no-op.
#pragma once

#include <cstdint>

extern "C" {
// Copies a tile of `element_bytes`-sized elements: element (x, y) of the destination tile
// (dst_width x dst_height) is element (x, y) of the source tile (src_width x src_height)
// where that exists; elsewhere 0 (clamp_mode 0, clamp_to_zero) or the nearest element of
// the source tile (clamp_mode 1, clamp_to_edge). Rows are `*_row` elements apart, elements
// in a row `*_step` elements.
void tm_rt_async_copy_2d(uint64_t element_bytes, void* dst, uint64_t dst_row, uint64_t dst_step, uint64_t dst_width,
                         uint64_t dst_height, const void* src, uint64_t src_row, uint64_t src_step, uint64_t src_width,
                         uint64_t src_height, int32_t clamp_mode);
}

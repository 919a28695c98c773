#include "cpu/async_copy.h"

#include <algorithm>
#include <cstring>

extern "C" void tm_rt_async_copy_2d(uint64_t element_bytes, void* dst, uint64_t dst_row, uint64_t dst_step,
                                    uint64_t dst_width, uint64_t dst_height, const void* src, uint64_t src_row,
                                    uint64_t src_step, uint64_t src_width, uint64_t src_height, int32_t clamp_mode) {
  auto* out = static_cast<unsigned char*>(dst);
  const auto* in = static_cast<const unsigned char*>(src);
  for (uint64_t y = 0; y < dst_height; ++y) {
    for (uint64_t x = 0; x < dst_width; ++x) {
      unsigned char* target = out + (y * dst_row + x * dst_step) * element_bytes;
      const bool inside = x < src_width && y < src_height;
      if (!inside && (clamp_mode == 0 || src_width == 0 || src_height == 0)) {
        std::memset(target, 0, element_bytes);
        continue;
      }
      const uint64_t sx = std::min(x, src_width - 1), sy = std::min(y, src_height - 1);
      std::memcpy(target, in + (sy * src_row + sx * src_step) * element_bytes, element_bytes);
    }
  }
}

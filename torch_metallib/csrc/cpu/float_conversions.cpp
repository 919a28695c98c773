#include "cpu/float_conversions.h"

#include <cstdint>
#include <cstring>

extern "C" _Float16 tm_rt_truncsfbf2(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  const bool nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
  const auto rounded = uint16_t(nan ? (bits >> 16) | 0x40u : (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
  _Float16 out;
  std::memcpy(&out, &rounded, sizeof out);
  return out;
}

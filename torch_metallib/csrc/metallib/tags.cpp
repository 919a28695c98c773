#include "tags.h"

#include <array>
#include <cstdio>

namespace torch_metallib::metallib {

std::string tag_name(uint32_t code) {
  std::string name(4, '\0');
  for (int i = 0; i < 4; ++i) {
    const char c = char((code >> (8 * i)) & 0xff);
    if (c < 0x20 || c > 0x7e) {
      char hex[11];
      std::snprintf(hex, sizeof hex, "0x%08x", code);
      return hex;
    }
    name[i] = c;
  }
  return name;
}

}  // namespace torch_metallib::metallib

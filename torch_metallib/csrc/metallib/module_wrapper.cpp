#include "module_wrapper.h"

#include <cstdio>

#include "byte_reader.h"
#include "tag_group.h"

namespace torch_metallib::metallib {
namespace {

std::string hex32(uint32_t value) {
  char text[11];
  std::snprintf(text, sizeof text, "0x%08X", value);
  return text;
}

}  // namespace

std::string_view unwrap_bitcode(std::string_view module, uint64_t offset, const std::string& function) {
  const std::string place = function + " module";
  if (module.size() < kWrapperSize + 4) {
    throw FormatError(offset, place + " size (MDSZ)", "at least 24 bytes (wrapper + bitcode magic)",
                      std::to_string(module.size()) + " bytes");
  }
  const uint32_t magic = load_le<uint32_t>(module, 0);
  if (magic != kWrapperMagic) {
    throw FormatError(offset, place + " wrapper magic", hex32(kWrapperMagic), hex32(magic));
  }
  const uint64_t bitcode_offset = load_le<uint32_t>(module, 8);
  const uint64_t bitcode_size = load_le<uint32_t>(module, 12);
  if (bitcode_offset < kWrapperSize || !range_fits(bitcode_offset, bitcode_size, module.size())) {
    throw FormatError(offset + 8, place + " wrapper bitcode range",
                      "offset >= 20 and offset + size <= MDSZ (" + std::to_string(module.size()) + ")",
                      "offset " + std::to_string(bitcode_offset) + ", size " + std::to_string(bitcode_size));
  }
  std::string_view bitcode = module.substr(bitcode_offset, bitcode_size);
  if (bitcode.size() < 4 || bitcode.substr(0, 4) != std::string_view("BC\xC0\xDE", 4)) {
    const uint32_t found = bitcode.size() >= 4 ? load_le<uint32_t>(bitcode, 0) : 0;
    throw FormatError(offset + bitcode_offset, place + " bitcode magic", "'BC' 0xC0DE",
                      bitcode.size() >= 4 ? hex32(found) : "fewer than 4 bytes");
  }
  return bitcode;
}

std::string wrap_bitcode(std::string_view bitcode) {
  std::string module;
  const uint64_t unpadded = kWrapperSize + bitcode.size();
  const uint64_t padded = (unpadded + kModuleAlignment - 1) / kModuleAlignment * kModuleAlignment;
  module.reserve(padded);
  put_le<uint32_t>(module, kWrapperMagic);
  put_le<uint32_t>(module, 0);
  put_le<uint32_t>(module, static_cast<uint32_t>(kWrapperSize));
  put_le<uint32_t>(module, static_cast<uint32_t>(bitcode.size()));
  put_le<uint32_t>(module, kWrapperCpuType);
  module.append(bitcode);
  module.resize(padded, '\0');
  return module;
}

}  // namespace torch_metallib::metallib

// The CNST public-metadata tag: u16 count, then per constant a NUL-terminated name,
// u8 MTLDataType, u16 index and u8 "required" flag.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace torch_metallib::metallib {

struct FunctionConstant {
  std::string name;
  uint8_t type;  // MTLDataType
  uint16_t index;
  bool required;
};

// Throws FormatError (at `offset`, the tag's file offset) naming `function` on bad bytes.
std::vector<FunctionConstant> decode_constants(std::string_view payload, uint64_t offset, const std::string& function);

std::string encode_constants(const std::vector<FunctionConstant>& constants);

}  // namespace torch_metallib::metallib

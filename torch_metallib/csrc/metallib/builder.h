// Builds a Container for new functions from their LLVM bitcode (the writer then
// serializes it). Validation errors are std::invalid_argument naming the function.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "container.h"
#include "sha256.h"
#include "function_constants.h"

namespace torch_metallib::metallib {

struct FunctionSource {
  std::string name;
  uint8_t type = 2;     // kernel
  std::string bitcode;  // LLVM bitcode, raw ('BC' 0xC0DE) or already Darwin-wrapped
  std::vector<FunctionConstant> constants;
  std::array<uint16_t, 4> versions{2, 6, 3, 1};  // AIR major, minor, MSL major, minor
};

// The returned container owns copies of all bytes it points to.
Container build_container(const Header& header, const std::vector<FunctionSource>& sources, const Sha256& sha256);

}  // namespace torch_metallib::metallib

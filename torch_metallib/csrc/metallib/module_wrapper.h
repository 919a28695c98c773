// The 20-byte Darwin bitcode wrapper Apple puts around each function's LLVM bitcode:
// u32 magic 0x0B17C0DE, u32 version 0, u32 bitcode offset, u32 bitcode size, u32 cputype.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace torch_metallib::metallib {

constexpr uint32_t kWrapperMagic = 0x0B17C0DE;
constexpr uint64_t kWrapperSize = 20;
constexpr uint32_t kWrapperCpuType = 0xFFFFFFFF;
constexpr uint64_t kModuleAlignment = 16;  // modules are zero-padded to this

// Validates the wrapper of `module` (MDSZ bytes at absolute file offset `offset`) and
// returns the bitcode it wraps. Throws FormatError naming `function`.
std::string_view unwrap_bitcode(std::string_view module, uint64_t offset, const std::string& function);

// Wrapper + bitcode + zero padding to kModuleAlignment.
std::string wrap_bitcode(std::string_view bitcode);

}  // namespace torch_metallib::metallib

// Parses and validates a .metallib held in caller-owned memory. The returned Container
// points into that memory: keep it alive and unchanged for the Container's lifetime.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "container.h"

namespace torch_metallib::metallib {

// Throws FormatError on any malformed input; unknown tags are recorded, not fatal.
// Validates the header, section table, every tag group and every module's range. The
// bytes inside each module and reflection-list group are validated when first used
// (function_bitcode, function_reflection) or all at once by verify_container, so a load
// does not touch the pages of the 100+ MB module section.
Container read_container(const uint8_t* data, uint64_t size);

// Validates every module wrapper and reflection-list group. HASHes are checked in Python
// (hashlib, OpenSSL), on first use of a function and by Library.verify.
void verify_container(const Container& container);

// "function 12 'name'", the prefix of every per-function message.
std::string describe_function(const Container& container, size_t index);

// The LLVM bitcode inside a function's module, after validating its wrapper.
std::string_view function_bitcode(const Container& container, size_t index);

// The function's whole reflection-list group (empty if it has none), after validating it.
std::string_view function_reflection(const Container& container, size_t index);

}  // namespace torch_metallib::metallib

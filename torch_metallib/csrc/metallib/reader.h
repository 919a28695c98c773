// Parses and validates a .metallib held in caller-owned memory. The returned Container
// points into that memory: keep it alive and unchanged for the Container's lifetime.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "container.h"

namespace torch_metallib::metallib {

// How much of the file read_container reads and validates.
enum class ReadDepth {
  // Header, section table, header extension, every function-list group (tags, unique
  // names, module and reflection ranges, modules disjoint): what `load` needs, touching
  // only the function list. Each function's metadata groups are read and validated by
  // read_function on first use; unknown tags are not recorded.
  kFunctionList,
  // Also every function's public and private metadata group, every unknown tag recorded,
  // and `functions` filled: what writing and verifying need.
  kFull,
};

// Throws FormatError on any malformed input; unknown tags are recorded, not fatal. The
// bytes inside each module and reflection-list group are validated when first used
// (function_bitcode, function_reflection) or all at once by verify_container, so a load
// does not touch the pages of the 100+ MB module section.
Container read_container(const uint8_t* data, uint64_t size, ReadDepth depth = ReadDepth::kFull);

// Function `index` with its metadata groups, read and validated now (a container read at
// either depth). Throws FormatError naming the function for a malformed group.
Function read_function(const Container& container, size_t index);

// Validates every module wrapper and reflection-list group (of a container read at kFull
// depth). HASHes are checked in Python (hashlib, OpenSSL), on first use of a function and
// by Library.verify.
void verify_container(const Container& container);

// "function 12 'name'", the prefix of every per-function message.
std::string describe_function(size_t index, std::string_view name);

// The LLVM bitcode inside a function's module, after validating its wrapper.
std::string_view function_bitcode(const Function& function, size_t index);

// The function's whole reflection-list group (empty if it has none), after validating it.
std::string_view function_reflection(const Container& container, const Function& function, size_t index);

}  // namespace torch_metallib::metallib

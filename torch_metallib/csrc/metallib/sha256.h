// SHA-256, for the HASH tag of new functions and content-derived UUIDs, as the caller
// provides it: the bindings pass Python's hashlib (OpenSSL), so the container code carries
// no hand-written cryptography.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string_view>

namespace torch_metallib::metallib {

using Sha256 = std::function<std::array<uint8_t, 32>(std::string_view bytes)>;

}  // namespace torch_metallib::metallib

// Serializes a Container. Offsets and sizes (OFFT, MDSZ, RFLT, the section table and the
// header-extension section references) are recomputed from the layout; HASH and every
// other byte come from the model, so an unmodified parsed library writes back its input.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "container.h"
#include "sha256.h"

namespace torch_metallib::metallib {

std::string write_container(const Container& container);

// A copy of `source` holding only the functions at `indices` (in that order), with a new
// content-derived UUID. The views of the result point into `source`'s storage.
Container select_functions(const Container& source, const std::vector<size_t>& indices, const Sha256& sha256);

// A UUID (RFC 9562 version 8) derived from the functions' names and hashes.
std::array<uint8_t, 16> content_uuid(const Container& container, const Sha256& sha256);

}  // namespace torch_metallib::metallib

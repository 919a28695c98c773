// Bounds-checked little-endian reads over a caller-owned byte range. Every read checks
// `offset + n <= size` without overflow before touching memory, so no input can make the
// reader step outside the buffer.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "format_error.h"

namespace torch_metallib::metallib {

// True when [offset, offset + n) lies inside [0, size); immune to overflow.
inline bool range_fits(uint64_t offset, uint64_t n, uint64_t size) {
  return offset <= size && n <= size - offset;
}

class ByteReader {
 public:
  ByteReader(const uint8_t* data, uint64_t size) : data_(data), size_(size) {}

  uint64_t size() const { return size_; }
  const uint8_t* data() const { return data_; }

  // Throws FormatError naming `field` unless [offset, offset + n) is inside the buffer.
  void require(uint64_t offset, uint64_t n, const std::string& field) const {
    if (!range_fits(offset, n, size_)) {
      throw FormatError(offset, field, std::to_string(n) + " bytes inside the file",
                        "only " + std::to_string(offset <= size_ ? size_ - offset : 0) +
                            " bytes left (file size " + std::to_string(size_) + ")");
    }
  }

  template <typename T>
  T read(uint64_t offset, const std::string& field) const {
    require(offset, sizeof(T), field);
    T value;
    std::memcpy(&value, data_ + offset, sizeof(T));  // hosts we build for are little-endian
    return value;
  }

  std::string_view bytes(uint64_t offset, uint64_t n, const std::string& field) const {
    require(offset, n, field);
    return {reinterpret_cast<const char*>(data_ + offset), static_cast<size_t>(n)};
  }

 private:
  const uint8_t* data_;
  uint64_t size_;
};

// Little-endian load from a payload already known to be long enough.
template <typename T>
T load_le(std::string_view bytes, size_t at = 0) {
  T value;
  std::memcpy(&value, bytes.data() + at, sizeof(T));
  return value;
}

}  // namespace torch_metallib::metallib

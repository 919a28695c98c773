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
inline bool range_fits(uint64_t offset, uint64_t n, uint64_t size) { return offset <= size && n <= size - offset; }

// Little-endian load from bytes already known to be long enough.
template <typename T>
T load_le(const void* bytes) {
  T value;
  std::memcpy(&value, bytes, sizeof(T));  // hosts we build for are little-endian
  return value;
}

template <typename T>
T load_le(std::string_view bytes, size_t at = 0) {
  return load_le<T>(bytes.data() + at);
}

class ByteReader {
 public:
  ByteReader(const uint8_t* data, uint64_t size) : data_(data), size_(size) {}

  uint64_t size() const { return size_; }
  const uint8_t* data() const { return data_; }

  // Throws FormatError naming `field` unless [offset, offset + n) is inside the buffer.
  void require(uint64_t offset, uint64_t n, const char* field) const {
    if (!range_fits(offset, n, size_)) out_of_range(offset, n, field);
  }

  template <typename T>
  T read(uint64_t offset, const char* field) const {
    require(offset, sizeof(T), field);
    return load_le<T>(data_ + offset);
  }

  std::string_view bytes(uint64_t offset, uint64_t n, const char* field) const {
    require(offset, n, field);
    return {reinterpret_cast<const char*>(data_ + offset), static_cast<size_t>(n)};
  }

 private:
  [[noreturn]] __attribute__((noinline, cold)) void out_of_range(uint64_t offset, uint64_t n, const char* field) const {
    throw FormatError(offset, field, std::to_string(n) + " bytes inside the file",
                      "only " + std::to_string(offset <= size_ ? size_ - offset : 0) + " bytes left (file size " +
                          std::to_string(size_) + ")");
  }

  const uint8_t* data_;
  uint64_t size_;
};

}  // namespace torch_metallib::metallib

// The one exception type the container code throws for malformed input. The Python
// binding translates it to torch_metallib.MetallibFormatError (a ValueError).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace torch_metallib::metallib {

class FormatError : public std::runtime_error {
 public:
  // `offset` is the absolute byte offset in the file where the bad field starts.
  FormatError(uint64_t offset, const std::string& field, const std::string& expected, const std::string& found)
      : std::runtime_error(compose(offset, field, expected, found)), offset_(offset), field_(field) {}

  uint64_t offset() const { return offset_; }
  const std::string& field() const { return field_; }

 private:
  static std::string compose(uint64_t offset, const std::string& field, const std::string& expected,
                             const std::string& found) {
    return "metallib: " + field + " at byte offset " + std::to_string(offset) + ": expected " + expected + ", got " +
           found + ". The file is truncated, corrupt or not a .metallib.";
  }

  uint64_t offset_;
  std::string field_;
};

}  // namespace torch_metallib::metallib

// SHA-256 (FIPS 180-4), for the HASH tag of new functions and content-derived UUIDs.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace torch_metallib::metallib {

class Sha256 {
 public:
  Sha256();
  void update(std::string_view bytes);
  std::array<uint8_t, 32> finish();

 private:
  void compress(const uint8_t* block);

  std::array<uint32_t, 8> state_;
  std::array<uint8_t, 64> buffer_{};
  uint64_t buffered_ = 0;
  uint64_t total_ = 0;
};

std::array<uint8_t, 32> sha256(std::string_view bytes);

}  // namespace torch_metallib::metallib

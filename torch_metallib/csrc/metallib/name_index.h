// Name -> function position, as one flat open-addressing table of positions. The names
// themselves stay where they are (in the file, or in the functions): the caller says how
// to read position k's name, so the index costs 4 bytes a slot and no per-name storage.
// A slot's low log2(capacity) bits hold the position (always below the capacity, as the
// table is at most 3/4 full) and its high bits a piece of the name's hash, so a probe
// reads a stored name only when that piece matches: the names are scattered over the
// file, and reading one is a cache miss.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

namespace torch_metallib::metallib {

// Reads 8 bytes at a time and mixes with one 64x64->128-bit product per 16 bytes: a
// function name (MLX's average ~60 bytes) hashes in a few nanoseconds.
inline uint64_t name_hash(std::string_view name) {
  auto mix = [](uint64_t a, uint64_t b) {
    const __uint128_t product = __uint128_t(a) * b;
    return uint64_t(product) ^ uint64_t(product >> 64);
  };
  auto load8 = [](const char* p) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    return v;
  };
  constexpr uint64_t k0 = 0xa0761d6478bd642full, k1 = 0xe7037ed1a0b428dbull;
  const char* p = name.data();
  size_t n = name.size();
  uint64_t h = k0 ^ n;
  for (; n > 16; n -= 16, p += 16) h = mix(load8(p) ^ k1, load8(p + 8) ^ h);
  uint64_t a = 0, b = 0;
  if (n >= 8) {
    a = load8(p), b = load8(p + n - 8);
  } else if (n >= 4) {
    uint32_t lo, hi;
    std::memcpy(&lo, p, 4), std::memcpy(&hi, p + n - 4, 4);
    a = lo, b = hi;
  } else if (n > 0) {
    a = (uint64_t(uint8_t(p[0])) << 16) | (uint64_t(uint8_t(p[n / 2])) << 8) | uint8_t(p[n - 1]);
  }
  return mix(a ^ k1, b ^ h);
}

class NameIndex {
 public:
  void reserve(size_t count) {
    size_t capacity = 16;  // at most 3/4 full: 17k names take 128 KB of slots
    while (3 * capacity < 4 * count) capacity *= 2;
    slots_.assign(capacity, kEmpty);
    position_bits_ = 0;
    while ((size_t(1) << position_bits_) < capacity) ++position_bits_;
    size_ = 0;
  }

  // Adds `name` as position size(), or returns the earlier position holding it.
  // `name_of(k)` reads the name of an earlier position k.
  template <class NameOf>
  int64_t insert(std::string_view name, const NameOf& name_of) {
    if (4 * (size_ + 1) > 3 * slots_.size()) grow(name_of);
    const uint64_t hash = name_hash(name);
    const size_t slot = find_slot(name, hash, name_of);
    if (slots_[slot] != kEmpty) return slots_[slot] & position_mask();
    slots_[slot] = (tag_of(hash) & ~position_mask()) | uint32_t(size_++);
    return -1;
  }

  template <class NameOf>
  int64_t find(std::string_view name, const NameOf& name_of) const {
    if (slots_.empty()) return -1;
    const uint32_t at = slots_[find_slot(name, name_hash(name), name_of)];
    return at == kEmpty ? -1 : int64_t(at & position_mask());
  }

 private:
  static constexpr uint32_t kEmpty = 0xffffffffu;

  uint32_t position_mask() const { return uint32_t((uint64_t(1) << position_bits_) - 1); }
  // The hash's top bits (its low bits choose the slot).
  static uint32_t tag_of(uint64_t hash) { return uint32_t(hash >> 32); }

  template <class NameOf>
  size_t find_slot(std::string_view name, uint64_t hash, const NameOf& name_of) const {
    const size_t mask = slots_.size() - 1;
    const uint32_t position = position_mask(), tag = tag_of(hash) & ~position;
    size_t slot = hash & mask;
    for (uint32_t at; (at = slots_[slot]) != kEmpty; slot = (slot + 1) & mask) {
      if ((at & ~position) == tag && name_of(at & position) == name) break;
    }
    return slot;
  }

  template <class NameOf>
  void grow(const NameOf& name_of) {
    const size_t count = size_;
    reserve(count + 1 > 8 ? count + 1 : 8);
    for (size_t k = 0; k < count; ++k) insert(name_of(k), name_of);
  }

  std::vector<uint32_t> slots_;
  unsigned position_bits_ = 0;
  size_t size_ = 0;
};

}  // namespace torch_metallib::metallib

// Name -> function position, as one flat open-addressing table: building it for 17k
// functions costs no per-name allocation (an unordered_map would cost one node each).
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

namespace torch_metallib::metallib {

class NameIndex {
 public:
  // `names` must outlive the index (views into the file or container storage).
  void reserve(size_t count) {
    size_t capacity = 16;  // at most 3/4 full: 17k names take 128 KB of slots
    while (3 * capacity < 4 * count) capacity *= 2;
    slots_.assign(capacity, kEmpty);
    names_.clear();
    names_.reserve(count);
  }

  // Adds `name` as position names_.size(); returns the earlier position if it is taken.
  int64_t insert(std::string_view name) {
    if (4 * (names_.size() + 1) > 3 * slots_.size()) grow();
    size_t slot = find_slot(name);
    if (slots_[slot] != kEmpty) return slots_[slot];
    slots_[slot] = uint32_t(names_.size());
    names_.push_back(name);
    return -1;
  }

  // Every name, by position.
  const std::vector<std::string_view>& names() const { return names_; }

  int64_t find(std::string_view name) const {
    if (slots_.empty()) return -1;
    const uint32_t at = slots_[find_slot(name)];
    return at == kEmpty ? -1 : int64_t(at);
  }

 private:
  static constexpr uint32_t kEmpty = 0xffffffffu;

  size_t find_slot(std::string_view name) const {
    const size_t mask = slots_.size() - 1;
    size_t slot = std::hash<std::string_view>{}(name) & mask;
    while (slots_[slot] != kEmpty && names_[slots_[slot]] != name) slot = (slot + 1) & mask;
    return slot;
  }

  void grow() {
    std::vector<std::string_view> names = std::move(names_);
    reserve(names.size() + 1 > 8 ? names.size() + 1 : 8);
    for (std::string_view name : names) insert(name);
  }

  std::vector<uint32_t> slots_;
  std::vector<std::string_view> names_;
};

}  // namespace torch_metallib::metallib

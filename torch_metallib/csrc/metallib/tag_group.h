// Tag groups: tags (4-char code, u16 or u32 length, payload) terminated by a bare ENDT.
// The model keeps each group in its encoded form (a view of the file, or bytes a builder
// owns); these helpers validate, iterate and write such groups.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "byte_reader.h"
#include "container.h"
#include "tags.h"

namespace torch_metallib::metallib {

// Names a tag group in error messages. Built cheaply per group; the text is only
// composed when an error is thrown.
struct Place {
  const char* group;        // "function-list group", "public metadata", "header extension"
  int64_t function = -1;    // index of the function the group belongs to, or -1
  std::string_view name{};  // that function's name, when known
  std::string describe() const;
};

enum class GroupProblem { kNoEndTag, kBytesAfterEndTag, kNoLength, kPayloadTooLong };

// The FormatError for a malformed group (kept out of line: the loop below stays small).
[[noreturn]] void throw_bad_group(GroupProblem problem, uint64_t at, uint64_t end, uint32_t code, uint64_t length,
                                  const Place& where);

// Validates the group from `begin` to `end` (ENDT must be its last 4 bytes), calling
// visit(Tag) for every tag; returns the encoded group, ENDT included.
template <typename Visit>
std::string_view read_tag_group(const ByteReader& in, uint64_t begin, uint64_t end, const Place& where, Visit&& visit) {
  in.require(begin, end - begin, "tag group");  // callers pass begin <= end <= size
  const uint8_t* data = in.data();
  uint64_t at = begin;
  while (true) {
    if (!range_fits(at, 4, end)) throw_bad_group(GroupProblem::kNoEndTag, at, end, 0, 0, where);
    const uint32_t code = load_le<uint32_t>(data + at);
    if (code == kEndTag) {
      if (at + 4 != end) throw_bad_group(GroupProblem::kBytesAfterEndTag, at, end, code, 0, where);
      return {reinterpret_cast<const char*>(data + begin), size_t(end - begin)};
    }
    const bool wide = has_u32_length(code);
    const uint64_t length_size = wide ? 4 : 2;
    if (!range_fits(at + 4, length_size, end)) {
      throw_bad_group(GroupProblem::kNoLength, at, end, code, 0, where);
    }
    const uint64_t length = wide ? load_le<uint32_t>(data + at + 4) : load_le<uint16_t>(data + at + 4);
    const uint64_t payload_at = at + 4 + length_size;
    if (!range_fits(payload_at, length, end)) {
      throw_bad_group(GroupProblem::kPayloadTooLong, at, end, code, length, where);
    }
    visit(Tag{code, {reinterpret_cast<const char*>(data + payload_at), size_t(length)}, at});
    at = payload_at + length;
  }
}

// The tags of a group that was validated (read_tag_group) or encoded (encode_tag_group).
// `offset` is the group's file offset, used for each Tag::offset.
std::vector<Tag> decode_tags(std::string_view group, uint64_t offset);

// Bytes `tags` take when written, ENDT included.
uint64_t tag_group_size(const std::vector<Tag>& tags);

// Appends the tags and ENDT. The caller has checked every payload fits its length field.
void write_tag_group(std::string& out, const std::vector<Tag>& tags);

std::string encode_tag_group(const std::vector<Tag>& tags);

// Appends one little-endian value.
template <typename T>
void put_le(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

}  // namespace torch_metallib::metallib

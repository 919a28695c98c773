// Reading and writing one tag group: tags (4-char code, u16 or u32 length, payload)
// terminated by a bare ENDT. Shared by every section that stores tags.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "byte_reader.h"
#include "container.h"

namespace torch_metallib::metallib {

// Names a tag group in error messages. Built cheaply per group; the text is only
// composed when an error is thrown.
struct Place {
  const char* group;          // "function-list group", "public metadata", "header extension"
  int64_t function = -1;      // index of the function the group belongs to, or -1
  std::string_view name{};    // that function's name, when known
  std::string describe() const;
};

// Reads tags starting at `begin` up to and including ENDT, which must end exactly at
// `end`, appending them to `out`; returns where they landed.
TagSpan read_tag_group(const ByteReader& in, uint64_t begin, uint64_t end, const Place& place,
                       std::vector<Tag>& out);

// Bytes `tags` take when written, ENDT included.
uint64_t tag_group_size(TagRange tags);

// Appends the tags and ENDT. The caller has checked every payload fits its length field.
void write_tag_group(std::string& out, TagRange tags);

// Appends one little-endian value.
template <typename T>
void put_le(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

}  // namespace torch_metallib::metallib

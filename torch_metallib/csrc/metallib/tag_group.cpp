#include "tag_group.h"

namespace torch_metallib::metallib {

std::string Place::describe() const {
  std::string text;
  if (function >= 0) {
    text = "function " + std::to_string(function);
    if (!name.empty()) text += " '" + std::string(name) + "'";
    text += " ";
  }
  return text + group;
}

void throw_bad_group(GroupProblem problem, uint64_t at, uint64_t end, uint32_t code, uint64_t length,
                     const Place& where) {
  const std::string group = where.describe();
  const std::string before_end = "before the group ends at byte " + std::to_string(end);
  const std::string tag = group + " tag " + tag_name(code);
  switch (problem) {
    case GroupProblem::kNoEndTag:
      throw FormatError(at, group + " ENDT", "a 4-byte tag code or ENDT " + before_end,
                        "the group ran out without ENDT");
    case GroupProblem::kBytesAfterEndTag:
      throw FormatError(at, group + " ENDT", "ENDT as the group's last 4 bytes",
                        std::to_string(end - at - 4) + " bytes of the group after it");
    case GroupProblem::kNoLength:
      throw FormatError(at + 4, tag + " length", "a length field " + before_end,
                        std::to_string(end - at - 4) + " bytes left");
    case GroupProblem::kPayloadTooLong:
    default: {
      const uint64_t payload_at = at + 4 + (has_u32_length(code) ? 4 : 2);
      throw FormatError(
          at, tag, "a payload that ends " + before_end,
          "length " + std::to_string(length) + " with " + std::to_string(end - payload_at) + " bytes left");
    }
  }
}

std::vector<Tag> decode_tags(std::string_view group, uint64_t offset) {
  std::vector<Tag> tags;
  const ByteReader in(reinterpret_cast<const uint8_t*>(group.data()), group.size());
  const Place where{"encoded group"};
  read_tag_group(in, 0, group.size(), where, [&](Tag tag) {
    tag.offset += offset;
    tags.push_back(tag);
  });
  return tags;
}

uint64_t tag_group_size(const std::vector<Tag>& tags) {
  uint64_t size = 4;  // ENDT
  for (const Tag& tag : tags) {
    size += 4 + (has_u32_length(tag.code) ? 4 : 2) + tag.payload.size();
  }
  return size;
}

void write_tag_group(std::string& out, const std::vector<Tag>& tags) {
  for (const Tag& tag : tags) {
    put_le<uint32_t>(out, tag.code);
    if (has_u32_length(tag.code)) {
      put_le<uint32_t>(out, static_cast<uint32_t>(tag.payload.size()));
    } else {
      put_le<uint16_t>(out, static_cast<uint16_t>(tag.payload.size()));
    }
    out.append(tag.payload);
  }
  put_le<uint32_t>(out, kEndTag);
}

std::string encode_tag_group(const std::vector<Tag>& tags) {
  std::string out;
  out.reserve(tag_group_size(tags));
  write_tag_group(out, tags);
  return out;
}

}  // namespace torch_metallib::metallib

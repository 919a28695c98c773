#include "tag_group.h"

#include "tags.h"

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

TagSpan read_tag_group(const ByteReader& in, uint64_t begin, uint64_t end, const Place& where,
                       std::vector<Tag>& tags) {
  const size_t first = tags.size();
  uint64_t at = begin;
  while (true) {
    if (!range_fits(at, 4, end)) {
      throw FormatError(at, where.describe() + " tag",
                        "a 4-byte tag code or ENDT before the group ends at byte " +
                            std::to_string(end),
                        "the group ran out without ENDT");
    }
    const uint32_t code = in.read<uint32_t>(at, "tag code");
    if (code == kEndTag) {
      if (at + 4 != end) {
        throw FormatError(at, where.describe() + " ENDT",
                          "the group to end at byte " + std::to_string(end),
                          "ENDT at byte " + std::to_string(at) + " with " +
                              std::to_string(end - at - 4) + " bytes of the group left after it");
      }
      return TagSpan{uint32_t(first), uint32_t(tags.size() - first)};
    }
    const bool wide = has_u32_length(code);
    const uint64_t length_size = wide ? 4 : 2;
    if (!range_fits(at + 4, length_size, end)) {
      throw FormatError(at + 4, where.describe() + " tag " + tag_name(code) + " length",
                        "a length field before the group ends at byte " + std::to_string(end),
                        std::to_string(end - at - 4) + " bytes left");
    }
    const uint64_t length = wide ? in.read<uint32_t>(at + 4, "tag length")
                                 : in.read<uint16_t>(at + 4, "tag length");
    const uint64_t payload_at = at + 4 + length_size;
    if (!range_fits(payload_at, length, end)) {
      throw FormatError(at, where.describe() + " tag " + tag_name(code),
                        "its " + std::to_string(length) +
                            "-byte payload to end before the group ends at byte " +
                            std::to_string(end),
                        std::to_string(end - payload_at) + " bytes left in the group");
    }
    tags.push_back(Tag{code, in.bytes(payload_at, length, "tag payload"), at});
    at = payload_at + length;
  }
}

uint64_t tag_group_size(TagRange tags) {
  uint64_t size = 4;  // ENDT
  for (const Tag& tag : tags) {
    size += 4 + (has_u32_length(tag.code) ? 4 : 2) + tag.payload.size();
  }
  return size;
}

void write_tag_group(std::string& out, TagRange tags) {
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

}  // namespace torch_metallib::metallib

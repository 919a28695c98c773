#include "writer.h"

#include <algorithm>
#include <deque>
#include <stdexcept>

#include "reader.h"
#include "sha256.h"
#include "tag_group.h"
#include "tags.h"

namespace torch_metallib::metallib {
namespace {

std::string_view view(const std::string& bytes) { return {bytes.data(), bytes.size()}; }

template <typename T>
std::string le_bytes(T value) {
  std::string out;
  put_le<T>(out, value);
  return out;
}

// Where every piece goes, computed before anything is written.
struct Layout {
  std::vector<uint64_t> public_offsets, private_offsets, module_offsets, reflection_offsets;
  uint64_t public_size = 0, private_size = 0, module_size = 0, reflection_size = 0;
  bool any_reflection = false;
};

Layout plan(const Container& c, std::vector<std::string_view>& reflections) {
  Layout layout;
  const size_t n = c.functions.size();
  uint64_t reflection_at = 4;  // after the u32 count
  for (size_t i = 0; i < n; ++i) {
    const Function& f = c.functions[i];
    layout.public_offsets.push_back(layout.public_size);
    layout.public_size += 4 + f.public_metadata.size();
    layout.private_offsets.push_back(layout.private_size);
    layout.private_size += 4 + f.private_metadata.size();
    layout.module_offsets.push_back(layout.module_size);
    layout.module_size += f.module.size();
    layout.reflection_offsets.push_back(reflection_at);
    reflections.push_back(function_reflection(c, f, i));
    if (!reflections.back().empty()) {
      reflection_at += reflections.back().size();
      layout.any_reflection = true;
    }
  }
  layout.reflection_size = reflection_at;
  return layout;
}

// The function-list tags with computed payloads substituted; `storage` owns them (a
// deque: growing it never moves the strings earlier payload views point into).
std::vector<Tag> function_tags(const Container& c, size_t i, const Layout& layout, std::deque<std::string>& storage) {
  const Function& f = c.functions[i];
  std::vector<Tag> tags = decode_tags(f.tags, f.tags_offset);
  for (Tag& tag : tags) {
    const TagSpec* spec = find_tag(tag.code);
    if (spec == nullptr || (spec->places & kFunctionList) == 0) continue;
    switch (spec->kind) {
      case TagKind::kHash: tag.payload = f.hash; break;
      case TagKind::kOffsets:
        storage.push_back(le_bytes(layout.public_offsets[i]) + le_bytes(layout.private_offsets[i]) +
                          le_bytes(layout.module_offsets[i]));
        tag.payload = view(storage.back());
        break;
      case TagKind::kModuleSize:
        storage.push_back(le_bytes<uint64_t>(f.module.size()));
        tag.payload = view(storage.back());
        break;
      case TagKind::kReflectionRef:
        storage.push_back(le_bytes(layout.reflection_offsets[i]));
        tag.payload = view(storage.back());
        break;
      default: break;
    }
  }
  return tags;
}

// A metadata or function-list group: u32 size (counting itself unless the convention says
// otherwise), tags, ENDT.
void put_group(std::string& out, std::string_view encoded,
               GroupSizeConvention sizes = GroupSizeConvention::kCountsItself) {
  const size_t own = sizes == GroupSizeConvention::kCountsItself ? 4 : 0;
  put_le<uint32_t>(out, static_cast<uint32_t>(own + encoded.size()));
  out.append(encoded);
}

}  // namespace

std::string write_container(const Container& c) {
  std::vector<std::string_view> reflections;
  const Layout layout = plan(c, reflections);
  std::deque<std::string> storage;

  std::string list;
  put_le<uint32_t>(list, static_cast<uint32_t>(c.functions.size()));
  for (size_t i = 0; i < c.functions.size(); ++i) {
    put_group(list, encode_tag_group(function_tags(c, i, layout, storage)));
  }

  // Sections after the modules, in their original order; the reflection list is rebuilt.
  std::string reflection_list;
  if (layout.any_reflection) {
    uint32_t groups = 0;
    for (std::string_view group : reflections) groups += group.empty() ? 0 : 1;
    reflection_list.reserve(layout.reflection_size);
    put_le<uint32_t>(reflection_list, groups);
    for (std::string_view group : reflections) reflection_list.append(group);
  }
  std::vector<std::string_view> trailing_bytes;
  for (const TrailingSection& section : c.trailing) {
    trailing_bytes.push_back(section.code == kTagReflectionList ? view(reflection_list) : section.bytes);
  }

  uint64_t extension_size = c.has_extension ? tag_group_size(c.extension) : 0;
  const uint64_t list_offset = kHeaderSize + c.gaps[0].size();
  const uint64_t public_offset = list_offset + list.size() + extension_size;
  const uint64_t private_offset = public_offset + layout.public_size + c.gaps[1].size();
  const uint64_t module_offset = private_offset + layout.private_size + c.gaps[2].size();
  uint64_t at = module_offset + layout.module_size;
  std::vector<uint64_t> trailing_offsets;
  for (size_t k = 0; k < c.trailing.size(); ++k) {
    at += c.trailing[k].gap_before.size();
    trailing_offsets.push_back(at);
    at += trailing_bytes[k].size();
  }
  const uint64_t file_size = at + c.tail.size();

  std::vector<Tag> extension = c.extension;
  for (Tag& tag : extension) {
    const TagSpec* spec = find_tag(tag.code);
    if (spec == nullptr || spec->kind != TagKind::kSectionRef) continue;
    for (size_t k = 0; k < c.trailing.size(); ++k) {
      if (c.trailing[k].code == tag.code) {
        storage.push_back(le_bytes(trailing_offsets[k]) + le_bytes<uint64_t>(trailing_bytes[k].size()));
        tag.payload = view(storage.back());
      }
    }
  }

  std::string out;
  out.reserve(file_size);
  const Header& h = c.header;
  put_le<uint32_t>(out, kMagic);
  put_le<uint16_t>(out, uint16_t((h.format_major & 0x7fff) | (h.macos_target ? 0x8000 : 0)));
  put_le<uint16_t>(out, h.format_minor);
  put_le<uint16_t>(out, h.format_patch);
  put_le<uint8_t>(out, h.file_type);
  put_le<uint8_t>(out, h.platform);
  put_le<uint16_t>(out, h.platform_major);
  put_le<uint8_t>(out, h.platform_minor);
  put_le<uint8_t>(out, h.platform_patch);
  put_le<uint64_t>(out, file_size);
  put_le<uint64_t>(out, list_offset);
  put_le<uint64_t>(out, list.size() - 4);  // the size excludes the u32 count
  put_le<uint64_t>(out, public_offset);
  put_le<uint64_t>(out, layout.public_size);
  put_le<uint64_t>(out, private_offset);
  put_le<uint64_t>(out, layout.private_size);
  put_le<uint64_t>(out, module_offset);
  put_le<uint64_t>(out, layout.module_size);
  out.append(c.gaps[0]);
  out.append(list);
  if (c.has_extension) write_tag_group(out, extension);
  for (const Function& f : c.functions) put_group(out, f.public_metadata, c.metadata_sizes);
  out.append(c.gaps[1]);
  for (const Function& f : c.functions) put_group(out, f.private_metadata, c.metadata_sizes);
  out.append(c.gaps[2]);
  for (const Function& f : c.functions) out.append(f.module);
  for (size_t k = 0; k < c.trailing.size(); ++k) {
    out.append(c.trailing[k].gap_before);
    out.append(trailing_bytes[k]);
  }
  out.append(c.tail);
  return out;
}

std::array<uint8_t, 16> content_uuid(const Container& c, const Sha256& sha256) {
  std::string content;
  for (const Function& f : c.functions) {
    content.append(f.name);
    content.push_back('\0');
    content.append(f.hash);
  }
  const std::array<uint8_t, 32> digest = sha256(content);
  std::array<uint8_t, 16> uuid;
  std::copy(digest.begin(), digest.begin() + 16, uuid.begin());
  uuid[6] = uint8_t((uuid[6] & 0x0f) | 0x80);  // version 8 (custom)
  uuid[8] = uint8_t((uuid[8] & 0x3f) | 0x80);  // RFC variant
  return uuid;
}

Container select_functions(const Container& source, const std::vector<size_t>& indices, const Sha256& sha256) {
  Container out;
  out.source = source.source;
  out.header = source.header;
  out.metadata_sizes = source.metadata_sizes;
  out.has_extension = source.has_extension;
  out.extension = source.extension;
  out.gaps = source.gaps;
  out.trailing = source.trailing;
  out.tail = source.tail;
  out.index.reserve(indices.size());
  for (size_t i : indices) {
    const Function& f = source.functions.at(i);
    if (out.index.insert(f.name, [&out](size_t k) { return out.functions[k].name; }) >= 0) {
      throw std::invalid_argument("subset: function '" + std::string(f.name) + "' is listed twice");
    }
    out.functions.push_back(f);
  }
  const std::array<uint8_t, 16> uuid = content_uuid(out, sha256);
  for (Tag& tag : out.extension) {
    if (tag.code == kTagUuid) tag.payload = out.own(std::string(uuid.begin(), uuid.end()));
  }
  return out;
}

}  // namespace torch_metallib::metallib

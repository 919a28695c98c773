#include "reader.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <functional>

#include "byte_reader.h"
#include "function_constants.h"
#include "module_wrapper.h"
#include "name_index.h"
#include "tag_group.h"
#include "tags.h"

namespace torch_metallib::metallib {
namespace {

// A section named by an (offset, size) pair, already checked to lie inside the file.
using Region = SectionRange;

std::string byte_count(uint64_t n) { return std::to_string(n) + (n == 1 ? " byte" : " bytes"); }

// "4D 54 4C 42": bytes in file order, for fields such as the magic.
std::string hex_bytes(std::string_view bytes) {
  std::string text;
  for (unsigned char b : bytes) {
    char hex[4];
    std::snprintf(hex, sizeof hex, "%02X ", b);
    text += hex;
  }
  if (!text.empty()) text.pop_back();
  return text;
}

std::string range_text(uint64_t offset, uint64_t size) {
  return "offset " + std::to_string(offset) + ", size " + std::to_string(size);
}

Region region_in_file(const ByteReader& in, uint64_t offset, uint64_t size, uint64_t field_at,
                      const std::string& field) {
  if (!range_fits(offset, size, in.size())) {
    throw FormatError(field_at, field, "a range inside the " + std::to_string(in.size()) + "-byte file",
                      range_text(offset, size));
  }
  return {offset, size};
}

Region read_region(const ByteReader& in, uint64_t field_at, const std::string& field) {
  return region_in_file(in, in.read<uint64_t>(field_at, "section offset"),
                        in.read<uint64_t>(field_at + 8, "section size"), field_at, field);
}

void require_after(uint64_t previous_end, const std::string& previous, const Region& region, uint64_t field_at,
                   const std::string& field) {
  if (region.offset < previous_end) {
    throw FormatError(field_at, field + " offset",
                      "at or after the end of the " + previous + " (byte " + std::to_string(previous_end) + ")",
                      "byte " + std::to_string(region.offset) + " (sections overlap or are out of order)");
  }
}

void require_size(const Tag& tag, const TagSpec& spec, const Place& where) {
  if (spec.fixed_size != kVariableSize && int64_t(tag.payload.size()) != spec.fixed_size) {
    throw FormatError(tag.offset, where.describe() + " tag " + spec.name + " length",
                      byte_count(uint64_t(spec.fixed_size)), byte_count(tag.payload.size()));
  }
}

void record_unknown(Container& container, const Tag& tag, const Place& where) {
  container.unknown_tags.push_back(UnknownTag{where.describe(), tag.code, tag.offset, uint64_t(tag.payload.size())});
}

// Checks each tag of one group against the table as read_tag_group visits it: known
// tags get their size checked and may appear once; unknown ones are recorded.
class TagChecker {
 public:
  TagChecker(Container& container, TagPlace place, const Place& where)
      : container_(container), place_(place), where_(where) {}

  // The tag's spec when it is known in this place, else nullptr (recorded as unknown).
  const TagSpec* check(const Tag& tag) {
    const TagSpec* spec = find_tag(tag.code);
    if (spec == nullptr || (spec->places & place_) == 0) {
      record_unknown(container_, tag, where_);
      return nullptr;
    }
    require_size(tag, *spec, where_);
    for (size_t i = 0; i < seen_count_; ++i) {
      if (seen_codes_[i] == tag.code) {
        throw FormatError(tag.offset, where_.describe() + " tag " + spec->name,
                          "at most one " + std::string(spec->name) + " tag per group",
                          "a second one (the first is at byte " + std::to_string(seen_offsets_[i]) + ")");
      }
    }
    // At most one tag per table entry gets here, so the arrays cannot overflow.
    seen_codes_[seen_count_] = tag.code;
    seen_offsets_[seen_count_++] = tag.offset;
    return spec;
  }

 private:
  Container& container_;
  TagPlace place_;
  const Place& where_;
  // Left uninitialized on purpose: three checkers per function would otherwise zero
  // 17k x 1.3 KB per MLX load. Only the first seen_count_ entries are read.
  uint32_t seen_codes_[kTagCount];
  uint64_t seen_offsets_[kTagCount];
  size_t seen_count_ = 0;
};

Header read_header(const ByteReader& in) {
  if (in.size() < kHeaderSize) {
    throw FormatError(0, "header", "at least " + std::to_string(kHeaderSize) + " bytes",
                      std::to_string(in.size()) + " bytes");
  }
  const uint32_t magic = in.read<uint32_t>(0, "magic");
  if (magic != kMagic) {
    throw FormatError(0, "magic", "'MTLB' (4D 54 4C 42)", hex_bytes(in.bytes(0, 4, "magic")) + " (not a .metallib)");
  }
  Header header;
  const uint16_t target_and_major = in.read<uint16_t>(4, "format version");
  header.format_major = target_and_major & 0x7fff;
  header.macos_target = (target_and_major & 0x8000) != 0;
  if (header.format_major != 1) {
    throw FormatError(4, "format major version", "1 (the only .metallib format Apple has shipped)",
                      std::to_string(header.format_major));
  }
  header.format_minor = in.read<uint16_t>(6, "format minor version");
  header.format_patch = in.read<uint16_t>(8, "format patch version");
  header.file_type = in.read<uint8_t>(10, "file type");
  if ((header.file_type & 0x7f) > 3) {
    throw FormatError(10, "file type",
                      "0 (executable), 1 (CoreImage), 2 (dynamic) or 3 (symbol companion), "
                      "optionally with bit 7 (stub)",
                      std::to_string(header.file_type));
  }
  header.platform = in.read<uint8_t>(11, "platform");
  header.platform_major = in.read<uint16_t>(12, "platform major version");
  header.platform_minor = in.read<uint8_t>(14, "platform minor version");
  header.platform_patch = in.read<uint8_t>(15, "platform patch version");
  const uint64_t declared = in.read<uint64_t>(16, "file size");
  if (declared != in.size()) {
    throw FormatError(16, "file size", std::to_string(in.size()) + " (the length of the data)",
                      std::to_string(declared));
  }
  return header;
}

// Header-extension tags; returns the sections after the modules that they point to.
std::vector<std::pair<const Tag*, Region>> read_extension(const ByteReader& in, Container& c, uint64_t begin,
                                                          uint64_t end, const Region& modules) {
  const Place where{"header extension"};
  c.has_extension = true;
  TagChecker checker(c, kHeaderExtension, where);
  read_tag_group(in, begin, end, where, [&](const Tag& tag) {
    checker.check(tag);
    c.extension.push_back(tag);
  });
  std::vector<std::pair<const Tag*, Region>> sections;
  for (const Tag& tag : c.extension) {
    const TagSpec* spec = find_tag(tag.code);
    if (spec == nullptr || spec->kind != TagKind::kSectionRef) continue;
    const std::string field = "header extension " + std::string(spec->name) + " section";
    const Region region =
        region_in_file(in, load_le<uint64_t>(tag.payload, 0), load_le<uint64_t>(tag.payload, 8), tag.offset, field);
    require_after(modules.end(), "module section", region, tag.offset, field);
    sections.emplace_back(&tag, region);
  }
  return sections;
}

void place_trailing_sections(const ByteReader& in, Container& c, std::vector<std::pair<const Tag*, Region>> sections,
                             uint64_t modules_end) {
  std::sort(sections.begin(), sections.end(),
            [](const auto& a, const auto& b) { return a.second.offset < b.second.offset; });
  uint64_t previous_end = modules_end;
  std::string previous = "module section";
  for (const auto& [tag, region] : sections) {
    const std::string field = "header extension " + tag_name(tag->code) + " section";
    require_after(previous_end, previous, region, tag->offset, field);
    c.trailing.push_back(TrailingSection{tag->code, in.bytes(previous_end, region.offset - previous_end, "section gap"),
                                         in.bytes(region.offset, region.size, "section")});
    previous_end = region.end();
    previous = tag_name(tag->code) + " section";
  }
  c.tail = in.bytes(previous_end, in.size() - previous_end, "trailing bytes");
}

bool ends_with_endt(const ByteReader& in, uint64_t group_at, uint64_t group_size, uint64_t limit) {
  return group_size >= 8 && range_fits(group_at, group_size, limit) &&
         in.read<uint32_t>(group_at + group_size - 4, "ENDT") == kEndTag;
}

// The file's metadata group-size convention, from its first group: the one under which the
// group's last 4 bytes are ENDT (the current one when both or neither fit).
GroupSizeConvention detect_convention(const ByteReader& in, uint64_t at, uint32_t size, uint64_t section_end) {
  if (!ends_with_endt(in, at, size, section_end) && ends_with_endt(in, at, uint64_t(size) + 4, section_end)) {
    return GroupSizeConvention::kExcludesItself;
  }
  return GroupSizeConvention::kCountsItself;
}

// One per-function metadata group: u32 size, tags, ENDT. The size counts its own 4 bytes
// or not, as the file's convention says (Container::metadata_sizes).
template <typename Visit>
std::string_view read_metadata_group(const ByteReader& in, Container& c, const Region& section, uint64_t relative,
                                     const Place& where, uint64_t offsets_tag_at, Visit&& visit) {
  if (!range_fits(relative, 4, section.size)) {
    throw FormatError(offsets_tag_at, where.describe() + " offset (OFFT)",
                      "an offset inside the " + std::to_string(section.size) + "-byte section",
                      std::to_string(relative));
  }
  const uint64_t at = section.offset + relative;
  const uint32_t size = in.read<uint32_t>(at, "group size");
  if (!c.metadata_sizes_known) {
    c.metadata_sizes = detect_convention(in, at, size, section.end());
    c.metadata_sizes_known = true;
  }
  const bool counts_itself = c.metadata_sizes == GroupSizeConvention::kCountsItself;
  const uint64_t extent = uint64_t(size) + (counts_itself ? 0 : 4);
  if (extent < 8 || !range_fits(relative, extent, section.size)) {
    const uint64_t room = section.size - relative;
    throw FormatError(
        at, where.describe() + " group size",
        counts_itself
            ? "8 to " + std::to_string(room) + " bytes (counting its own 4, as this file's first group does)"
            : "4 to " + std::to_string(room - 4) + " bytes (not counting its own 4, as this file's first group does)",
        std::to_string(size));
  }
  return read_tag_group(in, at + 4, at + extent, where, visit);
}

struct FunctionFields {
  uint64_t public_offset = 0, private_offset = 0, module_offset = 0, module_size = 0;
  uint64_t offsets_tag_at = 0;
  bool has_reflection = false;
  uint64_t reflection_offset = 0, reflection_tag_at = 0;
};

FunctionFields read_function_tags(const ByteReader& in, Container& c, Function& f, const Place& where,
                                  uint64_t group_at, uint64_t group_end) {
  FunctionFields fields;
  bool has_name = false, has_type = false, has_offsets = false, has_size = false;
  TagChecker checker(c, kFunctionList, where);
  f.tags_offset = group_at + 4;
  f.tags = read_tag_group(in, group_at + 4, group_end, where, [&](const Tag& tag) {
    const TagSpec* spec = checker.check(tag);
    if (spec == nullptr) return;
    switch (spec->kind) {
      case TagKind::kName: {
        const size_t nul = tag.payload.find('\0');
        if (tag.payload.size() < 2 || nul != tag.payload.size() - 1) {
          throw FormatError(tag.offset, where.describe() + " NAME", "a non-empty name ending in its only NUL byte",
                            nul == std::string_view::npos ? "no NUL terminator"
                                                          : "a NUL at payload byte " + std::to_string(nul) + " of " +
                                                                std::to_string(tag.payload.size()));
        }
        f.name = tag.payload.substr(0, tag.payload.size() - 1);
        has_name = true;
        break;
      }
      case TagKind::kFunctionType:
        f.type = uint8_t(tag.payload[0]);
        has_type = true;
        break;
      case TagKind::kHash: f.hash = tag.payload; break;
      case TagKind::kOffsets:
        fields.public_offset = load_le<uint64_t>(tag.payload, 0);
        fields.private_offset = load_le<uint64_t>(tag.payload, 8);
        fields.module_offset = load_le<uint64_t>(tag.payload, 16);
        fields.offsets_tag_at = tag.offset;
        has_offsets = true;
        break;
      case TagKind::kModuleSize:
        fields.module_size = load_le<uint64_t>(tag.payload, 0);
        has_size = true;
        break;
      case TagKind::kReflectionRef:
        fields.has_reflection = true;
        fields.reflection_offset = load_le<uint64_t>(tag.payload, 0);
        fields.reflection_tag_at = tag.offset;
        break;
      default: break;
    }
  });
  const char* missing = !has_name        ? "NAME"
                        : !has_type      ? "TYPE"
                        : f.hash.empty() ? "HASH"
                        : !has_offsets   ? "OFFT"
                        : !has_size      ? "MDSZ"
                                         : nullptr;
  if (missing != nullptr) {
    throw FormatError(group_at, where.describe(), std::string("the required ") + missing + " tag",
                      "a group without one");
  }
  return fields;
}

// Reads one metadata group of `f` and checks its tags; CNST must decode.
std::string_view read_metadata(const ByteReader& in, Container& c, const Region& section, uint64_t relative,
                               TagPlace place, const Place& where, uint64_t offsets_tag_at) {
  TagChecker checker(c, place, where);
  return read_metadata_group(in, c, section, relative, where, offsets_tag_at, [&](const Tag& tag) {
    const TagSpec* spec = checker.check(tag);
    if (spec != nullptr && spec->kind == TagKind::kConstants) {
      decode_constants(tag.payload, tag.offset, where.describe());
    }
  });
}

// Module (offset, size) of each function, in file order; throws for two that overlap.
void check_modules_disjoint(const std::vector<std::pair<uint64_t, uint64_t>>& modules,
                            const std::function<std::string(size_t)>& describe) {
  std::vector<size_t> order(modules.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  const auto starts_before = [&](size_t a, size_t b) { return modules[a].first < modules[b].first; };
  if (!std::is_sorted(order.begin(), order.end(), starts_before)) {
    std::sort(order.begin(), order.end(), starts_before);
  }
  for (size_t k = 1; k < order.size(); ++k) {
    const auto& before = modules[order[k - 1]];
    const auto& after = modules[order[k]];
    if (after.first < before.first + before.second) {
      throw FormatError(after.first, describe(order[k]) + " module", "a module disjoint from the others",
                        "overlap with " + describe(order[k - 1]) + " (bytes " + std::to_string(before.first) + "-" +
                            std::to_string(before.first + before.second) + ")");
    }
  }
}

// What a load keeps of one function-list group, read without the tag table: false when
// anything is unusual (a tag this reader does not expect, repeated, missing or of an odd
// size), for read_function_tags to judge with its exact messages.
struct ListFields {
  std::string_view name;
  uint64_t module_offset = 0, module_size = 0, offsets_tag_at = 0;
  bool has_reflection = false;
  uint64_t reflection_offset = 0, reflection_tag_at = 0;
};

bool read_list_group_fast(const uint8_t* data, uint64_t at, uint64_t end, ListFields& out) {
  enum : uint32_t { kName = 1, kType = 2, kHash = 4, kOffsets = 8, kVersions = 16, kSize = 32, kReflection = 64 };
  constexpr uint32_t kRequired = kName | kType | kHash | kOffsets | kSize;
  uint32_t seen = 0;
  while (true) {
    if (!range_fits(at, 4, end)) return false;
    const uint32_t code = load_le<uint32_t>(data + at);
    if (code == kEndTag) return at + 4 == end && (seen & kRequired) == kRequired;
    if (!range_fits(at + 4, 2, end)) return false;
    const uint64_t length = load_le<uint16_t>(data + at + 4);
    const uint64_t payload = at + 6;
    if (!range_fits(payload, length, end)) return false;
    const char* bytes = reinterpret_cast<const char*>(data + payload);
    uint32_t bit = 0;
    uint64_t size = 0;
    switch (code) {
      case kTagName: bit = kName, size = length; break;
      case kTagType: bit = kType, size = 1; break;
      case kTagHash: bit = kHash, size = 32; break;
      case kTagOffsets: bit = kOffsets, size = 24; break;
      case kTagVersions: bit = kVersions, size = 8; break;
      case kTagModuleSize: bit = kSize, size = 8; break;
      case kTagReflection: bit = kReflection, size = 8; break;
      default: return false;
    }
    if (length != size || (seen & bit) != 0) return false;
    seen |= bit;
    switch (code) {
      case kTagName:
        if (length < 2 || std::memchr(bytes, 0, length) != bytes + length - 1) return false;
        out.name = {bytes, size_t(length - 1)};
        break;
      case kTagOffsets:
        out.module_offset = load_le<uint64_t>(bytes + 16);
        out.offsets_tag_at = at;
        break;
      case kTagModuleSize: out.module_size = load_le<uint64_t>(bytes); break;
      case kTagReflection:
        out.has_reflection = true;
        out.reflection_offset = load_le<uint64_t>(bytes);
        out.reflection_tag_at = at;
        break;
      default: break;
    }
    at = payload + length;
  }
}

// The checks a load makes per function, small enough to inline; their messages are built
// out of line.
[[noreturn]] void throw_bad_module_range(const Container& c, const Place& where, uint64_t offset, uint64_t size,
                                         uint64_t tag_at) {
  throw FormatError(tag_at, where.describe() + " module range (OFFT/MDSZ)",
                    "a range inside the " + std::to_string(c.module_section.size) + "-byte module section",
                    range_text(offset, size));
}

void check_module_range(const Container& c, const Place& where, uint64_t offset, uint64_t size, uint64_t tag_at) {
  if (!range_fits(offset, size, c.module_section.size)) throw_bad_module_range(c, where, offset, size, tag_at);
}

[[noreturn]] void throw_bad_reflection_reference(const Container& c, const Place& function, uint64_t offset,
                                                 uint64_t tag_at) {
  const Place where{"reflection-list group", function.function, function.name};
  if (!c.has_reflection_list) {
    throw FormatError(tag_at, where.describe() + " RFLT", "a header-extension RLST tag locating the reflection list",
                      "no reflection list");
  }
  throw FormatError(tag_at, where.describe() + " RFLT offset",
                    "an offset inside the " + std::to_string(c.reflection_list.size) + "-byte reflection list",
                    std::to_string(offset));
}

void check_reflection_reference(const Container& c, const Place& function, uint64_t offset, uint64_t tag_at) {
  if (!c.has_reflection_list || !range_fits(offset, 8, c.reflection_list.size)) {
    throw_bad_reflection_reference(c, function, offset, tag_at);
  }
}

uint32_t read_group_size(const ByteReader& in, uint64_t at, uint64_t list_end, const Place& where) {
  const uint32_t group_size = in.read<uint32_t>(at, "function group size");
  if (group_size < 8 || !range_fits(at, group_size, list_end)) {
    throw FormatError(at, where.describe() + " size",
                      "8 to " + std::to_string(list_end - at) + " bytes (the rest of the function list)",
                      std::to_string(group_size));
  }
  return group_size;
}

// Function `i` from its function-list group: every tag checked against the table (unknown
// ones recorded in `c`), its module and reflection ranges, and with `metadata` its public
// and private metadata groups.
Function read_function_group(const ByteReader& in, Container& c, size_t i, uint64_t at, uint32_t group_size,
                             bool metadata) {
  Function f;
  Place where{"function-list group", int64_t(i)};
  const FunctionFields fields = read_function_tags(in, c, f, where, at, at + group_size);
  where.name = f.name;
  check_module_range(c, where, fields.module_offset, fields.module_size, fields.offsets_tag_at);
  f.module_offset = c.module_section.offset + fields.module_offset;
  f.module = in.bytes(f.module_offset, fields.module_size, "module");
  if (metadata) {
    const Place public_place{"public metadata", int64_t(i), f.name};
    f.public_metadata = read_metadata(in, c, c.public_section, fields.public_offset, kPublicMetadata, public_place,
                                      fields.offsets_tag_at);
    f.public_offset = c.public_section.offset + fields.public_offset + 4;
    const Place private_place{"private metadata", int64_t(i), f.name};
    f.private_metadata = read_metadata(in, c, c.private_section, fields.private_offset, kPrivateMetadata, private_place,
                                       fields.offsets_tag_at);
    f.private_offset = c.private_section.offset + fields.private_offset + 4;
  }
  if (fields.has_reflection) {
    check_reflection_reference(c, where, fields.reflection_offset, fields.reflection_tag_at);
    f.reflection_offset = c.reflection_list.offset + fields.reflection_offset;
    f.reflection = in.bytes(f.reflection_offset, c.reflection_list.end() - f.reflection_offset, "reflection group");
  }
  return f;
}

}  // namespace

std::string describe_function(size_t index, std::string_view name) {
  return "function " + std::to_string(index) + " '" + std::string(name) + "'";
}

std::string_view function_bitcode(const Function& f, size_t index) {
  return unwrap_bitcode(f.module, f.module_offset, describe_function(index, f.name));
}

std::string_view function_reflection(const Container& container, const Function& f, size_t index) {
  if (f.reflection.empty()) return {};
  const Place where{"reflection-list group", int64_t(index), f.name};
  const ByteReader in(reinterpret_cast<const uint8_t*>(container.source.data()), container.source.size());
  const uint32_t size = load_le<uint32_t>(f.reflection, 0);
  if (size < 8 || size > f.reflection.size()) {
    throw FormatError(f.reflection_offset, where.describe() + " size",
                      "8 to " + std::to_string(f.reflection.size()) + " bytes (the rest of the reflection list)",
                      std::to_string(size));
  }
  read_tag_group(in, f.reflection_offset + 4, f.reflection_offset + size, where, [](const Tag&) {});
  return f.reflection.substr(0, size);
}

void verify_container(const Container& container) {
  for (size_t i = 0; i < container.functions.size(); ++i) {
    function_bitcode(container.functions[i], i);
    function_reflection(container, container.functions[i], i);
  }
}

Function read_function(const Container& container, size_t index) {
  if (container.functions_read) return container.functions.at(index);
  const FunctionEntry& entry = container.entries.at(index);
  const ByteReader in(reinterpret_cast<const uint8_t*>(container.source.data()), container.source.size());
  // The sections and the metadata convention, known since the load; unknown tags met here
  // are not kept (a full read records them).
  Container scratch;
  scratch.source = container.source;
  scratch.metadata_sizes = container.metadata_sizes;
  scratch.metadata_sizes_known = container.metadata_sizes_known;
  scratch.public_section = container.public_section;
  scratch.private_section = container.private_section;
  scratch.module_section = container.module_section;
  scratch.reflection_list = container.reflection_list;
  scratch.has_reflection_list = container.has_reflection_list;
  const uint64_t group_at = container.function_list.offset + entry.group_offset;
  const uint32_t group_size = in.read<uint32_t>(group_at, "function group size");
  return read_function_group(in, scratch, index, group_at, group_size, true);
}

Container read_container(const uint8_t* data, uint64_t size, ReadDepth depth) {
  const ByteReader in(data, size);
  Container c;
  c.source = in.bytes(0, size, "file");
  c.header = read_header(in);

  // Section table. The function list is a u32 count followed by `size` bytes of groups.
  const uint64_t list_offset = in.read<uint64_t>(24, "function list offset");
  const uint64_t list_size = in.read<uint64_t>(32, "function list size");
  const Region list_count = region_in_file(in, list_offset, 4, 24, "function list count");
  const Region list = region_in_file(in, list_count.end(), list_size, 24, "function list");
  const Region public_md = read_region(in, 40, "public metadata section");
  const Region private_md = read_region(in, 56, "private metadata section");
  const Region modules = read_region(in, 72, "module section");
  require_after(kHeaderSize, "header", list_count, 24, "function list");
  require_after(list.end(), "function list", public_md, 40, "public metadata section");
  require_after(public_md.end(), "public metadata section", private_md, 56, "private metadata section");
  require_after(private_md.end(), "private metadata section", modules, 72, "module section");
  c.gaps[0] = in.bytes(kHeaderSize, list_offset - kHeaderSize, "gap");
  c.gaps[1] = in.bytes(public_md.end(), private_md.offset - public_md.end(), "gap");
  c.gaps[2] = in.bytes(private_md.end(), modules.offset - private_md.end(), "gap");

  std::vector<std::pair<const Tag*, Region>> sections;
  if (list.end() < public_md.offset) {
    sections = read_extension(in, c, list.end(), public_md.offset, modules);
  }
  place_trailing_sections(in, c, sections, modules.end());
  Region reflection_list;
  bool has_reflection_list = false;
  for (const auto& [tag, region] : sections) {
    if (tag->code == kTagReflectionList) {
      reflection_list = region;
      has_reflection_list = true;
    }
  }

  // Entries keep 32-bit offsets into the list (8 bytes a function instead of 24).
  if (list.size > UINT32_MAX) {
    throw FormatError(32, "function list size", "at most 4 GiB (this reader's limit)", byte_count(list.size));
  }
  c.function_list = list;
  c.public_section = public_md;
  c.private_section = private_md;
  c.module_section = modules;
  c.reflection_list = reflection_list;
  c.has_reflection_list = has_reflection_list;

  const uint32_t count = in.read<uint32_t>(list_offset, "function count");
  if (count > list.size / 8) {
    throw FormatError(list_offset, "function count",
                      "at most " + std::to_string(list.size / 8) + " functions in a " + std::to_string(list.size) +
                          "-byte function list (8 bytes minimum each)",
                      std::to_string(count));
  }
  const bool full = depth == ReadDepth::kFull;
  c.functions_read = full;
  if (full) c.functions.reserve(count);
  c.entries.resize(count);
  c.index.reserve(count);
  // Module ranges in file order, kept only once one starts before the previous one ends
  // (MLX's are in order: nothing to keep).
  std::vector<std::pair<uint64_t, uint64_t>> modules_seen;
  bool in_order = true;
  uint64_t previous_end = 0;
  uint64_t at = list.offset;
  for (uint32_t i = 0; i < count; ++i) {
    if (at == list.end()) {
      throw FormatError(list_offset, "function count",
                        std::to_string(i) + " (the groups the " + byte_count(list.size) + " function list holds)",
                        std::to_string(count));
    }
    Place where{"function-list group", int64_t(i)};
    const uint32_t group_size = read_group_size(in, at, list.end(), where);
    uint64_t module_offset = 0, module_size = 0;
    ListFields fast;
    // The first function's metadata is read at either depth: it settles the file's
    // group-size convention.
    if (full || i == 0 || !read_list_group_fast(in.data(), at + 4, at + group_size, fast)) {
      Function f = read_function_group(in, c, i, at, group_size, full || i == 0);
      where.name = f.name;
      module_offset = f.module_offset;
      module_size = f.module.size();
      if (full)
        c.functions.push_back(std::move(f));
      else
        fast.name = f.name;
    } else {
      where.name = fast.name;
      check_module_range(c, where, fast.module_offset, fast.module_size, fast.offsets_tag_at);
      if (fast.has_reflection) check_reflection_reference(c, where, fast.reflection_offset, fast.reflection_tag_at);
      module_offset = modules.offset + fast.module_offset;
      module_size = fast.module_size;
    }
    c.entries[i] = {uint32_t(at - list.offset),
                    uint32_t(where.name.data() - reinterpret_cast<const char*>(data) - list.offset)};
    if (const int64_t earlier = c.index.insert(where.name, [&c](size_t k) { return c.name(k); }); earlier >= 0) {
      throw FormatError(at, where.describe() + " NAME", "unique function names",
                        "the same name as function " + std::to_string(earlier));
    }
    if (in_order && module_offset < previous_end) {
      in_order = false;
      modules_seen.reserve(count);
      for (uint32_t k = 0; k < i; ++k) {
        const Function earlier = read_function(c, k);
        modules_seen.emplace_back(earlier.module_offset, earlier.module.size());
      }
    }
    if (!in_order) modules_seen.emplace_back(module_offset, module_size);
    previous_end = module_offset + module_size;
    at += group_size;
  }
  if (at != list.end()) {
    throw FormatError(at, "function list size",
                      std::to_string(count) + " groups ending at byte " + std::to_string(list.end()) +
                          " (offset + 4 + size from the header)",
                      "groups ending at byte " + std::to_string(at));
  }
  if (!in_order) {
    check_modules_disjoint(modules_seen, [&](size_t k) { return describe_function(k, read_function(c, k).name); });
  }
  return c;
}

}  // namespace torch_metallib::metallib

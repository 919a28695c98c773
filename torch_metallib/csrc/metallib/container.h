// The in-memory model of a .metallib: what the reader produces and the writer consumes.
// Byte fields are string_views into storage the caller keeps alive (the loaded file, or
// the Python objects handed to the writer); nothing here owns file bytes.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "byte_reader.h"
#include "name_index.h"

namespace torch_metallib::metallib {

constexpr uint64_t kHeaderSize = 88;
constexpr uint32_t kMagic = 0x424c544d;  // "MTLB"

struct Tag {
  uint32_t code;
  std::string_view payload;
  uint64_t offset;  // where the tag starts in the source file (0 for new tags)
};

struct Header {
  uint16_t format_major = 1;  // bits 0-14 of the u16 at byte 4
  bool macos_target = true;   // bit 15 of the same u16
  uint16_t format_minor = 2;
  uint16_t format_patch = 7;
  uint8_t file_type = 0;    // 0 executable, 1 CoreImage, 2 dynamic, 3 symbol companion; bit 7 stub
  uint8_t platform = 0x81;  // Mach-O platform id; bit 7 = 64-bit
  uint16_t platform_major = 14;
  uint8_t platform_minor = 0;
  uint8_t platform_patch = 0;
};

struct Function {
  std::string_view name;  // without the trailing NUL
  uint8_t type = 2;       // TYPE tag: 2 = kernel
  // The function-list, public- and private-metadata tag groups, encoded as in the file
  // (tags then ENDT, without the u32 group size). The writer rewrites the computed tags
  // (HASH, OFFT, MDSZ, RFLT) of `tags`; the rest is copied byte for byte.
  std::string_view tags;
  std::string_view public_metadata;
  std::string_view private_metadata;
  uint64_t tags_offset = 0, public_offset = 0, private_offset = 0;  // file offsets of the above
  std::string_view module;                                          // wrapper + bitcode + padding: exactly MDSZ bytes
  // From the function's reflection-list group to the end of that list (empty if none).
  // The group's own size is read and validated when needed (writing, verifying), not at
  // load, so loading touches no page of the reflection list.
  std::string_view reflection;
  uint64_t reflection_offset = 0;  // absolute file offset of that group
  std::string_view hash;           // 32 bytes: SHA-256 of `module` (read, or set by the builder)
  uint64_t module_offset = 0;      // absolute file offset of `module` (0 for new functions)
};

// A section after the modules that a header-extension tag points to (RLST, HSRC, ...).
struct TrailingSection {
  uint32_t code;
  std::string_view gap_before;  // bytes between the previous section and this one
  std::string_view bytes;
};

// A tag the table does not know, reported to the user; its bytes are kept in place.
struct UnknownTag {
  std::string place;  // e.g. "function 'foo' public metadata"
  uint32_t code;
  uint64_t offset;
  uint64_t size;
};

// How the u32 before each public/private metadata group counts its bytes. Current
// toolchains count the u32 itself (a group holding only ENDT says 8); older ones (no RFLT,
// no RLST/UUID extension tags) do not (the same group says 4). Function-list groups count
// themselves in both. Read per file, and written back the same way.
enum class GroupSizeConvention : uint8_t { kCountsItself, kExcludesItself };

// A section of the file, located by read_container.
struct SectionRange {
  uint64_t offset = 0;
  uint64_t size = 0;
  uint64_t end() const { return offset + size; }
};

// Where one function's function-list group (its u32 size field, validated by the load)
// and its NAME payload lie, as offsets into the function list: all a load keeps per
// function. The name's length is its NAME tag's u16 length, just before it, less the NUL.
struct FunctionEntry {
  uint32_t group_offset = 0;
  uint32_t name_offset = 0;
};

struct Container {
  std::string_view source;  // the parsed input (empty for a built container)
  // Read at ReadDepth::kFunctionList: `functions` is empty and read_function(c, i) reads one.
  bool functions_read = true;
  std::vector<FunctionEntry> entries;  // per function, in file order (both depths)
  SectionRange function_list, public_section, private_section, module_section, reflection_list;
  bool has_reflection_list = false;
  Header header;
  GroupSizeConvention metadata_sizes = GroupSizeConvention::kCountsItself;
  bool metadata_sizes_known = false;  // set by the first metadata group the reader sees
  std::vector<Function> functions;
  bool has_extension = false;
  std::vector<Tag> extension;  // header-extension tags in file order
  // Bytes between sections that no field describes, kept so a round trip is exact:
  // [0] header..function list, [1] public..private metadata, [2] private metadata..modules.
  std::array<std::string_view, 3> gaps{};
  std::vector<TrailingSection> trailing;
  std::string_view tail;  // bytes after the last known section
  std::vector<UnknownTag> unknown_tags;
  NameIndex index;  // name -> position in `entries`
  // Bytes created for this container (new UUIDs, wrapped modules); views may point here.
  std::vector<std::unique_ptr<std::string>> owned;

  // Function i's name: from the file when read (entries), else from `functions`.
  std::string_view name(size_t i) const {
    if (entries.empty()) return functions[i].name;
    const char* at = source.data() + function_list.offset + entries[i].name_offset;
    return {at, size_t(load_le<uint16_t>(at - 2) - 1)};
  }
  int64_t find(std::string_view name) const {
    return index.find(name, [this](size_t k) { return this->name(k); });
  }

  std::string_view own(std::string bytes) {
    owned.push_back(std::make_unique<std::string>(std::move(bytes)));
    return *owned.back();
  }
};

}  // namespace torch_metallib::metallib

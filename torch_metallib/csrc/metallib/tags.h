// The tag table: one entry per known four-character tag, used by both the reader and
// the writer so they cannot drift. Tags not in the table are kept as raw bytes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace torch_metallib::metallib {

constexpr uint32_t fourcc(const char (&s)[5]) {
  return uint32_t(uint8_t(s[0])) | uint32_t(uint8_t(s[1])) << 8 | uint32_t(uint8_t(s[2])) << 16 |
         uint32_t(uint8_t(s[3])) << 24;
}

// Where a tag may appear. A table entry may allow several places.
enum TagPlace : uint8_t {
  kFunctionList = 1 << 0,     // per-function group in the function list
  kHeaderExtension = 1 << 1,  // the group between the function list and public metadata
  kPublicMetadata = 1 << 2,   // per-function group in the public metadata section
  kPrivateMetadata = 1 << 3,  // per-function group in the private metadata section
  kReflectionList = 1 << 4,   // per-function group in the reflection-list section
};

// What the payload means, so reader and writer agree on how to treat it.
enum class TagKind : uint8_t {
  kRaw,            // bytes kept as they are
  kName,           // NUL-terminated UTF-8 string, no interior NUL
  kFunctionType,   // u8
  kHash,           // 32-byte SHA-256 of the function's module bytes; recomputed on write
  kOffsets,        // 3 x u64 into public md, private md, module section; recomputed on write
  kModuleSize,     // u64 module size incl. wrapper and padding; recomputed on write
  kReflectionRef,  // u64 offset of the function's group in the reflection list; recomputed
  kVersions,       // 4 x u16: AIR major, minor, language major, minor
  kSectionRef,     // u64 offset, u64 size of a section after the modules; recomputed
  kUuid,           // 16 bytes
  kConstants,      // u16 count, then per constant: name\0, u8 type, u16 index, u8 required
};

constexpr int64_t kVariableSize = -1;

struct TagSpec {
  uint32_t code;
  const char* name;
  uint8_t places;  // TagPlace bits
  TagKind kind;
  int64_t fixed_size;  // payload size, or kVariableSize
  bool u32_length;     // payload length stored as u32 (else u16)
  const char* meaning;
};

// Entries in the tag table.
constexpr size_t kTagCount = 28;

// Sizes and meanings from docs/formats.md, container, checked against Apple-built files where the
// corpus has them (NAME..RFLT, RLST, UUID, CNST, RBUF); the others are kept raw.
inline constexpr TagSpec kTagTable[kTagCount] = {
    {fourcc("NAME"), "NAME", kFunctionList, TagKind::kName, kVariableSize, false, "function name"},
    {fourcc("TYPE"), "TYPE", kFunctionList, TagKind::kFunctionType, 1, false, "function type"},
    {fourcc("HASH"), "HASH", kFunctionList, TagKind::kHash, 32, false, "SHA-256 of the module"},
    {fourcc("OFFT"), "OFFT", kFunctionList, TagKind::kOffsets, 24, false, "section offsets"},
    {fourcc("VERS"), "VERS", kFunctionList, TagKind::kVersions, 8, false, "AIR/MSL versions"},
    {fourcc("MDSZ"), "MDSZ", kFunctionList, TagKind::kModuleSize, 8, false, "module size"},
    {fourcc("SOFF"), "SOFF", kFunctionList, TagKind::kRaw, 8, false, "source offset"},
    {fourcc("RFLT"), "RFLT", kFunctionList, TagKind::kReflectionRef, 8, false, "reflection offset"},
    {fourcc("TESS"), "TESS", kFunctionList, TagKind::kRaw, kVariableSize, false, "tessellation info"},
    {fourcc("LAYR"), "LAYR", kFunctionList, TagKind::kRaw, kVariableSize, false, "render target array index type"},
    {fourcc("RLST"), "RLST", kHeaderExtension, TagKind::kSectionRef, 16, false, "reflection list section"},
    {fourcc("HSRC"), "HSRC", kHeaderExtension, TagKind::kSectionRef, 16, false, "embedded source section"},
    {fourcc("HSRD"), "HSRD", kHeaderExtension, TagKind::kSectionRef, 16, false,
     "embedded source section with working dir"},
    {fourcc("HDYN"), "HDYN", kHeaderExtension, TagKind::kSectionRef, 16, false, "dynamic header section"},
    {fourcc("UUID"), "UUID", kHeaderExtension, TagKind::kUuid, 16, false, "library UUID"},
    {fourcc("SLST"), "SLST", kHeaderExtension, TagKind::kRaw, kVariableSize, false, "script list"},
    {fourcc("VLST"), "VLST", kHeaderExtension, TagKind::kRaw, kVariableSize, false, "variable list"},
    {fourcc("ILST"), "ILST", kHeaderExtension, TagKind::kRaw, kVariableSize, false, "imported symbol list"},
    {fourcc("CNST"), "CNST", kPublicMetadata, TagKind::kConstants, kVariableSize, false, "function constants"},
    {fourcc("VATT"), "VATT", kPublicMetadata, TagKind::kRaw, kVariableSize, false, "vertex attributes"},
    {fourcc("VATY"), "VATY", kPublicMetadata, TagKind::kRaw, kVariableSize, false, "vertex attribute types"},
    {fourcc("RETR"), "RETR", kPublicMetadata, TagKind::kRaw, kVariableSize, false, "return type"},
    {fourcc("ARGR"), "ARGR", kPublicMetadata, TagKind::kRaw, kVariableSize, false, "argument info"},
    {fourcc("DEBI"), "DEBI", kPrivateMetadata, TagKind::kRaw, kVariableSize, false, "debug info: u32 line + path"},
    {fourcc("DEPF"), "DEPF", kPrivateMetadata, TagKind::kRaw, kVariableSize, false, "dependency file path"},
    {fourcc("RBUF"), "RBUF", kReflectionList, TagKind::kRaw, kVariableSize, true, "reflection buffer"},
    {fourcc("SBUF"), "SBUF", kReflectionList, TagKind::kRaw, kVariableSize, true, "source buffer"},
    {fourcc("SARC"), "SARC", kReflectionList, TagKind::kRaw, kVariableSize, true, "source archive"},
};

// nullptr for a tag the table does not know. Linear, with the per-function tags first:
// a typical lookup ends within a few comparisons.
inline const TagSpec* find_tag(uint32_t code) {
  for (const TagSpec& spec : kTagTable) {
    if (spec.code == code) return &spec;
  }
  return nullptr;
}

// "NAME" for printable codes, else "0x4e414d45"-style hex.
std::string tag_name(uint32_t code);

constexpr uint32_t kEndTag = fourcc("ENDT");
constexpr uint32_t kTagName = fourcc("NAME");
constexpr uint32_t kTagType = fourcc("TYPE");
constexpr uint32_t kTagHash = fourcc("HASH");
constexpr uint32_t kTagOffsets = fourcc("OFFT");
constexpr uint32_t kTagVersions = fourcc("VERS");
constexpr uint32_t kTagModuleSize = fourcc("MDSZ");
constexpr uint32_t kTagReflection = fourcc("RFLT");
constexpr uint32_t kTagReflectionList = fourcc("RLST");
constexpr uint32_t kTagUuid = fourcc("UUID");
constexpr uint32_t kTagConstants = fourcc("CNST");

// Whether a tag's payload length is a u32 rather than a u16.
constexpr bool has_u32_length(uint32_t code) {
  return code == fourcc("RBUF") || code == fourcc("SBUF") || code == fourcc("SARC");
}

// has_u32_length spells the u32-length tags out for the reader's inner loop; this check
// keeps it in step with the table.
constexpr bool u32_lengths_match_table() {
  for (const TagSpec& spec : kTagTable) {
    if (spec.u32_length != has_u32_length(spec.code)) return false;
  }
  return true;
}
static_assert(u32_lengths_match_table(), "has_u32_length disagrees with kTagTable");

}  // namespace torch_metallib::metallib

// The tag table: one entry per known four-character tag, used by both the reader and
// the writer so they cannot drift. Tags not in the table are kept as raw bytes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace torch_metallib::metallib {

constexpr uint32_t fourcc(const char (&s)[5]) {
  return uint32_t(uint8_t(s[0])) | uint32_t(uint8_t(s[1])) << 8 |
         uint32_t(uint8_t(s[2])) << 16 | uint32_t(uint8_t(s[3])) << 24;
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
  uint8_t places;      // TagPlace bits
  TagKind kind;
  int64_t fixed_size;  // payload size, or kVariableSize
  bool u32_length;     // payload length stored as u32 (else u16)
  const char* meaning;
};

// nullptr for a tag the table does not know.
const TagSpec* find_tag(uint32_t code);

// Whether a tag's payload length is a u32 (RBUF, SBUF, SARC) rather than a u16.
bool has_u32_length(uint32_t code);

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

}  // namespace torch_metallib::metallib

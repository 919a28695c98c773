#include "tags.h"

#include <array>
#include <cstdio>

namespace torch_metallib::metallib {
namespace {

// Sizes and meanings from DESIGN.md §4.1, checked against Apple-built files where the
// corpus has them (NAME..RFLT, RLST, UUID, CNST, RBUF); the others are kept raw.
constexpr std::array<TagSpec, 28> kTags{{
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
    {fourcc("HSRD"), "HSRD", kHeaderExtension, TagKind::kSectionRef, 16, false, "embedded source section with working dir"},
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
}};

}  // namespace

const TagSpec* find_tag(uint32_t code) {
  for (const TagSpec& spec : kTags) {
    if (spec.code == code) return &spec;
  }
  return nullptr;
}

bool has_u32_length(uint32_t code) {
  const TagSpec* spec = find_tag(code);
  return spec != nullptr && spec->u32_length;
}

std::string tag_name(uint32_t code) {
  std::string name(4, '\0');
  for (int i = 0; i < 4; ++i) {
    const char c = char((code >> (8 * i)) & 0xff);
    if (c < 0x20 || c > 0x7e) {
      char hex[11];
      std::snprintf(hex, sizeof hex, "0x%08x", code);
      return hex;
    }
    name[i] = c;
  }
  return name;
}

}  // namespace torch_metallib::metallib

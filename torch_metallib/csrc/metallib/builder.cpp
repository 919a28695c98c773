#include "builder.h"

#include <stdexcept>

#include "byte_reader.h"
#include "module_wrapper.h"
#include "sha256.h"
#include "tag_group.h"
#include "tags.h"
#include "writer.h"

namespace torch_metallib::metallib {
namespace {

// The raw bitcode of `source`: LLVM itself wraps modules with Apple triples (as
// llvmlite's as_bitcode() does for AIR), so a wrapped input is unwrapped first.
std::string_view raw_bitcode(const FunctionSource& source, const std::string& where) {
  const std::string_view bitcode = source.bitcode;
  if (bitcode.size() >= 4 && load_le<uint32_t>(bitcode, 0) == kWrapperMagic) {
    try {
      return unwrap_bitcode(bitcode, 0, where);
    } catch (const FormatError& e) {
      throw std::invalid_argument(where + ": malformed Darwin bitcode wrapper: " + e.what());
    }
  }
  return bitcode;
}

void check_source(const FunctionSource& source, std::string_view bitcode, const std::string& where) {
  if (source.name.empty() || source.name.find('\0') != std::string::npos || source.name.size() > 0xfffe) {
    throw std::invalid_argument(where + ": name must be 1 to 65534 bytes without NUL");
  }
  if (bitcode.size() < 4 || bitcode.substr(0, 4) != std::string_view("BC\xC0\xDE", 4)) {
    throw std::invalid_argument(where +
                                ": bitcode must start with the LLVM bitcode magic "
                                "'BC' 0xC0DE (raw bitcode, e.g. llvmlite's "
                                "module.as_bitcode(), not text IR or a wrapped module)");
  }
  if (bitcode.size() > 0xffffffffull - kWrapperSize - kModuleAlignment) {
    throw std::invalid_argument(where + ": bitcode larger than 4 GiB cannot be wrapped");
  }
}

}  // namespace

Container build_container(const Header& header, const std::vector<FunctionSource>& sources, const Sha256& sha256) {
  Container c;
  c.header = header;
  c.index.reserve(sources.size());
  for (size_t i = 0; i < sources.size(); ++i) {
    const FunctionSource& source = sources[i];
    const std::string where = "function " + std::to_string(i) + " '" + source.name + "'";
    const std::string_view bitcode = raw_bitcode(source, where);
    check_source(source, bitcode, where);
    Function f;
    f.type = source.type;
    f.name = c.own(source.name);
    if (const int64_t earlier = c.index.insert(f.name, [&c](size_t k) { return c.functions[k].name; }); earlier >= 0) {
      throw std::invalid_argument("function " + std::to_string(i) + " '" + source.name +
                                  "': duplicate name (also function " + std::to_string(earlier) + ")");
    }
    f.module = c.own(wrap_bitcode(bitcode));
    const std::array<uint8_t, 32> digest = sha256(f.module);
    f.hash = c.own(std::string(digest.begin(), digest.end()));
    std::string versions;
    for (uint16_t v : source.versions) put_le<uint16_t>(versions, v);
    const std::string_view zeros8 = c.own(std::string(8, '\0'));
    // OFFT and MDSZ are placeholders the writer fills from the layout; HASH comes from f.hash.
    f.tags = c.own(encode_tag_group({
        {kTagName, c.own(source.name + '\0'), 0},
        {kTagType, c.own(std::string(1, char(source.type))), 0},
        {kTagHash, f.hash, 0},
        {kTagOffsets, c.own(std::string(24, '\0')), 0},
        {kTagVersions, c.own(versions), 0},
        {kTagModuleSize, zeros8, 0},
    }));
    f.public_metadata = f.private_metadata = c.own(encode_tag_group({}));
    if (!source.constants.empty()) {
      const std::string constants = encode_constants(source.constants);
      if (constants.size() > 0xffff) {
        throw std::invalid_argument(where + ": function constants take " + std::to_string(constants.size()) +
                                    " bytes; the CNST tag holds at most 65535");
      }
      f.public_metadata = c.own(encode_tag_group({{kTagConstants, constants, 0}}));
    }
    c.functions.push_back(std::move(f));
  }
  c.has_extension = true;
  const std::array<uint8_t, 16> uuid = content_uuid(c, sha256);
  c.extension.push_back({kTagUuid, c.own(std::string(uuid.begin(), uuid.end())), 0});
  return c;
}

}  // namespace torch_metallib::metallib

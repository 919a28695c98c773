#include "function_constants.h"

#include "byte_reader.h"
#include "tag_group.h"

namespace torch_metallib::metallib {

std::vector<FunctionConstant> decode_constants(std::string_view payload, uint64_t offset, const std::string& function) {
  const std::string field = function + " CNST";
  const uint64_t payload_offset = offset + 6;  // code + u16 length
  if (payload.size() < 2) {
    throw FormatError(payload_offset, field + " count", "2 bytes", std::to_string(payload.size()));
  }
  const uint16_t count = load_le<uint16_t>(payload, 0);
  std::vector<FunctionConstant> constants;
  constants.reserve(count);
  size_t at = 2;
  for (uint16_t i = 0; i < count; ++i) {
    const size_t nul = payload.find('\0', at);
    if (nul == std::string_view::npos || payload.size() - nul - 1 < 4) {
      throw FormatError(payload_offset + at, field + " constant " + std::to_string(i),
                        "a NUL-terminated name followed by 4 bytes (type, index, required)",
                        "the payload ends after " + std::to_string(payload.size() - at) + " bytes");
    }
    FunctionConstant constant;
    constant.name = std::string(payload.substr(at, nul - at));
    constant.type = uint8_t(payload[nul + 1]);
    constant.index = load_le<uint16_t>(payload, nul + 2);
    constant.required = payload[nul + 4] != 0;
    constants.push_back(std::move(constant));
    at = nul + 5;
  }
  if (at != payload.size()) {
    throw FormatError(payload_offset + at, field,
                      std::to_string(count) + " constants filling " + std::to_string(payload.size()) + " bytes",
                      std::to_string(payload.size() - at) + " bytes left over");
  }
  return constants;
}

std::string encode_constants(const std::vector<FunctionConstant>& constants) {
  std::string out;
  put_le<uint16_t>(out, static_cast<uint16_t>(constants.size()));
  for (const FunctionConstant& constant : constants) {
    out.append(constant.name);
    out.push_back('\0');
    out.push_back(char(constant.type));
    put_le<uint16_t>(out, constant.index);
    out.push_back(constant.required ? 1 : 0);
  }
  return out;
}

}  // namespace torch_metallib::metallib

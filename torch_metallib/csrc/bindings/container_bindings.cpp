#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>

#include "bindings.h"
#include "metallib/builder.h"
#include "metallib/byte_reader.h"
#include "metallib/function_constants.h"
#include "metallib/reader.h"
#include "metallib/tag_group.h"
#include "metallib/tags.h"
#include "metallib/writer.h"

namespace py = pybind11;
using namespace torch_metallib::metallib;

namespace torch_metallib::bindings {
namespace {

// A parsed container plus the exported Python buffer its views point into. Loading reads
// the function list only (ReadDepth::kFunctionList); writing, verifying and the unknown-tag
// report read the whole file once, on first need (full()).
class LoadedContainer {
 public:
  explicit LoadedContainer(const py::buffer& source) : buffer_(std::make_unique<py::buffer_info>(source.request())) {
    if (buffer_->itemsize != 1 || buffer_->ndim != 1 || (buffer_->ndim == 1 && buffer_->strides[0] != 1)) {
      throw py::type_error(
          "torch_metallib.load: expected a contiguous byte buffer (bytes, "
          "bytearray, mmap or a C-contiguous memoryview of bytes); got itemsize " +
          std::to_string(buffer_->itemsize) + ", " + std::to_string(buffer_->ndim) + " dimension(s)");
    }
    const auto* data = static_cast<const uint8_t*>(buffer_->ptr);
    const uint64_t size = static_cast<uint64_t>(buffer_->size);
    py::gil_scoped_release unlocked;
    container_ = read_container(data, size, ReadDepth::kFunctionList);
  }

  // The function list, names and sections (functions read one at a time: function()).
  const Container& container() const { return container_; }
  Function function(size_t i) const {
    if (i >= container_.entries.size()) throw py::index_error("function index out of range");
    return read_function(container_, i);
  }
  // Every function with its metadata, unknown tags recorded. Read once, with the GIL held
  // throughout: that is what makes a second thread wait instead of reading it again.
  const Container& full() const {
    if (!full_) {
      full_ = std::make_unique<Container>(read_container(static_cast<const uint8_t*>(buffer_->ptr),
                                                         static_cast<uint64_t>(buffer_->size), ReadDepth::kFull));
    }
    return *full_;
  }
  uint64_t address() const { return reinterpret_cast<uintptr_t>(buffer_->ptr); }

 private:
  std::unique_ptr<py::buffer_info> buffer_;  // declared first: destroyed after the containers
  Container container_;
  mutable std::unique_ptr<Container> full_;
};

py::bytes to_py(std::string_view bytes) { return py::bytes(bytes.data(), bytes.size()); }

py::str name_to_py(std::string_view name) {
  // Names are bytes in the file; surrogateescape keeps any non-UTF-8 byte round-trippable.
  PyObject* text = PyUnicode_DecodeUTF8(name.data(), Py_ssize_t(name.size()), "surrogateescape");
  if (text == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(text);
}

py::list tag_list(const std::vector<Tag>& tags) {
  py::list out;
  for (const Tag& tag : tags) {
    out.append(py::make_tuple(tag_name(tag.code), tag.offset, to_py(tag.payload)));
  }
  return out;
}

py::list constants_list(const std::vector<FunctionConstant>& constants) {
  py::list out;
  for (const FunctionConstant& c : constants) {
    out.append(py::make_tuple(name_to_py(c.name), c.type, c.index, c.required));
  }
  return out;
}

// Everything Python shows about one function, gathered in one call.
py::dict function_record(const LoadedContainer& self, size_t i) {
  const Function f = self.function(i);
  py::dict record;
  record["name"] = name_to_py(f.name);
  record["type"] = f.type;
  record["hash"] = to_py(f.hash);
  record["module_offset"] = f.module_offset;
  record["module_size"] = f.module.size();
  const std::vector<Tag> tags = decode_tags(f.tags, f.tags_offset);
  const std::vector<Tag> public_metadata = decode_tags(f.public_metadata, f.public_offset);
  record["tags"] = tag_list(tags);
  record["public_metadata"] = tag_list(public_metadata);
  record["private_metadata"] = tag_list(decode_tags(f.private_metadata, f.private_offset));
  py::object versions = py::none();
  std::vector<FunctionConstant> constants;
  for (const Tag& tag : tags) {
    if (tag.code == kTagVersions) {
      versions = py::make_tuple(load_le<uint16_t>(tag.payload, 0), load_le<uint16_t>(tag.payload, 2),
                                load_le<uint16_t>(tag.payload, 4), load_le<uint16_t>(tag.payload, 6));
    }
  }
  for (const Tag& tag : public_metadata) {
    if (tag.code == kTagConstants) {
      constants = decode_constants(tag.payload, tag.offset, describe_function(i, f.name));
    }
  }
  record["versions"] = versions;
  record["constants"] = constants_list(constants);
  return record;
}

py::bytes write_bytes(const Container& c) {
  std::string out;
  {
    py::gil_scoped_release unlocked;
    out = write_container(c);
  }
  return py::bytes(out.data(), out.size());
}

Header header_from(const py::dict& h) {
  Header header;
  const auto format = h["format_version"].cast<std::array<uint16_t, 3>>();
  header.format_major = format[0];
  header.format_minor = format[1];
  header.format_patch = format[2];
  header.macos_target = h["macos_target"].cast<bool>();
  header.file_type = h["file_type"].cast<uint8_t>();
  header.platform = h["platform"].cast<uint8_t>();
  const auto version = h["platform_version"].cast<std::array<uint16_t, 3>>();
  header.platform_major = version[0];
  header.platform_minor = uint8_t(version[1]);
  header.platform_patch = uint8_t(version[2]);
  return header;
}

}  // namespace

// SHA-256 by Python's hashlib (OpenSSL); called with the GIL held (pack, subset). The
// function object is never released: no destructor runs after the interpreter is gone.
static std::array<uint8_t, 32> hashlib_sha256(std::string_view bytes) {
  static const py::object* sha256 = new py::object(py::module_::import("hashlib").attr("sha256"));
  const std::string digest = (*sha256)(py::bytes(bytes.data(), bytes.size())).attr("digest")().cast<std::string>();
  std::array<uint8_t, 32> out{};
  std::copy(digest.begin(), digest.end(), out.begin());
  return out;
}

void bind_container(py::module_& m) {
  py::class_<LoadedContainer>(m, "Container", "A parsed .metallib over a caller-owned buffer (zero-copy).")
      .def(py::init<const py::buffer&>(), py::arg("source"))
      .def("__len__", [](const LoadedContainer& s) { return s.container().entries.size(); })
      .def_property_readonly(
          "header",
          [](const LoadedContainer& s) {
            const Header& h = s.container().header;
            py::dict d;
            d["format_version"] = py::make_tuple(h.format_major, h.format_minor, h.format_patch);
            d["macos_target"] = h.macos_target;
            d["file_type"] = h.file_type;
            d["platform"] = h.platform;
            d["platform_version"] = py::make_tuple(h.platform_major, h.platform_minor, h.platform_patch);
            d["group_sizes_count_themselves"] = s.container().metadata_sizes == GroupSizeConvention::kCountsItself;
            return d;
          })
      .def("names",
           [](const LoadedContainer& s) {
             const Container& c = s.container();
             py::tuple out(c.entries.size());
             for (size_t i = 0; i < c.entries.size(); ++i) out[i] = name_to_py(c.name(i));
             return out;
           })
      .def("index_of",
           [](const LoadedContainer& s, const py::bytes& name) -> int64_t {
             const std::string_view key(name);
             return s.container().find(key);
           })
      .def("function", &function_record, py::arg("index"))
      .def(
          "bitcode_range",
          [](const LoadedContainer& s, size_t i) {
            const std::string_view bitcode = function_bitcode(s.function(i), i);
            return py::make_tuple(uint64_t(reinterpret_cast<uintptr_t>(bitcode.data()) - s.address()), bitcode.size());
          },
          "(offset, size) of the function's LLVM bitcode in the buffer, after validating its wrapper")
      .def_property_readonly("extension",
                             [](const LoadedContainer& s) -> py::object {
                               const Container& c = s.container();
                               if (!c.has_extension) return py::none();
                               return tag_list(c.extension);
                             })
      .def_property_readonly(
          "trailing_sections",
          [](const LoadedContainer& s) {
            py::list out;
            for (const TrailingSection& section : s.container().trailing) {
              out.append(py::make_tuple(tag_name(section.code),
                                        uint64_t(reinterpret_cast<uintptr_t>(section.bytes.data()) - s.address()),
                                        section.bytes.size()));
            }
            return out;
          })
      .def_property_readonly(
          "unknown_tags",
          [](const LoadedContainer& s) {
            py::list out;
            for (const UnknownTag& tag : s.full().unknown_tags) {
              out.append(py::make_tuple(name_to_py(tag.place), tag_name(tag.code), tag.offset, tag.size));
            }
            return out;
          })
      .def(
          "module_hashes",
          [](const LoadedContainer& s) {
            const Container& c = s.full();
            py::list out;
            for (size_t i = 0; i < c.functions.size(); ++i) {
              const Function& f = c.functions[i];
              out.append(py::make_tuple(f.module_offset, f.module.size(), py::bytes(f.hash.data(), f.hash.size())));
            }
            return out;
          },
          "[(module offset, module size, HASH bytes)] per function, for checking every HASH at once")
      .def("to_bytes", [](const LoadedContainer& s) { return write_bytes(s.full()); })
      .def(
          "verify",
          [](const LoadedContainer& s) {
            const Container& c = s.full();
            py::gil_scoped_release unlocked;
            verify_container(c);
          },
          "Validates every module wrapper and reflection group (HASHes: Library.verify).")
      .def(
          "subset",
          [](const LoadedContainer& s, const std::vector<size_t>& indices) {
            const Container& c = s.full();
            for (size_t i : indices) {
              if (i >= c.functions.size()) throw py::index_error("function index out of range");
            }
            return write_bytes(select_functions(c, indices, hashlib_sha256));
          },
          py::arg("indices"));

  m.def(
      "pack",
      [](const py::dict& header, const py::list& functions) {
        std::vector<FunctionSource> sources;
        for (const py::handle item : functions) {
          const py::dict spec = py::reinterpret_borrow<py::dict>(item);
          FunctionSource source;
          source.name = spec["name"].cast<std::string>();
          source.type = spec["type"].cast<uint8_t>();
          source.bitcode = spec["bitcode"].cast<std::string>();
          source.versions = spec["versions"].cast<std::array<uint16_t, 4>>();
          for (const py::handle c : spec["constants"]) {
            const auto t = c.cast<std::tuple<std::string, uint8_t, uint16_t, bool>>();
            source.constants.push_back({std::get<0>(t), std::get<1>(t), std::get<2>(t), std::get<3>(t)});
          }
          sources.push_back(std::move(source));
        }
        return write_bytes(build_container(header_from(header), sources, hashlib_sha256));
      },
      py::arg("header"), py::arg("functions"),
      "Serializes new functions (dicts of name, type, bitcode, versions, constants).");
}

}  // namespace torch_metallib::bindings

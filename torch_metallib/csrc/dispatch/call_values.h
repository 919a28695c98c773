// A kernel call's arguments as plain native values, before the binding plan checks them:
// csrc/bindings reads them from a Python call, csrc/ops from an operator's stack. Nothing
// here knows Python; how a caller wrote a value comes along as a function, asked only to
// word a refusal.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/SmallVector.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dispatch/numbers.h"

namespace torch_metallib::dispatch {

struct CallValue {
  enum class Kind {
    Missing,  // not given, or None
    Tensor,
    Number,
    Sequence,  // a list or tuple: `items`
    Bytes,     // bytes, a bytearray or a contiguous memoryview: `bytes`
    Mapping,   // a dict (an argument buffer's members by name): `items`, each with its `key`
    Array,     // an array with dimensions that is not a tensor (numpy's)
    Strided,   // a memoryview that is not contiguous
    Other,     // anything else
  };
  Kind kind = Kind::Missing;
  at::Tensor tensor;
  Number number;
  std::vector<CallValue> items;
  std::string key;                               // an item of a Mapping: its name
  std::shared_ptr<std::vector<uint64_t>> bytes;  // 8-aligned copy
  int64_t byte_count = 0;
  std::string type_name;              // the caller's type, for messages ("str", "list", ...)
  std::function<std::string()> text;  // how the caller wrote it (repr, cut short), for messages

  static CallValue of(const at::Tensor& tensor) {
    CallValue value;
    value.kind = Kind::Tensor;
    value.tensor = tensor;
    return value;
  }
  static CallValue of(const Number& number) {
    CallValue value;
    value.kind = Kind::Number;
    value.number = number;
    return value;
  }
  bool given() const { return kind != Kind::Missing; }
  std::string written() const { return text ? text() : kind == Kind::Number ? number_text(number) : type_name; }
};

// Where a call comes from: the words of some refusals differ.
enum class CallOrigin { Python, Operator };

struct CallArguments {
  CallOrigin origin = CallOrigin::Python;
  // Python: by binding-index order of the bindable arguments (then `named`);
  // Operator: by IR parameter position.
  c10::SmallVector<CallValue, 8> positional;
  std::vector<std::pair<std::string, CallValue>> named;
  c10::SmallVector<int64_t, 3> threads;                     // 1-3 extents; empty: the first tensor's numel
  c10::SmallVector<int64_t, 3> group;                       // empty: the default
  std::vector<std::pair<size_t, Number>> constants;         // (index into KernelSpec::constants(), value)
  std::vector<std::pair<int, int64_t>> threadgroup_memory;  // ([[threadgroup(i)]] index, bytes)
  std::vector<std::string> storage_bounds;                  // argument names (checked execution)
};

}  // namespace torch_metallib::dispatch

// The binding plan: a kernel call's Python arguments, checked against the kernel's
// reflected signature and turned into what every backend consumes: one address per IR
// parameter, packed bytes for values, the grid and threadgroup size, and the function
// constant values. Nothing is launched while a plan is built, so a refused call writes
// nothing (DESIGN.md §5).
#pragma once

#include <pybind11/pybind11.h>

#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "dispatch/metal_types.h"

namespace torch_metallib::dispatch {

// Raised as torch_metallib.KernelArgumentError (a TypeError) / DispatchError (ValueError).
struct ArgumentError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct DispatchFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// One bindable kernel argument (everything but builtins), from reflection.
struct ArgumentSpec {
  std::string name;
  int position = 0;             // IR parameter index
  std::string kind;             // "buffer", "threadgroup", "texture", ...
  int binding = 0;
  std::string address_space;    // "device", "constant", "threadgroup"
  std::string access;           // "read", "write", "read_write"
  std::string type_name;
  int64_t type_size = 0;
  int64_t buffer_size = -1;     // bytes of a reference, -1 for pointers
  std::string guard;            // function constant that must be true for it to exist
  bool unused = false;
  const MetalType* type = nullptr;  // nullptr for structs and other non-scalar types
  bool writable() const { return access != "read"; }
  std::string describe() const;     // "argument 2 'c' (buffer(2), device float*)"
};

struct ConstantSpec {
  std::string name;
  std::string type_name;
  int index = 0;
  bool required = true;
  const MetalType* type = nullptr;
};

struct ConstantValue {
  int index;
  bool is_float;
  int64_t integer;
  double real;
};

// What a call binds: the backend-neutral plan.
struct Plan {
  std::vector<void*> addresses;             // per IR parameter; nullptr for builtins/unbound
  std::vector<std::shared_ptr<std::vector<uint64_t>>> packed;  // owned bytes, 8-aligned
  uint32_t dims[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};  // grid xyz, group xyz, groups xyz
  uint64_t group_count = 1;
  std::vector<ConstantValue> constants;     // by index, every declared constant that is set
  // Threadgroup-memory arguments: (IR parameter, bytes), allocated per threadgroup by the backend.
  std::vector<std::pair<int, int64_t>> threadgroup_buffers;
  c10::Device device = c10::Device(c10::kCPU);
};

class KernelSpec {
 public:
  KernelSpec(std::string name, int parameter_count, std::vector<ArgumentSpec> arguments,
             std::vector<ConstantSpec> constants, int64_t max_threads, int64_t static_threadgroup_bytes);

  // Validates a call and builds its plan. Raises ArgumentError / DispatchFailure.
  Plan bind(const pybind11::tuple& args, const pybind11::dict& kwargs, const pybind11::handle& threads,
            const pybind11::handle& group_size, const pybind11::handle& constants,
            const pybind11::handle& threadgroup_memory) const;

  const std::string& name() const { return name_; }

 private:
  std::vector<ConstantValue> bind_constants(const pybind11::handle& values) const;
  void bind_value(Plan& plan, const ArgumentSpec& argument, const pybind11::handle& value,
                  bool& device_seen) const;
  void bind_threadgroup_memory(Plan& plan, const pybind11::handle& sizes) const;
  void bind_grid(Plan& plan, const pybind11::handle& threads, const pybind11::handle& group_size,
                 int64_t default_threads) const;

  std::string name_;
  int parameter_count_;
  std::vector<ArgumentSpec> arguments_;  // sorted by (kind, binding)
  std::vector<ConstantSpec> constants_;
  int64_t max_threads_;
  int64_t static_threadgroup_bytes_;  // threadgroup variables the kernel declares itself
};

}  // namespace torch_metallib::dispatch

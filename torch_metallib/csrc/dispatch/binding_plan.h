// The binding plan: a kernel call's arguments (call_values.h), checked against the kernel's
// reflected signature and turned into what every backend consumes: one address per IR
// parameter, packed bytes for values, the grid and threadgroup size, and the function
// constant values. Nothing is launched while a plan is built, so a refused call writes
// nothing (ARCHITECTURE.md, "Rules").
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/FunctionRef.h>
#include <c10/util/SmallVector.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "dispatch/call_values.h"
#include "dispatch/constant_predicate.h"
#include "dispatch/metal_types.h"
#include "dispatch/numbers.h"

namespace torch_metallib::dispatch {

// Raised as torch_metallib.KernelArgumentError (a TypeError) / DispatchError (ValueError).
struct ArgumentError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct DispatchFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// Raised as torch_metallib.UnsupportedKernelError: the call needs what no backend binds yet.
struct UnsupportedCall : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct ArgumentSpec;

// One member of an argument buffer (a struct argument whose members carry [[id(n)]]).
struct MemberSpec {
  std::string name;  // the member's name in the struct
  int id = 0;
  bool pointer = true;                    // device/constant T* (`count` of them); else a value of `element`'s type
  int64_t offset = 0;                     // byte offset in the struct
  int64_t count = 1;                      // pointers in an array member
  std::shared_ptr<ArgumentSpec> element;  // name, type, access, address space (for checks and messages)
};

// What reflection says an argument is bound as. Other: textures, samplers and the rest
// the plan does not bind (ArgumentSpec::kind_name says which).
enum class ArgumentKind { Buffer, IndirectBuffer, Threadgroup, Other };
enum class Access { Read, Write, ReadWrite };

// Reflection's words for them ("buffer", "indirect_buffer", "threadgroup", ...; "read",
// "write", "read_write").
ArgumentKind argument_kind(const std::string& name);
Access access_of(const std::string& name);

// One bindable kernel argument (everything but builtins), from reflection.
struct ArgumentSpec {
  std::string name;
  int position = 0;  // IR parameter index
  ArgumentKind kind = ArgumentKind::Buffer;
  std::string kind_name;  // reflection's word for it: "buffer", "texture", ...
  int binding = 0;
  std::string address_space;  // "device", "constant", "threadgroup"
  Access access = Access::Read;
  std::string type_name;
  int64_t type_size = 0;
  int64_t buffer_size = -1;  // bytes of a reference, -1 for pointers
  std::string guard;         // function constant (or predicate derived from them) that must be
                             // true for it to exist
  bool unused = false;
  const MetalType* type = nullptr;  // nullptr for structs and other non-scalar types
  std::vector<MemberSpec> members;  // IndirectBuffer: the argument buffer's members, by id
  // An IndirectBuffer that holds one pointer at its start (Mojo's pointer arguments): a
  // tensor binds as its address, in an 8-byte argument buffer of one pointer member.
  bool holds_pointer = false;
  std::string description;  // set for argument-buffer members: what describe() says
  bool writable() const { return access != Access::Read; }
  bool buffer_slot() const { return kind == ArgumentKind::Buffer || kind == ArgumentKind::IndirectBuffer; }
  std::string describe() const;  // "argument 2 'c' (buffer(2), device float*)"
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
  const MetalType* type = nullptr;  // its declared type (scalar)
  uint8_t bytes[8] = {};            // the value packed as that type, as Metal is given it
};

// The bytes checked execution lets a kernel reach through one argument, relative to the
// address it is bound at: a tensor's view (what its sizes and strides reach; a zero-element
// view reaches nothing), or its whole storage where the caller asked (storage_bounds); the
// bytes of a value. Users pass slices, and a slice's neighbours are other slices.
struct Span {
  int64_t begin = 0;  // below 0 where the memory starts before the bound address
  int64_t bytes = 0;
  bool storage = false;  // the tensor's storage, not its view
};

// [first, last] element a view reaches (negative strides reach below its first element).
Span view_span(const at::Tensor& tensor);
// The tensor's whole storage.
Span storage_span(const at::Tensor& tensor);

// Empty if no two indices of `tensor` reach one element (torch's notion); else why a kernel
// may not write to it, as "expected ..., got .... <remedy>".
std::string overlap_refusal(const at::Tensor& tensor);

// A pointer inside an argument buffer: where it sits and the tensor it points into.
struct ArgumentBufferSlot {
  int64_t offset = 0;     // byte offset of the 8-byte pointer in the struct
  at::Tensor tensor;      // bound at its data_ptr() (storage offset included)
  bool writable = false;  // the kernel may write through it
};

// An argument buffer: the struct's bytes (pointers already hold host addresses, which the
// CPU backend uses as they are) and its pointer slots, which a GPU backend re-encodes with
// its own addresses and makes resident.
struct ArgumentBuffer {
  int position = 0;  // IR parameter
  int binding = 0;   // [[buffer(n)]]
  std::shared_ptr<std::vector<uint64_t>> bytes;
  std::vector<ArgumentBufferSlot> slots;
};

// How one IR parameter is bound, for the command list (command_list.h).
struct ParameterBinding {
  enum class Kind { None, Tensor, Bytes, Threadgroup, ArgumentBuffer } kind = Kind::None;
  int index = 0;      // the Metal binding index
  at::Tensor tensor;  // Kind::Tensor
  bool writable = false;
};

struct CommandList;

// What a call binds: the backend-neutral plan.
struct Plan {
  std::vector<void*> addresses;            // per IR parameter; nullptr for builtins/unbound
  std::vector<ParameterBinding> bindings;  // per IR parameter
  std::vector<int64_t> extents;            // per IR parameter: bytes reachable from its address
  // Per IR parameter: the call named it in storage_bounds (empty when it named none).
  std::vector<bool> storage_bounds;
  std::vector<std::shared_ptr<std::vector<uint64_t>>> packed;  // owned bytes, 8-aligned
  uint32_t dims[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};              // grid xyz, group xyz, groups xyz
  uint64_t group_count = 1;
  std::vector<ConstantValue> constants;  // by index, every declared constant that is set
  // Threadgroup-memory arguments: (IR parameter, bytes), allocated per threadgroup by the backend.
  std::vector<std::pair<int, int64_t>> threadgroup_buffers;
  std::vector<ArgumentBuffer> argument_buffers;
  c10::Device device = c10::Device(c10::kCPU);
  std::shared_ptr<const CommandList> commands;  // built last; `addresses` are read from it

  // What checked execution allows through IR parameter `position` (worked out only when a
  // call runs checked): a tensor's view or, named in storage_bounds, its storage; else the
  // bytes bound. An argument buffer's pointers: storage_bounded(its position) says which.
  Span span(int position) const;
  bool storage_bounded(int position) const;
};

// Bytes from the tensor's first element to the end of its storage (what a kernel may reach).
int64_t available_bytes(const at::Tensor& tensor);

class KernelSpec {
 public:
  // `predicates`: guards derived from the constants (name -> expression; an argument
  // whose guard is neither a constant nor listed here is always bound).
  KernelSpec(std::string name, int parameter_count, std::vector<ArgumentSpec> arguments,
             std::vector<ConstantSpec> constants, int64_t max_threads, int64_t static_threadgroup_bytes,
             std::vector<std::pair<std::string, ConstantPredicate>> predicates = {});

  // Validates a call and builds its plan (kernel calls and operators alike). Raises
  // ArgumentError / DispatchFailure / UnsupportedCall; nothing runs if it does.
  Plan bind(const CallArguments& call) const;

  // A plan with only the pipeline key (function and checked constant values) in its
  // command list: what a GPU backend needs to build and inspect the pipeline.
  Plan pipeline_plan(const std::vector<std::pair<size_t, Number>>& constants) const;

  const std::string& name() const { return name_; }
  int parameter_count() const { return parameter_count_; }
  const std::vector<ArgumentSpec>& arguments() const { return arguments_; }
  const std::vector<ConstantSpec>& constants() const { return constants_; }

 private:
  // Checks typed constant values (index into constants_, value) and that every required
  // one is set; returns them sorted by constant index.
  std::vector<ConstantValue> check_constants(const std::vector<std::pair<size_t, Number>>& values) const;
  bool guard_on(const ArgumentSpec& argument, const std::vector<ConstantValue>& constants) const;
  // Why `argument` is left out with these constants, for messages.
  std::string left_out_because(const ArgumentSpec& argument) const;
  // Refuses the call when an argument of a kind no backend binds yet is present.
  void refuse_unbindable(const std::vector<ConstantValue>& constants) const;
  // The argument called `name`, else ArgumentError naming every argument (`context` leads the message).
  const ArgumentSpec& named_argument(const std::string& name, const std::string& context) const;
  // The call's value per argument (index into arguments_), by position and by name.
  c10::SmallVector<const CallValue*, 16> assign(const CallArguments& call,
                                                const std::vector<ConstantValue>& constants) const;
  void bind_value(Plan& plan, const ArgumentSpec& argument, const CallValue& value, CallOrigin origin,
                  bool& device_seen) const;
  void bind_numbers(Plan& plan, const ArgumentSpec& argument, const CallValue& value) const;
  void bind_tensor(Plan& plan, const ArgumentSpec& argument, const at::Tensor& tensor, bool& device_seen) const;
  void check_layout(const ArgumentSpec& argument, const at::Tensor& tensor) const;
  void check_device(Plan& plan, const ArgumentSpec& argument, const at::Tensor& tensor, bool& device_seen) const;
  // Dtype and size checks of a tensor bound by pointer (after check_layout and check_device).
  void check_tensor(const ArgumentSpec& argument, const at::Tensor& tensor) const;
  // Refuses a written tensor in which two indices reach one element (an expanded view), as
  // torch refuses in-place writes into one: which write would land is undefined.
  void refuse_overlap(const ArgumentSpec& argument, const at::Tensor& tensor) const;
  // Marks the arguments named in `names` as bounded by their storage (Plan::span).
  void allow_storage(Plan& plan, const std::vector<std::string>& names) const;
  void bind_argument_buffer(Plan& plan, const ArgumentSpec& argument, const CallValue& value, bool& device_seen) const;
  void bind_number(Plan& plan, const ArgumentSpec& argument, const Number& number) const;
  // An argument left out (guard false, or unused and not given): zeros of its size.
  void bind_absent(Plan& plan, const ArgumentSpec& argument) const;
  // `source` words the value for the error message, only when there is one.
  void bind_bytes(Plan& plan, const ArgumentSpec& argument, std::shared_ptr<std::vector<uint64_t>> storage,
                  int64_t bytes, c10::function_ref<std::string()> source) const;
  void bind_threadgroup_memory(Plan& plan, const std::vector<std::pair<int, int64_t>>& sizes) const;
  // `grid` 1-3 extents; `group` 0-3 (none: the default).
  void bind_grid(Plan& plan, c10::ArrayRef<int64_t> grid, c10::ArrayRef<int64_t> group) const;
  // Refuses used arguments given empty tensors when the grid has threads.
  void refuse_empty(const Plan& plan, const std::vector<const ArgumentSpec*>& empty) const;
  // Builds the plan's command list and takes the CPU's addresses from it.
  void finish(Plan& plan) const;

  std::string name_;
  int parameter_count_;
  std::vector<ArgumentSpec> arguments_;  // sorted by (kind, binding)
  std::vector<ConstantSpec> constants_;
  int64_t max_threads_;
  int64_t static_threadgroup_bytes_;  // threadgroup variables the kernel declares itself
  std::vector<std::pair<std::string, ConstantPredicate>> predicates_;
};

}  // namespace torch_metallib::dispatch

// A torch.library operator backed by metallib kernels: what torch_metallib.ops registers
// as the operator's CPU kernel. Each call picks the kernel for the dispatch argument's
// dtype, allocates the outputs, binds arguments through the binding plan and runs the
// compiled kernel, all without Python (Python is called once per new function-constant
// combination, to compile).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <pybind11/pybind11.h>

#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dispatch/binding_plan.h"
#include "ops/size_rule.h"

namespace torch_metallib::ops {

// One scalar of a struct or array argument that varies by call: a rule's value or a
// float, int or bool argument, packed as one component of `type` at `offset`.
struct PackedField {
  int64_t offset = 0;
  const dispatch::MetalType* type = nullptr;
  std::string path;  // "params.M", "strides[2]": for messages
  int input = -1;    // schema argument, or -1 for `rule`
  SizeRule rule;
};

// Where one kernel argument's value comes from.
struct ArgumentSource {
  enum class Kind { Input, Output, Rule, Number, Packed } kind = Kind::Input;
  int position = 0;         // the kernel argument's IR parameter
  int index = 0;            // Input: schema argument; Output: returned tensor
  SizeRule rule;            // Rule
  dispatch::Number number;  // Number: fixed when registering
  // Packed (ops.struct, an array's tuple): the bytes with what is fixed already packed,
  // and the fields each call packs into a copy of them.
  std::vector<uint8_t> packed;
  std::vector<PackedField> fields;
};

// One function constant's value: fixed, a scalar argument, or a rule over the arguments.
struct ConstantSource {
  size_t slot = 0;  // index into the KernelSpec's constants()
  int input = -1;   // schema argument, or -1
  bool is_rule = false;
  SizeRule rule;
  dispatch::Number number;
};

// How a returned tensor is allocated: the shape and dtype of an argument, or a shape rule
// and a fixed dtype (or the dtype of an argument). For a mutated argument (out=), the
// shape and dtype it must already have.
struct OutputRule {
  int mutated = -1;     // schema argument checked against the rule, or -1 to allocate
  int shape_like = -1;  // schema argument, or -1 for `shape`
  std::vector<SizeRule> shape;
  int dtype_like = -1;  // schema argument, or -1 for `dtype`
  c10::ScalarType dtype = c10::ScalarType::Float;
};

struct CompiledEntry {
  std::vector<dispatch::ConstantValue> constants;
  bool cooperative = false;
  std::vector<uintptr_t> launchers;  // one per loaded copy
  bool serial = false;
  bool lanes_asked = false;  // compiled for a run that may use lane loops (not a permuted one)
  bool lanes = false;        // cooperative, as lane loops: the launchers are region tables (cpu/lanes.h)
};

// The kernel for one dtype of the dispatch argument.
struct DtypeKernel {
  c10::ScalarType dtype;
  const dispatch::KernelSpec* spec = nullptr;  // kept alive by the Python operator object
  int index = 0;                               // passed back to the compile callback
  bool cooperative = false;                    // barriers or SIMD-group functions: coroutines
  bool serial = false;                         // threadgroup variables: a copy per worker
  std::vector<ArgumentSource> sources;
  std::vector<ConstantSource> constants;
  std::vector<std::pair<int, SizeRule>> threadgroup;  // (binding, bytes)
  std::mutex mutex;
  std::deque<CompiledEntry> compiled;  // a deque: entries stay put while others are added
};

// Hidden like pybind11's own types: it holds a Python object (and so does MetallibKernel).
struct __attribute__((visibility("hidden"))) OpSpec {
  std::string name;                         // "mylib::softmax"
  std::vector<std::string> argument_names;  // schema order
  std::vector<bool> argument_mutable;       // Tensor(a!)
  int dispatch_argument = 0;
  std::vector<std::unique_ptr<DtypeKernel>> kernels;
  std::vector<OutputRule> outputs;  // returned tensors and mutated-argument checks, schema order
  std::vector<SizeRule> threads;
  std::vector<SizeRule> group;  // empty: the binding plan's default
  // (kernel index, constants tuple, cooperative, copies) -> (launchers, serial)
  pybind11::object compile;
  // (kernel index, plan, device type, checked) -> None: a call dispatched for a device whose
  // backend lives in Python (mps, cuda), or a CPU call that runs checked, run through the
  // backend seam (checked: run it checked; else the seam looks up blocks and the environment).
  pybind11::object run_on_backend;
  bool checked = false;  // ops.define(..., checked=True): every call runs checked

  ~OpSpec();
};

class __attribute__((visibility("hidden"))) MetallibKernel final : public c10::OperatorKernel {
 public:
  explicit MetallibKernel(std::shared_ptr<OpSpec> spec) : spec_(std::move(spec)) {}
  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack);

 private:
  std::shared_ptr<OpSpec> spec_;
};

}  // namespace torch_metallib::ops

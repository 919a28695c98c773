#include "ops/metallib_op.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <pybind11/stl.h>

#include <cstring>

#include "bindings/python_errors.h"
#include "bindings/python_values.h"
#include "cpu/cooperative.h"
#include "cpu/lanes.h"
#include "cpu/cpu_launch.h"
#include "dispatch/call_modes.h"
#include "dispatch/launcher.h"

namespace py = pybind11;

namespace torch_metallib::ops {
namespace {

using dispatch::ArgumentError;
using dispatch::DispatchFailure;
using dispatch::Number;

struct ScheduleChoice {
  std::string mode = "parallel";
  uint64_t seed = 0;
};

ScheduleChoice current_schedule() {
  if (!dispatch::debug_schedule_in_use()) return {};
  py::gil_scoped_acquire gil;
  py::tuple schedule = py::module_::import("torch_metallib.backends.cpu.schedule").attr("current_schedule")();
  return {schedule[0].cast<std::string>(), schedule[1].cast<uint64_t>()};
}

// Whether this call runs checked: by the operator's definition, else as a kernel call would
// (a checked() block or TORCH_METALLIB_CHECKED, looked up in Python only while one of the
// switches is in effect, so plain calls cost one relaxed load and two getenv).
bool checked_call(const OpSpec& spec) {
  if (spec.checked) return true;
  if (dispatch::plain_calls()) return false;
  py::gil_scoped_acquire gil;
  return py::module_::import("torch_metallib.dispatch.checked_mode").attr("checked_requested")(py::none()).cast<bool>();
}

Number number_of(const c10::IValue& value) {
  if (value.isDouble()) return Number::of(value.toDouble());
  if (value.isBool()) return Number::of_bool(value.toBool());
  return Number::of(value.toInt());
}

std::string dtype_list(const OpSpec& spec) {
  std::string names;
  for (const auto& kernel : spec.kernels)
    names += (names.empty() ? "" : ", ") + dispatch::torch_dtype_name(kernel->dtype);
  return names;
}

// The compiled entry for `constants`, compiling through Python on first use.
const CompiledEntry& compiled_for(const OpSpec& spec, DtypeKernel& kernel,
                                  const std::vector<dispatch::ConstantValue>& constants, bool cooperative, bool lanes,
                                  size_t copies) {
  {
    std::lock_guard<std::mutex> lock(kernel.mutex);
    for (const CompiledEntry& entry : kernel.compiled) {
      if (entry.cooperative == cooperative && entry.lanes_asked == lanes && entry.launchers.size() >= copies &&
          dispatch::same_constants(entry.constants, constants)) {
        return entry;
      }
    }
  }
  CompiledEntry entry{constants, cooperative, {}, false, lanes, false};
  {
    py::gil_scoped_acquire gil;
    py::tuple result = spec.compile(kernel.index, bindings::constants_tuple(constants), cooperative, lanes, copies);
    entry.launchers = result[0].cast<std::vector<uintptr_t>>();
    entry.serial = result[1].cast<bool>();
    entry.lanes = result[2].cast<bool>();
  }
  std::lock_guard<std::mutex> lock(kernel.mutex);
  kernel.compiled.push_back(std::move(entry));
  return kernel.compiled.back();
}

// A struct or array argument's bytes for this call: the fixed bytes, each varying field
// packed into them; bound as bytes, as a kernel call's bytes are.
dispatch::CallValue packed_value(const ArgumentSource& source, c10::ArrayRef<c10::IValue> arguments,
                                 const std::vector<std::string>& names, const dispatch::KernelSpec& kspec) {
  dispatch::CallValue value;
  value.kind = dispatch::CallValue::Kind::Bytes;
  value.byte_count = int64_t(source.packed.size());
  value.bytes = dispatch::allocate(source.packed.size());
  auto* out = reinterpret_cast<uint8_t*>(value.bytes->data());
  if (!source.packed.empty()) std::memcpy(out, source.packed.data(), source.packed.size());
  for (const PackedField& field : source.fields) {
    const Number number = field.input >= 0 ? number_of(arguments[size_t(field.input)])
                                           : Number::of(field.rule.evaluate(arguments, names));
    const dispatch::PackProblem problem = dispatch::pack_number(*field.type, number, out + field.offset);
    if (problem != dispatch::PackProblem::None) {
      const std::string from =
          field.input >= 0 ? "argument '" + names[size_t(field.input)] + "'" : "rule " + field.rule.text;
      throw ArgumentError(kspec.name() + ": " + field.path + " (" + field.type->name + "): expected " +
                          dispatch::wanted(*field.type) + ", got " +
                          dispatch::found(problem, dispatch::number_text(number)) + ", from " + from +
                          ". Pass arguments for which it fits");
    }
  }
  value.text = [what = std::to_string(source.packed.size()) + " bytes packed from bind"] { return what; };
  return value;
}

void run(const OpSpec& spec, DtypeKernel& kernel, const dispatch::Plan& plan) {
  ScheduleChoice schedule = current_schedule();
  bool parallel = schedule.mode == "parallel", permuted = schedule.mode == "permuted";
  bool cooperative = kernel.cooperative || permuted;  // permuted runs need every thread as a coroutine
  size_t copies = kernel.serial && parallel ? size_t(at::get_num_threads()) : 1;
  const CompiledEntry& entry =
      compiled_for(spec, kernel, plan.constants, cooperative, cooperative && !permuted, copies);
  if (entry.lanes) {
    cpu::launch_lanes(plan, entry.launchers, entry.serial, kernel.spec->name(),
                      cpu::Schedule{parallel, false, schedule.seed, /*strict_barriers=*/!parallel});
  } else if (cooperative) {
    cpu::launch_cooperative(plan, entry.launchers, entry.serial, kernel.spec->name(),
                            cpu::Schedule{parallel, permuted, schedule.seed, /*strict_barriers=*/!parallel});
  } else {
    cpu::launch(plan, entry.launchers, entry.serial, parallel);
  }
}

}  // namespace

OpSpec::~OpSpec() {
  if (Py_IsInitialized()) {
    py::gil_scoped_acquire gil;
    compile = py::object();
    run_on_backend = py::object();
  } else {  // the interpreter is gone; nothing to release
    compile.release();
    run_on_backend.release();
  }
}

void MetallibKernel::operator()(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const OpSpec& spec = *spec_;
  const size_t count = spec.argument_names.size();
  // Registered for CPU, MPS and CUDA: the key it was dispatched for picks the backend (the
  // GPUs' through the Python backend seam).
  const c10::DispatchKey dispatched = keys.highestPriorityTypeId();
  const char* gpu = dispatched == c10::DispatchKey::MPS    ? "mps"
                    : dispatched == c10::DispatchKey::CUDA ? "cuda"
                                                           : nullptr;
  std::vector<at::Tensor> outputs;
  try {
    std::vector<c10::IValue> arguments(stack->end() - long(count), stack->end());
    const c10::Device device = arguments[size_t(spec.dispatch_argument)].toTensor().device();
    // Kernels read memory as laid out: contiguous inputs; mutated ones are written back below.
    std::vector<std::pair<size_t, at::Tensor>> write_back;
    for (size_t i = 0; i < count; ++i) {
      if (!arguments[i].isTensor()) continue;
      const at::Tensor& t = arguments[i].toTensor();
      if (t.device() != device) {
        throw ArgumentError("argument '" + spec.argument_names[i] + "' is on " + t.device().str() + ", argument '" +
                            spec.argument_names[size_t(spec.dispatch_argument)] + "' on " + device.str() +
                            "; expected every tensor on one device. Move them with .to(...)");
      }
      if (spec.argument_mutable[i]) {  // refused before its dense copy runs, which would hide it
        const std::string problem = dispatch::overlap_refusal(t);
        if (!problem.empty()) {
          throw ArgumentError("argument '" + spec.argument_names[i] + "': the kernel writes to it; " + problem);
        }
      }
      if (!t.is_contiguous()) {
        at::Tensor dense = t.contiguous();
        if (spec.argument_mutable[i]) write_back.emplace_back(i, dense);
        arguments[i] = dense;
      }
    }
    const at::Tensor& key = arguments[size_t(spec.dispatch_argument)].toTensor();
    DtypeKernel* kernel = nullptr;
    for (const auto& k : spec.kernels) {
      if (k->dtype == key.scalar_type()) kernel = k.get();
    }
    if (kernel == nullptr) {
      throw ArgumentError("argument '" + spec.argument_names[size_t(spec.dispatch_argument)] + "' has dtype " +
                          dispatch::torch_dtype_name(key.scalar_type()) + "; this operator has kernels for " +
                          dtype_list(spec) + ". Convert it with .to(...)");
    }
    for (const OutputRule& rule : spec.outputs) {
      std::vector<int64_t> shape;
      if (rule.shape_like >= 0) {
        shape = arguments[size_t(rule.shape_like)].toTensor().sizes().vec();
      } else {
        for (const SizeRule& extent : rule.shape) {
          int64_t size = extent.evaluate(arguments, spec.argument_names);
          if (size < 0)
            throw DispatchFailure("output shape: " + extent.text + " is " + std::to_string(size) + ", below 0");
          shape.push_back(size);
        }
      }
      c10::ScalarType dtype =
          rule.dtype_like >= 0 ? arguments[size_t(rule.dtype_like)].toTensor().scalar_type() : rule.dtype;
      if (rule.mutated < 0) {
        outputs.push_back(at::empty(shape, at::TensorOptions().dtype(dtype).device(device)));
        continue;
      }
      const at::Tensor& given = arguments[size_t(rule.mutated)].toTensor();
      if (given.sizes() != c10::IntArrayRef(shape) || given.scalar_type() != dtype) {
        throw DispatchFailure("argument '" + spec.argument_names[size_t(rule.mutated)] + "' is " +
                              dispatch::torch_dtype_name(given.scalar_type()) + " of shape " + c10::str(given.sizes()) +
                              "; the kernel writes " + dispatch::torch_dtype_name(dtype) + " of shape " +
                              c10::str(c10::IntArrayRef(shape)) + ". Pass a tensor of that shape and dtype");
      }
    }
    const dispatch::KernelSpec& kspec = *kernel->spec;
    dispatch::CallArguments call;
    call.origin = dispatch::CallOrigin::Operator;
    call.positional.resize(size_t(kspec.parameter_count()));
    for (const ArgumentSource& source : kernel->sources) {
      dispatch::CallValue& value = call.positional[size_t(source.position)];
      switch (source.kind) {
        case ArgumentSource::Kind::Input: {
          const c10::IValue& argument = arguments[size_t(source.index)];
          if (argument.isTensor()) {
            value = dispatch::CallValue::of(argument.toTensor());
          } else if (!argument.isNone()) {
            value = dispatch::CallValue::of(number_of(argument));
          }
          break;
        }
        case ArgumentSource::Kind::Output: value = dispatch::CallValue::of(outputs[size_t(source.index)]); break;
        case ArgumentSource::Kind::Rule:
          value = dispatch::CallValue::of(Number::of(source.rule.evaluate(arguments, spec.argument_names)));
          break;
        case ArgumentSource::Kind::Number: value = dispatch::CallValue::of(source.number); break;
        case ArgumentSource::Kind::Packed: value = packed_value(source, arguments, spec.argument_names, kspec); break;
      }
    }
    for (const SizeRule& rule : spec.threads) call.threads.push_back(rule.evaluate(arguments, spec.argument_names));
    for (const SizeRule& rule : spec.group) call.group.push_back(rule.evaluate(arguments, spec.argument_names));
    bool empty = std::any_of(call.threads.begin(), call.threads.end(), [](int64_t t) { return t == 0; });
    for (const ConstantSource& c : kernel->constants) {
      call.constants.emplace_back(c.slot, c.input >= 0 ? number_of(arguments[size_t(c.input)])
                                          : c.is_rule  ? Number::of(c.rule.evaluate(arguments, spec.argument_names))
                                                       : c.number);
    }
    for (const auto& [binding, rule] : kernel->threadgroup) {
      call.threadgroup_memory.emplace_back(binding, rule.evaluate(arguments, spec.argument_names));
    }
    if (!empty) {  // no threads: nothing to run (Metal refuses empty grids; an op on an empty tensor is a no-op)
      dispatch::Plan plan = kspec.bind(call);
      if (gpu != nullptr) {
        py::gil_scoped_acquire gil;
        spec.run_on_backend(kernel->index, py::cast(plan, py::return_value_policy::reference), gpu, spec.checked);
      } else if (checked_call(spec)) {  // the CPU backend's checked variant, which Python compiles and runs
        py::gil_scoped_acquire gil;
        spec.run_on_backend(kernel->index, py::cast(plan, py::return_value_policy::reference), "cpu", true);
      } else {
        run(spec, *kernel, plan);
      }
    }
    for (auto& [index, dense] : write_back) stack->at(stack->size() - count + index).toTensor().copy_(dense);
  } catch (const ArgumentError& e) {
    bindings::throw_python_error("KernelArgumentError", spec.name + ": " + e.what());
  } catch (const DispatchFailure& e) {
    bindings::throw_python_error("DispatchError", spec.name + ": " + e.what());
  } catch (const dispatch::UnsupportedCall& e) {
    bindings::throw_python_error("UnsupportedKernelError", spec.name + ": " + e.what());
  } catch (const cpu::ExecutionError& e) {
    bindings::throw_python_error("KernelExecutionError", spec.name + ": " + e.what());
  }
  torch::jit::drop(*stack, count);
  for (at::Tensor& output : outputs) torch::jit::push(*stack, std::move(output));
}

}  // namespace torch_metallib::ops

// torch_metallib._C.KernelSpec / Plan / launch_cpu: the binding plan and the CPU runner.
#include <pybind11/stl.h>

#include <algorithm>
#include <array>
#include <map>

#include <torch/csrc/utils/tensor_dtypes.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/autograd/python_variable.h>

#include "bindings.h"
#include "bindings/python_values.h"
#include "cpu/async_copy.h"
#include "cpu/bounds_check.h"
#include "cpu/cooperative.h"
#include "cpu/lanes.h"
#include "cpu/cpu_launch.h"
#include "cpu/float_conversions.h"
#include "cpu/tensor_ops.h"
#include "cpu/threadgroup_initcheck.h"
#include "dispatch/binding_plan.h"
#include "dispatch/command_list.h"
#include "dispatch/replay.h"

namespace py = pybind11;

namespace torch_metallib::bindings {

namespace {

// An argument buffer's members from its call record: [{name, id, pointer, offset, count,
// address_space, access, type_name, type_size}].
std::vector<dispatch::MemberSpec> read_members(const dispatch::ArgumentSpec& argument, const py::handle& records) {
  std::vector<dispatch::MemberSpec> members;
  for (const py::handle& item : records) {
    auto r = py::reinterpret_borrow<py::dict>(item);
    dispatch::MemberSpec member;
    member.name = r["name"].cast<std::string>();
    member.id = r["id"].cast<int>();
    member.pointer = r["pointer"].cast<bool>();
    member.offset = r["offset"].cast<int64_t>();
    member.count = r["count"].cast<int64_t>();
    auto element = std::make_shared<dispatch::ArgumentSpec>();
    element->name = argument.name + "." + member.name;
    element->position = argument.position;
    element->kind = dispatch::ArgumentKind::Buffer;
    element->kind_name = "buffer";
    element->binding = argument.binding;
    element->address_space = r["address_space"].is_none() ? "" : r["address_space"].cast<std::string>();
    element->access =
        r["access"].is_none() ? dispatch::Access::Read : dispatch::access_of(r["access"].cast<std::string>());
    element->type_name = r["type_name"].cast<std::string>();
    element->type_size = r["type_size"].is_none() ? 0 : r["type_size"].cast<int64_t>();
    element->buffer_size = member.pointer ? -1 : element->type_size;
    element->type = dispatch::find_metal_type(element->type_name);
    element->description =
        argument.holds_pointer
            ? "argument " + std::to_string(argument.position) + " '" + argument.name + "' (buffer(" +
                  std::to_string(argument.binding) + ") holding a " + element->address_space + " " +
                  element->type_name + "*)"
            : "argument " + std::to_string(argument.position) + " '" + argument.name + "' member '" + member.name +
                  "' [[id(" + std::to_string(member.id) + ")]] (" +
                  (member.pointer ? element->address_space + " " + element->type_name + "*" : element->type_name) + ")";
    member.element = std::move(element);
    members.push_back(std::move(member));
  }
  std::sort(members.begin(), members.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  return members;
}

// A command list as Python sees it (tests and the simulated Metal compare it).
py::dict command_record(const dispatch::CommandList& commands) {
  py::dict out;
  out["function"] = commands.function;
  out["constants"] = constants_tuple(commands.constants);
  py::list buffers, bytes, threadgroup;
  for (const dispatch::BufferCommand& b : commands.buffers) {
    buffers.append(
        py::make_tuple(b.index, py::reinterpret_steal<py::object>(THPVariable_Wrap(b.tensor)), b.offset, b.writable));
  }
  for (const dispatch::BytesCommand& b : commands.bytes) {
    bytes.append(py::make_tuple(b.index, py::bytes(static_cast<const char*>(b.data), size_t(b.length)), b.as_buffer,
                                b.argument_buffer != nullptr));
  }
  for (const dispatch::ThreadgroupCommand& t : commands.threadgroup)
    threadgroup.append(py::make_tuple(t.index, t.length));
  out["buffers"] = buffers;
  out["bytes"] = bytes;
  out["threadgroup"] = threadgroup;
  out["threadgroup_total"] = commands.threadgroup_total;
  out["grid"] = py::make_tuple(commands.grid[0], commands.grid[1], commands.grid[2]);
  out["group"] = py::make_tuple(commands.group[0], commands.group[1], commands.group[2]);
  return out;
}

// The checked launch for `checked` ((description, address space) per IR parameter), or none.
std::unique_ptr<cpu::CheckedLaunch> checked_launch(const dispatch::Plan& plan, const py::object& checked,
                                                   const std::string& kernel) {
  if (checked.is_none()) return nullptr;
  std::vector<std::string> names;
  std::vector<int> spaces;
  for (const py::handle& item : checked) {
    auto pair = py::reinterpret_borrow<py::tuple>(item);
    names.push_back(pair[0].cast<std::string>());
    spaces.push_back(pair[1].cast<int>());
  }
  return std::make_unique<cpu::CheckedLaunch>(plan, std::move(names), std::move(spaces), kernel);
}

}  // namespace

void bind_dispatch(py::module_& m) {
  using dispatch::ArgumentSpec;
  using dispatch::ConstantSpec;
  using dispatch::KernelSpec;
  using dispatch::Plan;

  py::class_<KernelSpec>(m, "KernelSpec")
      .def(py::init([](std::string name, int parameter_count, const py::list& arguments, const py::list& constants,
                       int64_t max_threads, int64_t static_threadgroup_bytes, const py::dict& predicates) {
             std::vector<ArgumentSpec> specs;
             for (const py::handle& item : arguments) {
               auto a = py::reinterpret_borrow<py::dict>(item);
               ArgumentSpec spec;
               spec.name = a["name"].cast<std::string>();
               spec.position = a["position"].cast<int>();
               spec.kind_name = a["kind"].cast<std::string>();
               spec.kind = dispatch::argument_kind(spec.kind_name);
               spec.binding = a["binding"].cast<int>();
               spec.address_space = a["address_space"].is_none() ? "" : a["address_space"].cast<std::string>();
               spec.access = a["access"].is_none() ? dispatch::Access::Read
                                                   : dispatch::access_of(a["access"].cast<std::string>());
               spec.type_name = a["type_name"].cast<std::string>();
               spec.type_size = a["type_size"].is_none() ? 0 : a["type_size"].cast<int64_t>();
               spec.buffer_size = a["buffer_size"].is_none() ? -1 : a["buffer_size"].cast<int64_t>();
               spec.guard = a["function_constant"].is_none() ? "" : a["function_constant"].cast<std::string>();
               spec.unused = a["unused"].cast<bool>();
               spec.holds_pointer = a.contains("holds_pointer") && a["holds_pointer"].cast<bool>();
               if (a.contains("members")) spec.members = read_members(spec, a["members"]);
               specs.push_back(std::move(spec));
             }
             std::vector<ConstantSpec> constant_specs;
             for (const py::handle& item : constants) {
               auto c = py::reinterpret_borrow<py::tuple>(item);
               ConstantSpec spec;
               spec.name = c[0].cast<std::string>();
               spec.type_name = c[1].cast<std::string>();
               spec.index = c[2].cast<int>();
               spec.required = c[3].cast<bool>();
               constant_specs.push_back(std::move(spec));
             }
             // Derived guards reflection could read; the others stay bound (guard on).
             std::vector<std::pair<std::string, dispatch::ConstantPredicate>> predicate_specs;
             for (const auto& [key, expression] : predicates) {
               if (expression.is_none()) continue;
               predicate_specs.emplace_back(key.cast<std::string>(), read_predicate(expression));
             }
             return KernelSpec(std::move(name), parameter_count, std::move(specs), std::move(constant_specs),
                               max_threads, static_threadgroup_bytes, std::move(predicate_specs));
           }),
           py::arg("name"), py::arg("parameter_count"), py::arg("arguments"), py::arg("constants"),
           py::arg("max_threads"), py::arg("static_threadgroup_bytes"), py::arg("predicates") = py::dict())
      .def(
          "bind",
          [](const KernelSpec& spec, const py::tuple& args, const py::dict& kwargs, const py::handle& threads,
             const py::handle& group_size, const py::handle& constants, const py::handle& threadgroup_memory,
             const py::handle& storage_bounds) {
            return spec.bind(
                read_call(spec, args, kwargs, threads, group_size, constants, threadgroup_memory, storage_bounds));
          },
          py::arg("args"), py::arg("kwargs"), py::arg("threads"), py::arg("group_size"), py::arg("constants"),
          py::arg("threadgroup_memory"), py::arg("storage_bounds") = py::none(),
          "Checks a call and returns its Plan; raises KernelArgumentError / DispatchError. "
          "`storage_bounds`: names of tensor arguments checked execution bounds by their storage, not their view.")
      .def(
          "pipeline_plan",
          [](const KernelSpec& spec, const py::handle& constants) {
            return spec.pipeline_plan(read_constants(spec, constants));
          },
          py::arg("constants"),
          "A Plan whose command list holds only the pipeline key (function, checked constant values)");

  py::class_<Plan>(m, "Plan")
      .def_property_readonly("constants", [](const Plan& plan) { return constants_tuple(plan.constants); })
      .def_property_readonly("device", [](const Plan& plan) { return plan.device.str(); })
      .def_property_readonly("dims", [](const Plan& plan) { return std::vector<uint32_t>(plan.dims, plan.dims + 9); })
      .def_property_readonly("group_count", [](const Plan& plan) { return plan.group_count; })
      .def_property_readonly(
          "argument_buffers",
          [](const Plan& plan) {
            py::list out;
            for (const dispatch::ArgumentBuffer& buffer : plan.argument_buffers) {
              py::list slots;
              for (const dispatch::ArgumentBufferSlot& slot : buffer.slots) {
                slots.append(py::make_tuple(
                    slot.offset, py::reinterpret_steal<py::object>(THPVariable_Wrap(slot.tensor)), slot.writable));
              }
              out.append(py::make_tuple(
                  buffer.binding,
                  py::bytes(reinterpret_cast<const char*>(buffer.bytes->data()), buffer.bytes->size() * 8), slots));
            }
            return out;
          },
          "[(binding, struct bytes, [(offset, tensor, writable)])]: what a GPU backend re-encodes")
      .def_property_readonly(
          "commands",
          [](const Plan& plan) -> py::object {
            return plan.commands ? py::object(command_record(*plan.commands)) : py::object(py::none());
          },
          "The Metal-shaped command list (dispatch/command_list.h) as a dict; None for a replayed plan")
      .def_property_readonly(
          "launch_record",
          [](const Plan& plan) -> py::object {
            if (!plan.commands) return py::none();
            const dispatch::CommandList& commands = *plan.commands;
            py::list buffers, bytes, threadgroup;
            for (const dispatch::BufferCommand& b : commands.buffers) {
              auto storage = reinterpret_cast<uintptr_t>(b.tensor.storage().data_ptr().get());
              buffers.append(py::make_tuple(b.index, storage + uintptr_t(b.offset)));
            }
            for (const dispatch::BytesCommand& b : commands.bytes) {
              bytes.append(py::make_tuple(b.index, py::bytes(static_cast<const char*>(b.data), size_t(b.length))));
            }
            for (const dispatch::ThreadgroupCommand& t : commands.threadgroup)
              threadgroup.append(py::make_tuple(t.index, t.length));
            return py::make_tuple(buffers, bytes, threadgroup,
                                  py::make_tuple(commands.grid[0], commands.grid[1], commands.grid[2]),
                                  py::make_tuple(commands.group[0], commands.group[1], commands.group[2]));
          },
          "What a launch needs of the command list, lean: ([(binding, buffer address + offset)], "
          "[(binding, bytes)], [(binding, threadgroup length)], grid, group); None for a replayed plan");

  m.def(
      "replayed_plan",
      [](const Plan& plan, const std::map<int, uintptr_t>& buffers, const std::map<int, py::bytes>& bytes,
         const std::map<int, int64_t>& threadgroup, std::array<uint32_t, 3> grid, std::array<uint32_t, 3> group) {
        dispatch::EncodedCommands encoded;
        for (const auto& [index, address] : buffers) encoded.buffers[index] = reinterpret_cast<void*>(address);
        for (const auto& [index, data] : bytes) {
          std::string text = data;
          encoded.bytes[index] = std::vector<uint8_t>(text.begin(), text.end());
        }
        encoded.threadgroup = threadgroup;
        std::copy(grid.begin(), grid.end(), encoded.grid);
        std::copy(group.begin(), group.end(), encoded.group);
        return dispatch::replayed_plan(plan, encoded);
      },
      py::arg("plan"), py::arg("buffers"), py::arg("bytes"), py::arg("threadgroup"), py::arg("grid"), py::arg("group"),
      "`plan` rebuilt from what a Metal encoder was told (dispatch/replay.h): buffers {index: address "
      "(contents + offset)}, bytes {index: setBytes data}, threadgroup {index: length}, grid and group "
      "of dispatchThreads. The simulated Metal's recordings run on the CPU backend through it.");

  m.def(
      "launch_cpu",
      [](const Plan& plan, const std::vector<uintptr_t>& launchers, bool private_copies, bool parallel,
         const py::object& checked, const std::string& kernel) {
        auto check = checked_launch(plan, checked, kernel);
        py::gil_scoped_release release;
        cpu::launch(plan, launchers, private_copies, parallel, check.get());
        if (check) check->raise_if_violated();
      },
      py::arg("plan"), py::arg("launchers"), py::arg("private_copies"), py::arg("parallel") = true,
      py::arg("checked") = py::none(), py::arg("kernel") = "",
      "Runs every threadgroup of `plan` with the compiled launchers (one per loaded copy); "
      "`parallel`: groups on torch's threads, else one by one in order; `checked`: the kernel was "
      "compiled with bounds checks, and this lists (description, address space) per IR parameter.");

  m.def(
      "launch_cpu_cooperative",
      [](const Plan& plan, const std::vector<uintptr_t>& thread_functions, bool private_copies,
         const std::string& kernel, bool parallel, bool permute, uint64_t seed, const py::object& checked) {
        auto check = checked_launch(plan, checked, kernel);
        py::gil_scoped_release release;
        cpu::launch_cooperative(plan, thread_functions, private_copies, kernel,
                                cpu::Schedule{parallel, permute, seed, /*strict_barriers=*/!parallel}, check.get());
        if (check) check->raise_if_violated();
      },
      py::arg("plan"), py::arg("thread_functions"), py::arg("private_copies"), py::arg("kernel"),
      py::arg("parallel") = true, py::arg("permute") = false, py::arg("seed") = 0, py::arg("checked") = py::none(),
      "Runs every threadgroup of `plan`, each thread a coroutine, with the compiled per-thread entry; "
      "`parallel`: groups on torch's threads, else one by one and every barrier waits for every thread; "
      "`permute`: shuffled orders from `seed`; `checked` as for launch_cpu.");

  m.def(
      "launch_cpu_lanes",
      [](const Plan& plan, const std::vector<uintptr_t>& tables, bool private_copies, const std::string& kernel,
         bool parallel) {
        py::gil_scoped_release release;
        cpu::launch_lanes(plan, tables, private_copies, kernel,
                          cpu::Schedule{parallel, false, 0, /*strict_barriers=*/!parallel});
      },
      py::arg("plan"), py::arg("tables"), py::arg("private_copies"), py::arg("kernel"), py::arg("parallel") = true,
      "Runs every threadgroup of `plan` with a cooperative kernel compiled as lane loops (its region "
      "tables, one per loaded copy); `parallel` as for launch_cpu_cooperative.");

  m.def(
      "metal_type",
      [](const std::string& name) -> py::object {
        // (kind, components, accepted dtypes) of a Metal scalar or vector type, None otherwise.
        const dispatch::MetalType* type = dispatch::find_metal_type(name);
        if (type == nullptr) return py::none();
        static const char* kinds[] = {"float", "signed", "unsigned", "bool"};
        py::list dtypes;
        for (c10::ScalarType dtype : type->dtypes) {
          dtypes.append(py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(torch::getTHPDtype(dtype))));
        }
        return py::make_tuple(kinds[int(type->kind)], type->components, dtypes);
      },
      py::arg("name"));

  m.def(
      "metal_element_bytes",
      [](const std::string& name) -> int {
        // Bytes of one component of a Metal scalar or vector type (0 for other types).
        const dispatch::MetalType* type = dispatch::find_metal_type(name);
        return type == nullptr ? 0 : type->element_bytes;
      },
      py::arg("name"));

  m.def(
      "metal_number_problem",
      [](const std::string& name, const py::handle& value) -> std::string {
        // "" if `value` packs as one component of Metal type `name`; else what was expected
        // and found, as "expected an integer that fits int, got 5000000000, out of range".
        const dispatch::MetalType* type = dispatch::find_metal_type(name);
        if (type == nullptr) return "'" + name + "' is not a scalar or vector type";
        dispatch::Number number;
        if (!read_number(value, number)) return "expected a number";
        uint8_t scratch[8] = {0};
        const dispatch::PackProblem problem = dispatch::pack_number(*type, number, scratch);
        if (problem == dispatch::PackProblem::None) return "";
        return "expected " + dispatch::wanted(*type) + ", got " +
               dispatch::found(problem, dispatch::number_text(number));
      },
      py::arg("name"), py::arg("value"));

  m.def("runtime_symbols", []() {
    // What JIT-compiled kernels call, by name -> address (for llvm.add_symbol).
    py::dict symbols;
    symbols["tm_rt_frame"] = reinterpret_cast<uintptr_t>(&tm_rt_frame);
    symbols["tm_rt_barrier"] = reinterpret_cast<uintptr_t>(&tm_rt_barrier);
    symbols["tm_rt_thread_in_group"] = reinterpret_cast<uintptr_t>(&tm_rt_thread_in_group);
    symbols["tm_rt_finished"] = reinterpret_cast<uintptr_t>(&tm_rt_finished);
    symbols["tm_rt_simd_exchange"] = reinterpret_cast<uintptr_t>(&tm_rt_simd_exchange);
    symbols["tm_rt_simd_stage"] = reinterpret_cast<uintptr_t>(&tm_rt_simd_stage);
    symbols["tm_rt_check"] = reinterpret_cast<uintptr_t>(&tm_rt_check);
    symbols["tm_rt_check_context"] = reinterpret_cast<uintptr_t>(&tm_rt_check_context);
    symbols["tm_rt_check_static"] = reinterpret_cast<uintptr_t>(&tm_rt_check_static);
    symbols["tm_rt_tg_read"] = reinterpret_cast<uintptr_t>(&tm_rt_tg_read);
    symbols["tm_rt_tg_write"] = reinterpret_cast<uintptr_t>(&tm_rt_tg_write);
    symbols["tm_rt_tg_unseen"] = reinterpret_cast<uintptr_t>(&tm_rt_tg_unseen);
    symbols["tm_rt_async_copy_2d"] = reinterpret_cast<uintptr_t>(&tm_rt_async_copy_2d);
    symbols["tm_rt_matmul2d_stage"] = reinterpret_cast<uintptr_t>(&tm_rt_matmul2d_stage);
    symbols["tm_rt_matmul2d_multiply"] = reinterpret_cast<uintptr_t>(&tm_rt_matmul2d_multiply);
    symbols["tm_rt_matmul2d_read"] = reinterpret_cast<uintptr_t>(&tm_rt_matmul2d_read);
    symbols["tm_rt_matmul2d_resolve"] = reinterpret_cast<uintptr_t>(&tm_rt_matmul2d_resolve);
    symbols["tm_rt_matmul2d_load"] = reinterpret_cast<uintptr_t>(&tm_rt_matmul2d_load);
    symbols["tm_rt_matmul2d_store"] = reinterpret_cast<uintptr_t>(&tm_rt_matmul2d_store);
    symbols["tm_rt_matmul2d_coordinate"] = reinterpret_cast<uintptr_t>(&tm_rt_matmul2d_coordinate);
    symbols["tm_rt_tensor_slice"] = reinterpret_cast<uintptr_t>(&tm_rt_tensor_slice);
    symbols["__truncsfbf2"] = reinterpret_cast<uintptr_t>(&tm_rt_truncsfbf2);
    return symbols;
  });
}

}  // namespace torch_metallib::bindings

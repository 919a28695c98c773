// torch_metallib._C.KernelSpec / Plan / launch_cpu: the binding plan and the CPU runner.
#include <pybind11/stl.h>

#include <torch/csrc/utils/tensor_dtypes.h>
#include <torch/csrc/DynamicTypes.h>

#include "bindings.h"
#include "cpu/cooperative.h"
#include "cpu/cpu_launch.h"
#include "cpu/float_conversions.h"
#include "dispatch/binding_plan.h"

namespace py = pybind11;

namespace torch_metallib::bindings {

void bind_dispatch(py::module_& m) {
  using dispatch::ArgumentSpec;
  using dispatch::ConstantSpec;
  using dispatch::KernelSpec;
  using dispatch::Plan;

  py::class_<KernelSpec>(m, "KernelSpec")
      .def(py::init([](std::string name, int parameter_count, const py::list& arguments,
                       const py::list& constants, int64_t max_threads, int64_t static_threadgroup_bytes) {
             std::vector<ArgumentSpec> specs;
             for (const py::handle& item : arguments) {
               auto a = py::reinterpret_borrow<py::dict>(item);
               ArgumentSpec spec;
               spec.name = a["name"].cast<std::string>();
               spec.position = a["position"].cast<int>();
               spec.kind = a["kind"].cast<std::string>();
               spec.binding = a["binding"].cast<int>();
               spec.address_space = a["address_space"].is_none() ? "" : a["address_space"].cast<std::string>();
               spec.access = a["access"].is_none() ? "read" : a["access"].cast<std::string>();
               spec.type_name = a["type_name"].cast<std::string>();
               spec.type_size = a["type_size"].is_none() ? 0 : a["type_size"].cast<int64_t>();
               spec.buffer_size = a["buffer_size"].is_none() ? -1 : a["buffer_size"].cast<int64_t>();
               spec.guard = a["function_constant"].is_none() ? "" : a["function_constant"].cast<std::string>();
               spec.unused = a["unused"].cast<bool>();
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
             return KernelSpec(std::move(name), parameter_count, std::move(specs), std::move(constant_specs),
                               max_threads, static_threadgroup_bytes);
           }),
           py::arg("name"), py::arg("parameter_count"), py::arg("arguments"), py::arg("constants"),
           py::arg("max_threads"), py::arg("static_threadgroup_bytes"))
      .def("bind", &KernelSpec::bind, py::arg("args"), py::arg("kwargs"), py::arg("threads"),
           py::arg("group_size"), py::arg("constants"), py::arg("threadgroup_memory"),
           "Checks a call and returns its Plan; raises KernelArgumentError / DispatchError.");

  py::class_<Plan>(m, "Plan")
      .def_property_readonly("constants", [](const Plan& plan) { return constants_tuple(plan.constants); })
      .def_property_readonly("device", [](const Plan& plan) { return plan.device.str(); })
      .def_property_readonly("dims", [](const Plan& plan) { return std::vector<uint32_t>(plan.dims, plan.dims + 9); })
      .def_property_readonly("group_count", [](const Plan& plan) { return plan.group_count; });

  m.def("launch_cpu", [](const Plan& plan, const std::vector<uintptr_t>& launchers, bool private_copies,
                         bool parallel) {
    py::gil_scoped_release release;
    cpu::launch(plan, launchers, private_copies, parallel);
  }, py::arg("plan"), py::arg("launchers"), py::arg("private_copies"), py::arg("parallel") = true,
     "Runs every threadgroup of `plan` with the compiled launchers (one per loaded copy); "
     "`parallel`: groups on torch's threads, else one by one in order.");

  m.def("launch_cpu_cooperative", [](const Plan& plan, const std::vector<uintptr_t>& thread_functions,
                                     bool private_copies, const std::string& kernel, bool parallel,
                                     bool permute, uint64_t seed) {
    py::gil_scoped_release release;
    cpu::launch_cooperative(plan, thread_functions, private_copies, kernel, cpu::Schedule{parallel, permute, seed, /*strict_barriers=*/!parallel});
  }, py::arg("plan"), py::arg("thread_functions"), py::arg("private_copies"), py::arg("kernel"),
     py::arg("parallel") = true, py::arg("permute") = false, py::arg("seed") = 0,
     "Runs every threadgroup of `plan`, each thread a coroutine, with the compiled per-thread entry; "
     "`parallel`: groups on torch's threads, else one by one and every barrier waits for every thread; "
     "`permute`: shuffled orders from `seed`.");

  m.def("metal_type", [](const std::string& name) -> py::object {
    // (kind, components, accepted dtypes) of a Metal scalar or vector type, None otherwise.
    const dispatch::MetalType* type = dispatch::find_metal_type(name);
    if (type == nullptr) return py::none();
    static const char* kinds[] = {"float", "signed", "unsigned", "bool"};
    py::list dtypes;
    for (c10::ScalarType dtype : type->dtypes) {
      dtypes.append(py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(torch::getTHPDtype(dtype))));
    }
    return py::make_tuple(kinds[int(type->kind)], type->components, dtypes);
  }, py::arg("name"));

  m.def("runtime_symbols", []() {
    // What JIT-compiled kernels call, by name -> address (for llvm.add_symbol).
    py::dict symbols;
    symbols["tm_rt_frame"] = reinterpret_cast<uintptr_t>(&tm_rt_frame);
    symbols["tm_rt_barrier"] = reinterpret_cast<uintptr_t>(&tm_rt_barrier);
    symbols["tm_rt_finished"] = reinterpret_cast<uintptr_t>(&tm_rt_finished);
    symbols["tm_rt_simd_exchange"] = reinterpret_cast<uintptr_t>(&tm_rt_simd_exchange);
    symbols["tm_rt_simd_stage"] = reinterpret_cast<uintptr_t>(&tm_rt_simd_stage);
    symbols["__truncsfbf2"] = reinterpret_cast<uintptr_t>(&tm_rt_truncsfbf2);
    return symbols;
  });
}

}  // namespace torch_metallib::bindings

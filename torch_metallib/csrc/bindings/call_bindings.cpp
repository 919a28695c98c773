// torch_metallib._C.call: a kernel call bound and, where one of the function's native
// launchers accepts its plan, run without returning to Python; Launchers and the backends'
// launcher types; the counters of the switches that send calls down the full path.
#include <pybind11/stl.h>

#include "bindings.h"
#include "bindings/python_values.h"
#include "cpu/cpu_launcher.h"
#include "cuda/cuda_launcher.h"
#include "dispatch/call_modes.h"
#include "dispatch/launcher.h"

namespace py = pybind11;

namespace torch_metallib::bindings {

void bind_calls(py::module_& m) {
  using dispatch::KernelSpec;
  using dispatch::Launchers;
  using dispatch::Plan;

  py::class_<Launchers, std::shared_ptr<Launchers>>(m, "Launchers")
      .def(py::init<>())
      .def(
          "add", [](Launchers& self, std::shared_ptr<dispatch::Launcher> launcher) { self.add(std::move(launcher)); },
          py::arg("launcher"), "Adds a launcher (the most recent is tried first; 16 are kept)")
      .def(
          "covers", [](const Launchers& self, const Plan& plan) { return self.covers(plan); }, py::arg("plan"),
          "Whether one of them accepts `plan`")
      .def("clear", &Launchers::clear)
      .def("forget_last", &Launchers::forget_last, "The function's last call did not run natively")
      .def_property_readonly(
          "last_ran_natively", [](const Launchers& self) { return self.last() != nullptr; },
          "Whether the function's last call ran through one of these launchers")
      .def_property_readonly(
          "last_cpu_scheme",
          [](const Launchers& self) -> py::object {
            const char* scheme = self.last() ? self.last()->cpu_scheme() : nullptr;
            return scheme ? py::object(py::str(scheme)) : py::object(py::none());
          },
          "How the last call ran a CPU kernel's threads, if it ran natively on the CPU")
      .def("__len__", &Launchers::size);

  py::class_<dispatch::Launcher, std::shared_ptr<dispatch::Launcher>>(m, "Launcher")
      .def("accepts", &dispatch::Launcher::accepts, py::arg("plan"));

  py::class_<cpu::CpuLauncher, dispatch::Launcher, std::shared_ptr<cpu::CpuLauncher>>(m, "CpuLauncher")
      .def(py::init([](const Plan& plan, std::vector<uintptr_t> entries, bool private_copies, const std::string& scheme,
                       std::string kernel) {
             const cpu::Scheme kind = scheme == "threads"  ? cpu::Scheme::Threads
                                      : scheme == "lanes"  ? cpu::Scheme::Lanes
                                      : scheme == "vector" ? cpu::Scheme::Vector
                                                           : cpu::Scheme::Coroutines;
             return std::make_shared<cpu::CpuLauncher>(plan.constants, std::move(entries), private_copies, kind,
                                                       std::move(kernel));
           }),
           py::arg("plan"), py::arg("entries"), py::arg("private_copies"), py::arg("scheme"), py::arg("kernel"),
           "Runs plans with `plan`'s constant values on the CPU, parallel and unchecked, through the compiled "
           "`entries` (as KernelFunction.cpu_scheme names `scheme`)");

  py::class_<cuda::CudaLauncher, dispatch::Launcher, std::shared_ptr<cuda::CudaLauncher>>(m, "CudaLauncher")
      .def(py::init([](const Plan& plan, int device, uintptr_t context, uintptr_t function, int max_threads,
                       int static_shared, int dynamic_allowed, int coarsening, bool grid_only, int grid_only_block,
                       const std::vector<std::pair<bool, int>>& slots, py::function current_stream) {
             cuda::KernelHandles kernel{device,
                                        reinterpret_cast<cuda::Context>(context),
                                        reinterpret_cast<cuda::Function>(function),
                                        max_threads,
                                        static_shared,
                                        dynamic_allowed,
                                        coarsening,
                                        grid_only,
                                        grid_only_block};
             std::vector<cuda::ParameterSlot> parameter_slots;
             for (const auto& [threadgroup, binding] : slots) parameter_slots.push_back({threadgroup, binding});
             // Called with the GIL held: CUDA launches keep it (they return at once).
             auto stream = [current_stream](int index) {
               return reinterpret_cast<cuda::Stream>(current_stream(index).cast<uintptr_t>());
             };
             return std::make_shared<cuda::CudaLauncher>(plan.constants, kernel, std::move(parameter_slots), stream);
           }),
           py::arg("plan"), py::arg("device"), py::arg("context"), py::arg("function"), py::arg("max_threads"),
           py::arg("static_shared"), py::arg("dynamic_allowed"), py::arg("coarsening"), py::arg("grid_only"),
           py::arg("grid_only_block"), py::arg("slots"), py::arg("current_stream"),
           "Launches plans with `plan`'s constant values on GPU `device` through the loaded kernel `function` "
           "(its entry parameters: `slots`, (threadgroup?, binding) each, then the launch parameters); "
           "`current_stream(device)`: torch's current stream there");

  m.def(
      "call",
      [](const KernelSpec& spec, Launchers& launchers, const py::tuple& args, const py::dict& kwargs,
         const py::handle& threads, const py::handle& group_size, const py::handle& constants,
         const py::handle& threadgroup_memory, const py::handle& storage_bounds) -> py::object {
        Plan plan = spec.bind(
            read_call(spec, args, kwargs, threads, group_size, constants, threadgroup_memory, storage_bounds));
        const std::shared_ptr<dispatch::Launcher> launcher = launchers.find(plan);
        if (launcher == nullptr) return py::cast(std::move(plan));
        if (launcher->releases_gil(plan)) {
          py::gil_scoped_release release;
          launcher->launch(plan);
        } else {
          launcher->launch(plan);
        }
        return py::none();
      },
      py::arg("spec"), py::arg("launchers"), py::arg("args"), py::arg("kwargs"), py::arg("threads"),
      py::arg("group_size"), py::arg("constants"), py::arg("threadgroup_memory"), py::arg("storage_bounds"),
      "Binds a call; runs it with the first of `launchers` that accepts its plan and returns None, or "
      "returns the Plan for the full path");

  m.def("add_debug_schedule_users", &dispatch::add_debug_schedule_users, py::arg("delta"),
        "Counts torch_metallib.cpu_schedule blocks (and the environment's default) that are not 'parallel'.");
  m.def("backends_changed", &dispatch::backends_changed,
        "A backend was registered: launchers made before no longer run calls.");
  m.def("add_checked_blocks", &dispatch::add_checked_blocks, py::arg("delta"),
        "Counts torch_metallib.checked() blocks that turn checking on.");
}

}  // namespace torch_metallib::bindings

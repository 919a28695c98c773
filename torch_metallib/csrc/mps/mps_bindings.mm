#include "mps/mps_bindings.h"

#include <stdexcept>

#include "dispatch/binding_plan.h"
#include "mps/metal_library.h"
#include "mps/pipeline_archive.h"

namespace py = pybind11;

namespace torch_metallib::mps {

namespace {

const dispatch::CommandList& commands_of(const dispatch::Plan& plan) {
  if (!plan.commands) throw std::invalid_argument("this plan has no command list (a replayed plan)");
  return *plan.commands;
}

}  // namespace

void register_metal_backend(py::module_& m) {
  py::class_<MetalLibrary, std::shared_ptr<MetalLibrary>>(
      m, "MetalLibrary", "A loaded metallib made a Metal library (read in place), with its pipeline cache")
      .def(py::init([](const py::buffer& data) {
             py::buffer_info info = data.request();
             // Metal reads the bytes in place: the Python object that holds them stays alive
             // as long as the library (dropped with the GIL held).
             std::shared_ptr<const void> owner(new py::object(data), [](const void* held) {
               py::gil_scoped_acquire gil;
               delete static_cast<const py::object*>(held);
             });
             return std::make_shared<MetalLibrary>(owner, info.ptr, size_t(info.size) * size_t(info.itemsize));
           }),
           py::arg("data"))
      .def(
          "limits",
          [](MetalLibrary& library, const dispatch::Plan& plan) {
            const dispatch::CommandList& commands = commands_of(plan);
            PipelineLimits limits;
            {
              py::gil_scoped_release release;
              limits = library.limits(commands.function, commands.constants);
            }
            py::dict out;
            out["max_total_threads_per_threadgroup"] = limits.max_total_threads;
            out["thread_execution_width"] = limits.execution_width;
            out["static_threadgroup_memory_length"] = limits.static_threadgroup_memory;
            return out;
          },
          py::arg("plan"), "The pipeline's limits for the plan's function and constant values")
      .def(
          "run",
          [](MetalLibrary& library, const dispatch::Plan& plan) {
            const dispatch::CommandList& commands = commands_of(plan);
            py::gil_scoped_release release;
            library.run(commands);
          },
          py::arg("plan"), "Encodes the plan's command list into the current MPS stream")
      .def_property_readonly("pipelines_built", &MetalLibrary::pipelines_built)
      .def_property_readonly("pipelines_archived", &MetalLibrary::pipelines_archived);

  m.def("configure_pipeline_archive", &configure_pipeline_archive, py::arg("folder"), py::arg("os_build"),
        "Keep compiled pipelines in <folder>/<device>-<os_build>.binarchive; folder '' turns it off");
  m.def(
      "save_pipeline_archive",
      [] {
        py::gil_scoped_release release;
        return save_pipeline_archive();
      },
      "Writes the binary archive if pipelines were added; False if writing failed");
  m.def("pipeline_archive_status", [] {
    PipelineArchiveStatus status = pipeline_archive_status();
    py::dict out;
    out["path"] = status.path;
    out["hits"] = status.hits;
    out["compiled"] = status.compiled;
    out["discarded"] = status.discarded;
    out["written"] = status.written;
    out["pending"] = status.pending;
    return out;
  });
}

}  // namespace torch_metallib::mps

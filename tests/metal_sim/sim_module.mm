// The simulated Metal as a Python module (built by tests/metal_sim/build.py): the Metal
// backend's own bindings (csrc/mps/mps_bindings.mm) plus access to the recording.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#import <Metal/Metal.h>

#include "mps/mps_bindings.h"
#include "recorder.h"

namespace py = pybind11;

namespace metal_sim {
std::vector<id<MTLBuffer>>& pending_copies();
}

PYBIND11_MODULE(metal_sim_native, m) {
  torch_metallib::mps::register_metal_backend(m);

  m.def(
      "take_recording",
      [] {
        auto& recorder = metal_sim::recorder();
        std::vector<metal_sim::Call> calls;
        {
          std::lock_guard<std::mutex> lock(recorder.mutex);
          calls.swap(recorder.calls);
        }
        py::list out;
        for (const metal_sim::Call& call : calls) {
          py::list constants;
          for (const auto& [index, type, bytes] : call.constants)
            constants.append(py::make_tuple(index, type, py::bytes(bytes)));
          out.append(py::make_tuple(
              call.what, call.what == "bytes" ? py::object(py::bytes(call.text)) : py::object(py::str(call.text)),
              call.numbers, call.address, constants));
        }
        return out;
      },
      "[(what, text or bytes, numbers, address, constants)]: the encoder calls since the last take");

  m.attr("GPU_ADDRESS_TAG") = metal_sim::kGpuAddressTag;

  m.def("complete_command_buffer", [] {
    // The GPU is done with what was encoded: buffers handed to release_when_completed go.
    std::vector<id<MTLBuffer>> copies;
    {
      std::lock_guard<std::mutex> lock(metal_sim::recorder().mutex);
      copies.swap(metal_sim::pending_copies());
    }
    for (id<MTLBuffer> copy : copies) [copy release];
  });

  m.def("counts", [] {
    auto& recorder = metal_sim::recorder();
    std::lock_guard<std::mutex> lock(recorder.mutex);
    py::dict out;
    out["libraries"] = recorder.libraries;
    out["functions"] = recorder.functions;
    out["pipelines"] = recorder.pipelines;
    out["buffers"] = recorder.buffers;
    out["released_copies"] = recorder.released_copies;
    out["archived_pipelines"] = recorder.archived_pipelines;
    out["archive_misses"] = recorder.archive_misses;
    out["archive_additions"] = recorder.archive_additions;
    out["archives_read"] = recorder.archives_read;
    out["archives_written"] = recorder.archives_written;
    return out;
  });

  m.def(
      "set_limits",
      [](int64_t max_total_threads, int64_t execution_width, int64_t static_threadgroup_memory,
         int64_t device_threadgroup_memory) {
        auto& recorder = metal_sim::recorder();
        std::lock_guard<std::mutex> lock(recorder.mutex);
        recorder.limits = {max_total_threads, execution_width, static_threadgroup_memory, device_threadgroup_memory};
      },
      py::arg("max_total_threads") = 1024, py::arg("execution_width") = 32, py::arg("static_threadgroup_memory") = 0,
      py::arg("device_threadgroup_memory") = 32768,
      "What pipelines made from now on report, and the device's threadgroup memory");
}

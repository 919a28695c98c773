// What the simulated Metal records: every call the Metal backend makes on an encoder, and
// the counts of what it made (functions, pipelines), for tests/test_metal_sim.py.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

namespace metal_sim {

// A simulated buffer's gpuAddress is its host address with these bits flipped.
constexpr uint64_t kGpuAddressTag = 0x5a00000000000000ull;

struct Call {
  std::string what;              // pipeline | buffer | bytes | threadgroup | resource | dispatch
  std::string text;              // pipeline: function name; bytes: the data
  std::vector<int64_t> numbers;  // buffer: index, offset, length, buffer id; threadgroup: index, length;
                                 // resource: buffer id, length, MTLResourceUsage;
                                 // bytes: index; dispatch: grid xyz, group xyz
  uintptr_t address = 0;         // buffer, resource: contents
  std::vector<std::tuple<int64_t, int64_t, std::string>> constants;  // pipeline: (index, MTLDataType, bytes)
};

struct Limits {
  int64_t max_total_threads = 1024;
  int64_t execution_width = 32;
  int64_t static_threadgroup_memory = 0;
  int64_t device_threadgroup_memory = 32768;
};

struct Recorder {
  std::mutex mutex;
  std::vector<Call> calls;
  int64_t libraries = 0, functions = 0, pipelines = 0, buffers = 0, released_copies = 0;
  // Binary archives: pipelines made from an archive's code (not compiled: `pipelines`
  // counts compiles), archive misses refused (FailOnBinaryArchiveMiss), functions added,
  // archives read from a file and written to one.
  int64_t archived_pipelines = 0, archive_misses = 0, archive_additions = 0, archives_read = 0, archives_written = 0;
  Limits limits;
  void add(Call call) {
    std::lock_guard<std::mutex> lock(mutex);
    calls.push_back(std::move(call));
  }
};

Recorder& recorder();

}  // namespace metal_sim

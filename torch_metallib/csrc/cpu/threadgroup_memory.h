// Threadgroup-memory arguments of cooperative kernels: a buffer per running threadgroup.
#pragma once

#include <cstdint>
#include <vector>

#include "dispatch/binding_plan.h"

namespace torch_metallib::cpu {

// Per-OS-thread copy of the plan's addresses with this thread's threadgroup-memory
// buffers in place: threadgroups running at the same time each get their own.
struct ThreadgroupMemory {
  std::vector<void*> addresses;
  std::vector<std::vector<uint64_t>> buffers;
  void* const* prepare(const dispatch::Plan& plan) {
    if (plan.threadgroup_buffers.empty()) return plan.addresses.data();
    addresses = plan.addresses;
    buffers.resize(plan.threadgroup_buffers.size());
    for (size_t i = 0; i < plan.threadgroup_buffers.size(); ++i) {
      const auto& [position, bytes] = plan.threadgroup_buffers[i];
      buffers[i].assign(size_t(bytes + 7) / 8, 0);
      addresses[size_t(position)] = buffers[i].data();
    }
    return addresses.data();
  }
};

// This OS thread's (cooperative.cpp and lanes.cpp run one threadgroup at a time per thread).
ThreadgroupMemory& threadgroup_memory();

}  // namespace torch_metallib::cpu

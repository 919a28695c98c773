// Running cooperative kernels as lane loops (regions.py): the kernel is cut at its
// waits into regions, each a loop over a range of threads that runs those standing at the
// region's start. This runner starts the threadgroup, completes a SIMD-group's exchange
// once its lanes have all stopped, releases a barrier once every thread has, and runs the
// region after it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cpu/cooperative.h"
#include "dispatch/binding_plan.h"

namespace torch_metallib::cpu {

// Runs region `region`'s code for threads [begin, end), all of one SIMD-group and standing
// at the region's start; each leaves in points[t] the marker it stopped at (0xFFFFFFFF: it returned).
// Returns the point they all stopped at, or kScanPoints where they differ (or it cannot tell).
using RegionFunction = uint32_t (*)(void* context, void* const* addresses, const uint32_t* dims, uint32_t group,
                                    uint32_t begin, uint32_t end, uint32_t* points);
constexpr uint32_t kScanPoints = 0xFFFFFFFEu;  // regions.py: SCAN

// The table a lane-loop kernel exports (@__tm_lanes_<symbol>, regions.py).
struct LanesTable {
  uint64_t context_bytes;  // a threadgroup's context: per-thread arrays, then exchange phases and slots
  uint64_t phases_offset;  // [32][sites] uint32: which of an exchange's two slot areas was completed last
  uint64_t areas_offset;   // [32][sites][2] ExchangePhase-shaped slot areas
  uint32_t sites;
  uint32_t regions;
  struct Region {
    RegionFunction function;
    uint32_t kind;  // 0: the start, 1: after a barrier, 2: after an exchange; + 4: runs several SIMD-groups at once
    uint32_t rank;  // its marker's place in a weak topological order: lowest goes first
  } region[1];      // `regions` of them
};

// Runs every threadgroup of `plan` with the kernel whose tables (one per loaded copy) are
// `tables`; otherwise as launch_cooperative (no permuted or checked runs: those use coroutines).
void launch_lanes(const dispatch::Plan& plan, const std::vector<uintptr_t>& tables, bool private_copies,
                  const std::string& kernel, const Schedule& schedule);

}  // namespace torch_metallib::cpu

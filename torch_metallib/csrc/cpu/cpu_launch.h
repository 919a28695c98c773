// Runs a plan's threadgroups through a JIT-compiled launcher on torch's intra-op pool.
#pragma once

#include <cstdint>
#include <vector>

#include "dispatch/binding_plan.h"

namespace torch_metallib::cpu {

// The launcher each compiled kernel exports (see backends/cpu/lowering.py): runs threadgroups
// [first, end) of the grid described by dims (grid xyz, group xyz, groups xyz).
using LaunchFunction = void (*)(void* const* addresses, const uint32_t* dims, int64_t first, int64_t end);

// Runs every threadgroup of `plan`, spread with at::parallel_for (which honours
// torch.set_num_threads). `launchers` holds one entry point per loaded copy of the
// kernel; with `private_copies` (threadgroup variables) each chunk of groups leases a copy
// no other running chunk holds (private_copies.h), also across concurrent calls, and with
// fewer copies than workers the groups run one at a time; without `parallel` they always
// do, in order. Call without the GIL.
// With `checked`, the kernel was compiled with bounds checks, which report to it.
class CheckedLaunch;
void launch(const dispatch::Plan& plan, const std::vector<uintptr_t>& launchers, bool private_copies,
            bool parallel = true, CheckedLaunch* checked = nullptr);

}  // namespace torch_metallib::cpu

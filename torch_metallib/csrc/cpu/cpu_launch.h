// Runs a plan's threadgroups through a JIT-compiled launcher on torch's intra-op pool.
#pragma once

#include <cstdint>

#include "dispatch/binding_plan.h"

namespace torch_metallib::cpu {

// The launcher each compiled kernel exports (see _cpu_lowering.py): runs threadgroups
// [first, end) of the grid described by dims (grid xyz, group xyz, groups xyz).
using LaunchFunction = void (*)(void* const* addresses, const uint32_t* dims, int64_t first, int64_t end);

// Runs every threadgroup of `plan`; in one thread when `serial` (kernels whose
// threadgroup variables are shared by all groups), else spread with at::parallel_for,
// which honours torch.set_num_threads. Call without the GIL.
void launch(const dispatch::Plan& plan, uintptr_t launcher, bool serial);

}  // namespace torch_metallib::cpu

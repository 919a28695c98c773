// Running kernels whose threads cooperate (threadgroup barriers, SIMD-group functions):
// every thread of a threadgroup is a fiber on one OS thread; a thread that reaches a
// barrier or a SIMD-group collective yields until its partners arrive (DESIGN.md §4.3).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "dispatch/binding_plan.h"

namespace torch_metallib::cpu {

// Raised as torch_metallib.KernelExecutionError: a barrier that can never complete.
struct ExecutionError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The per-thread entry cooperative kernels export (see _cpu_lowering.py): runs thread
// `thread` (linear index in its threadgroup) of threadgroup `group` (linear index).
using ThreadFunction = void (*)(void* const* addresses, const uint32_t* dims, uint32_t group, uint32_t thread);

// How threads and threadgroups are ordered (torch_metallib.cpu_schedule). Within a barrier
// interval, threads run one after another up to their next barrier or collective.
struct Schedule {
  bool parallel = true;   // threadgroups spread over torch's threads; else one by one, in order
  bool permute = false;   // shuffle the group order, and the thread order in every barrier interval
  uint64_t seed = 0;      // of the shuffles: same seed, same orders
  // A barrier waits for every thread, also those that finished without reaching it (a
  // deadlock error); otherwise, as on Apple GPUs, only for the threads still running.
  bool strict_barriers = false;
};

// Runs every threadgroup of `plan` with fibers; `thread_functions` and `private_copies`
// as for cpu::launch. `kernel` names the kernel in errors. Call without the GIL.
void launch_cooperative(const dispatch::Plan& plan, const std::vector<uintptr_t>& thread_functions,
                        bool private_copies, const std::string& kernel, const Schedule& schedule);

}  // namespace torch_metallib::cpu

// Called from JIT-compiled kernels (registered with LLVM by address):
extern "C" {
// air.wg.barrier: waits for every thread of the threadgroup.
void tm_rt_barrier();
// A SIMD-group exchange: deposits `bytes` (<= 64) of this lane's value, waits for the
// active lanes of its SIMD-group at this call site, and returns their 32 x 64-byte slots;
// info[0] = mask of lanes that took part, info[1] = this lane, info[2] = 1 for the first
// lane to return from this exchange (it may compute a result for all the lanes into the
// slots' unused bytes, which stay until every lane has returned). `order` ranks the call site
// (_cpu_reconvergence.py): when lanes wait at several sites, the lowest goes first.
const void* tm_rt_simd_exchange(const void* value, uint32_t bytes, uint32_t* info, uint32_t order);
}

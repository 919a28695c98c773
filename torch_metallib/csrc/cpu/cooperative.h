// Running kernels whose threads cooperate (threadgroup barriers, SIMD-group functions):
// every thread of a threadgroup is a coroutine (LLVM's switch-resumed lowering, see
// backends/cpu/coroutine.py) that suspends at a barrier or SIMD-group collective; one OS thread
// resumes the threadgroup's coroutines in turn until their partners arrive (ARCHITECTURE.md, "Rules":
// continuation-based synchronization, with LLVM splitting the kernel at each wait).
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

// The per-thread entry cooperative kernels export (see backends/cpu/lowering.py): starts thread
// `thread` (linear index in its threadgroup) of threadgroup `group` (linear index) and runs
// it to its first wait or its end; returns its coroutine frame, whose first word is the
// function that resumes it.
using ThreadFunction = void* (*)(void* const* addresses, const uint32_t* dims, uint32_t group, uint32_t thread);

// How threads and threadgroups are ordered (torch_metallib.cpu_schedule). Within a barrier
// interval, threads run one after another up to their next barrier or collective.
struct Schedule {
  bool parallel = true;  // threadgroups spread over torch's threads; else one by one, in order
  bool permute = false;  // shuffle the group order, and the thread order in every barrier interval
  uint64_t seed = 0;     // of the shuffles: same seed, same orders
  // A barrier waits for every thread, also those that finished without reaching it (a
  // deadlock error); otherwise, as on Apple GPUs, only for the threads still running.
  bool strict_barriers = false;
};

// Runs every threadgroup of `plan`, its threads as coroutines; `thread_functions` and `private_copies`
// as for cpu::launch. `kernel` names the kernel in errors. Call without the GIL.
// With `checked`, the kernel was compiled with bounds checks, which report to it.
class CheckedLaunch;
void launch_cooperative(const dispatch::Plan& plan, const std::vector<uintptr_t>& thread_functions, bool private_copies,
                        const std::string& kernel, const Schedule& schedule, CheckedLaunch* checked = nullptr);

// The error of a strict barrier (sequential schedule) that threads finished without reaching.
std::string deadlock_message(const std::string& kernel, const uint32_t* dims, uint32_t group, uint32_t waiting,
                             uint32_t count, uint32_t done);

}  // namespace torch_metallib::cpu

// Called from JIT-compiled kernels (registered with LLVM by address), always for the thread
// the runtime is running. A call that makes the thread wait returns, and the kernel then
// suspends; the runtime resumes it when it may go on.
extern "C" {
// The memory of the thread's coroutine frame (`bytes`, the same for every thread of a kernel).
void* tm_rt_frame(uint64_t bytes);
// air.wg.barrier: the thread waits for every thread of the threadgroup.
void tm_rt_barrier(uint32_t site);  // site: the barrier's call site (checked execution compares them)
// The thread's kernel returned.
void tm_rt_finished();
uint32_t tm_rt_thread_in_group();  // the running thread's index in its threadgroup
// Where a waiting lane finds its exchange's result (in the kernel's coroutine frame).
struct ExchangeWait {
  const void* slots;  // set when the exchange completes; null: call tm_rt_simd_exchange again
  uint32_t lane;      // this lane
};
// A SIMD-group exchange: deposits `bytes` (<= 64) of this lane's value for the active lanes
// of its SIMD-group at call site `site` (a nonzero id). Returns the exchange's slots
// (ExchangePhase in cooperative.cpp: 32 x 64 bytes of values, then the mask of lanes that
// took part and a flag for the first reader) if this lane completed it, else null: the
// kernel suspends, and when resumed reads waiting->slots. `order` ranks the call site
// (backends/cpu/reconvergence.py): when lanes wait at several sites, the lowest goes first.
const void* tm_rt_simd_exchange(const void* value, uint32_t bytes, ExchangeWait* waiting, uint32_t order,
                                uint32_t site);
// An exchange whose lanes write their values into shared memory instead (simdgroup-matrix
// products, air/simdgroup_matrix.py): enters and arrives as tm_rt_simd_exchange does, and
// returns `bytes` of memory for this SIMD-group and phase, which the lane fills before it
// suspends; null if the lane may not enter yet (it suspends and asks again). If this lane
// completed the exchange, waiting->slots is set already. A lane resumed with no slots
// (stepped back) must stage again: the memory may have changed.
void* tm_rt_simd_stage(uint64_t bytes, ExchangeWait* waiting, uint32_t order, uint32_t site);
}

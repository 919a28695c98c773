#include "cpu/cooperative.h"

#include <ATen/Parallel.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "cpu/fiber_switch.h"

namespace torch_metallib::cpu {
namespace {

constexpr uint32_t kSimdWidth = 32;
constexpr uint32_t kSlotBytes = 64;
constexpr size_t kStackBytes = 256 * 1024;

enum class State { Ready, AtBarrier, InExchange, WaitingToExchange, Done };

struct Fiber {
  void* sp = nullptr;
  uint32_t thread = 0;
  uint32_t simd = 0;
  uint32_t lane = 0;
  State state = State::Ready;
};

// One SIMD-group's exchange: lanes deposit into the slots of the current phase; two
// phases alternate so a lane may start the next exchange while others still read.
struct SimdGroup {
  uint32_t live = 0;          // lanes not finished
  uint32_t arrived = 0;       // lanes deposited in the current phase
  uint32_t phase = 0;
  uintptr_t site = 0;         // call site of the current phase (its return address)
  uint32_t deposited[2] = {0, 0};
  uint32_t completed[2] = {0, 0};
  alignas(64) unsigned char slots[2][kSimdWidth][kSlotBytes];
};

// Fiber stacks of one OS thread, reused across threadgroups and calls.
struct StackPool {
  std::vector<void*> stacks;
  ~StackPool() {
    for (void* stack : stacks) munmap(stack, kStackBytes);
  }
  void* get(size_t i) {
    while (stacks.size() <= i) {
      void* stack = mmap(nullptr, kStackBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (stack == MAP_FAILED) throw std::runtime_error("cannot allocate fiber stacks");
      mprotect(stack, size_t(getpagesize()), PROT_NONE);  // overflow faults instead of corrupting
      stacks.push_back(stack);
    }
    return stacks[i];
  }
};

struct GroupRun {
  ThreadFunction function;
  void* const* addresses;
  const uint32_t* dims;
  uint32_t group;
  std::vector<Fiber> fibers;
  std::vector<SimdGroup> simds;
  void* scheduler = nullptr;
  Fiber* current = nullptr;
  uint32_t at_barrier = 0;
  uint32_t done = 0;
};

thread_local GroupRun* current_run = nullptr;
thread_local StackPool stack_pool;

void yield_to_scheduler(GroupRun& run) { tm_fiber_switch(&run.current->sp, run.scheduler); }

void complete_exchange(GroupRun& run, uint32_t simd) {
  SimdGroup& s = run.simds[simd];
  uint32_t p = s.phase & 1;
  s.completed[p] = s.deposited[p];
  s.deposited[p ^ 1] = 0;
  s.arrived = 0;
  s.phase++;
  for (Fiber& f : run.fibers) {
    if (f.simd == simd && (f.state == State::InExchange || f.state == State::WaitingToExchange)) f.state = State::Ready;
  }
}

void fiber_main(void* argument) {
  auto* fiber = static_cast<Fiber*>(argument);
  GroupRun& run = *current_run;
  run.function(run.addresses, run.dims, run.group, fiber->thread);
  fiber->state = State::Done;
  run.done++;
  SimdGroup& s = run.simds[fiber->simd];
  s.live--;
  if (s.arrived > 0 && s.arrived == s.live) complete_exchange(run, fiber->simd);
  tm_fiber_switch(&fiber->sp, run.scheduler);  // never resumed
}

std::string group_name(const uint32_t* dims, uint32_t group) {
  uint32_t x = group % dims[6], y = (group / dims[6]) % dims[7], z = group / (dims[6] * dims[7]);
  return "(" + std::to_string(x) + ", " + std::to_string(y) + ", " + std::to_string(z) + ")";
}

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
thread_local ThreadgroupMemory threadgroup_memory;

void run_group(ThreadFunction function, const dispatch::Plan& plan, uint32_t group, const std::string& kernel) {
  const uint32_t* dims = plan.dims;
  uint32_t actual[3];
  for (int axis = 0; axis < 3; ++axis) {
    uint32_t origin = (axis == 0 ? group % dims[6] : axis == 1 ? (group / dims[6]) % dims[7] : group / (dims[6] * dims[7])) * dims[3 + axis];
    actual[axis] = std::min(dims[3 + axis], dims[axis] - origin);
  }
  uint32_t threads = actual[0] * actual[1] * actual[2];
  GroupRun run{function, threadgroup_memory.prepare(plan), dims, group, std::vector<Fiber>(threads),
               std::vector<SimdGroup>((threads + kSimdWidth - 1) / kSimdWidth)};
  for (uint32_t t = 0; t < threads; ++t) {
    Fiber& f = run.fibers[t];
    f.thread = t;
    f.simd = t / kSimdWidth;
    f.lane = t % kSimdWidth;
    run.simds[f.simd].live++;
    f.sp = fiber_prepare(stack_pool.get(t), kStackBytes, &fiber_main, &f);
  }
  GroupRun* outer = current_run;
  current_run = &run;
  while (run.done < threads) {
    bool progress = false;
    for (Fiber& f : run.fibers) {
      if (f.state != State::Ready) continue;
      run.current = &f;
      tm_fiber_switch(&run.scheduler, f.sp);
      progress = true;
    }
    if (progress) continue;
    // Everyone waits: the lanes gathered at a collective are its active lanes (the others
    // are in divergent code or at a barrier), so finish those exchanges with them.
    for (uint32_t simd = 0; simd < run.simds.size(); ++simd) {
      if (run.simds[simd].arrived > 0) {
        complete_exchange(run, simd);
        progress = true;
      }
    }
    if (!progress) {
      current_run = outer;
      throw ExecutionError(kernel + ": deadlock in threadgroup " + group_name(dims, group) + ": " +
                           std::to_string(run.at_barrier) + " of " + std::to_string(threads) +
                           " threads wait at a threadgroup barrier that " + std::to_string(run.done) +
                           " threads finished without reaching. Every thread of a threadgroup must reach "
                           "each threadgroup_barrier");
    }
  }
  current_run = outer;
}

}  // namespace

void launch_cooperative(const dispatch::Plan& plan, const std::vector<uintptr_t>& thread_functions,
                        bool private_copies, const std::string& kernel) {
  if (!fibers_supported()) {
    throw ExecutionError(kernel + ": cooperative kernels need fibers, which this CPU architecture lacks");
  }
  const int64_t groups = int64_t(plan.group_count);
  bool parallel = groups > 1 && (!private_copies || thread_functions.size() >= size_t(at::get_num_threads()));
  if (!parallel) {
    auto function = reinterpret_cast<ThreadFunction>(thread_functions.at(0));
    for (int64_t g = 0; g < groups; ++g) run_group(function, plan, uint32_t(g), kernel);
    return;
  }
  at::parallel_for(0, groups, 1, [&](int64_t first, int64_t end) {
    auto function = reinterpret_cast<ThreadFunction>(
        thread_functions.at(size_t(private_copies ? at::get_thread_num() : 0)));
    for (int64_t g = first; g < end; ++g) run_group(function, plan, uint32_t(g), kernel);
  });
}

}  // namespace torch_metallib::cpu

using torch_metallib::cpu::current_run;
using torch_metallib::cpu::State;

extern "C" void tm_rt_barrier() {
  auto& run = *current_run;
  auto& fiber = *run.current;
  fiber.state = State::AtBarrier;
  if (++run.at_barrier == run.fibers.size()) {  // the last to arrive releases everyone
    run.at_barrier = 0;
    for (auto& f : run.fibers) {
      if (f.state == State::AtBarrier) f.state = State::Ready;
    }
    return;
  }
  torch_metallib::cpu::yield_to_scheduler(run);
}

extern "C" const void* tm_rt_simd_exchange(const void* value, uint32_t bytes, uint32_t* info) {
  auto& run = *current_run;
  auto& fiber = *run.current;
  auto& s = run.simds[fiber.simd];
  auto site = reinterpret_cast<uintptr_t>(__builtin_return_address(0));
  while (s.arrived > 0 && s.site != site) {  // another collective is gathering: wait for it
    fiber.state = State::WaitingToExchange;
    torch_metallib::cpu::yield_to_scheduler(run);
  }
  uint32_t phase = s.phase;
  uint32_t p = phase & 1;
  s.site = site;
  if (bytes > 0) std::memcpy(s.slots[p][fiber.lane], value, std::min<uint32_t>(bytes, 64));
  s.deposited[p] |= 1u << fiber.lane;
  if (++s.arrived == s.live) {
    torch_metallib::cpu::complete_exchange(run, fiber.simd);
  } else {
    fiber.state = State::InExchange;
    while (s.phase == phase) torch_metallib::cpu::yield_to_scheduler(run);
  }
  if (info != nullptr) {
    info[0] = s.completed[p];
    info[1] = fiber.lane;
  }
  return s.slots[p];
}

#include "cpu/cooperative.h"

#include <ATen/Parallel.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "cpu/fiber_switch.h"

namespace torch_metallib::cpu {
namespace {

constexpr uint32_t kSimdWidth = 32;
constexpr uint32_t kSlotBytes = 64;
constexpr size_t kStackBytes = 256 * 1024;
constexpr size_t kMaxFibers = 1024;  // Metal's limit of threads per threadgroup (checked by the binding plan)

enum class State { Ready, AtBarrier, InExchange, WaitingToExchange, Done };

struct Fiber {
  void* sp = nullptr;
  uint32_t thread = 0;
  uint32_t simd = 0;
  uint32_t lane = 0;
  State state = State::Ready;
  uintptr_t site = 0;      // WaitingToExchange: the collective it waits to enter,
  uint32_t order = 0;      // and that call site's order
  bool stepped_back = false;  // its exchange was undone so that lanes behind go first
};

// One SIMD-group's exchange: lanes deposit into the slots of the current phase; two
// phases alternate so a lane may start the next exchange while others still read.
struct SimdGroup {
  uint32_t live = 0;          // lanes not finished
  uint32_t arrived = 0;       // lanes deposited in the current phase
  uint32_t phase = 0;
  uintptr_t site = 0;         // call site of the current phase (its return address)
  uint32_t order = 0;         // and its order (reconvergence, see settle_exchanges)
  uintptr_t reserved = 0;     // when set, only this call site may start gathering
  uint32_t deposited[2] = {0, 0};
  uint32_t completed[2] = {0, 0};
  bool claimed[2] = {false, false};  // a lane has returned from the phase (see info[2])
  alignas(64) unsigned char slots[2][kSimdWidth][kSlotBytes];
};

// Fiber stacks of one OS thread, reused across threadgroups and calls: one reserved
// region of stacks, each with a guard page below it. The guard page makes the stride an odd
// number of pages: with a power-of-two stride the 1,024 stack tops fall into a few sets of
// the TLB, and every switch waits for a page walk (block_softmax ran 2x slower).
struct StackPool {
  char* base = nullptr;
  size_t guard = 0;
  size_t stride = 0;
  size_t ready = 0;  // stacks whose guard page is set
  ~StackPool() {
    if (base != nullptr) munmap(base, stride * kMaxFibers);
  }
  void* get(size_t i) {
    if (base == nullptr) {
      guard = size_t(getpagesize());
      stride = kStackBytes + guard;
      void* region = mmap(nullptr, stride * kMaxFibers, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (region == MAP_FAILED) throw std::runtime_error("cannot allocate fiber stacks");
      base = static_cast<char*>(region);
    }
    for (; ready <= i; ++ready) mprotect(base + ready * stride, guard, PROT_NONE);  // overflow faults
    return base + i * stride + guard;
  }
};

// One threadgroup's run. One per OS thread, reused: its vectors keep their memory (for
// 1,024 threads the SIMD-groups' slots alone are 130 KiB, which malloc would map and unmap
// for every group).
struct GroupRun {
  ThreadFunction function = nullptr;
  void* const* addresses = nullptr;
  const uint32_t* dims = nullptr;
  uint32_t group = 0;
  const Schedule* schedule = nullptr;
  std::vector<Fiber> fibers;
  std::vector<SimdGroup> simds;
  std::vector<uint32_t> order;     // the order threads resume in, within a barrier interval
  std::vector<uint32_t> position;  // thread -> its index in `order`
  uint64_t intervals = 0;          // barrier intervals so far (seeds the permutations)
  void* scheduler = nullptr;
  Fiber* current = nullptr;
  uint32_t runnable = 0;           // fibers in State::Ready, the running one included
  uint32_t at_barrier = 0;
  uint32_t done = 0;
};

// Read on every barrier and collective: initial-exec skips __tls_get_addr (the extension
// is dlopen'ed), using glibc's static TLS reserve for one pointer.
__attribute__((tls_model("initial-exec"))) thread_local GroupRun* current_run = nullptr;
thread_local GroupRun group_run;
thread_local StackPool stack_pool;

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Fisher-Yates shuffle driven by splitmix64 from `state`.
void shuffle(std::vector<uint32_t>& order, uint64_t state) {
  for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[splitmix64(state) % i]);
}

// A fresh resume order for the next barrier interval: thread order, or in permuted mode a
// shuffle that depends only on (seed, group, interval), so a failing order can be replayed.
void plan_interval(GroupRun& run) {
  if (run.schedule->permute) {
    shuffle(run.order, run.schedule->seed ^ (uint64_t(run.group) << 32) ^ run.intervals);
    for (uint32_t i = 0; i < run.order.size(); ++i) run.position[run.order[i]] = i;
  }
  run.intervals++;
}

void make_ready(GroupRun& run, Fiber& f) {
  f.state = State::Ready;
  run.runnable++;
}

// The next fiber to run after `after` in resume order (wrapping), or nullptr.
Fiber* next_ready(GroupRun& run, uint32_t after) {
  if (run.runnable == 0) return nullptr;
  const uint32_t n = uint32_t(run.order.size());
  uint32_t at = run.position[after];
  for (uint32_t step = 0; step < n; ++step) {
    if (++at == n) at = 0;
    Fiber& f = run.fibers[run.order[at]];
    if (f.state == State::Ready) return &f;
  }
  return nullptr;
}

// Indices in run.fibers of SIMD-group `simd`'s lanes: [first, second).
std::pair<size_t, size_t> lanes_of(const GroupRun& run, uint32_t simd) {
  size_t begin = size_t(simd) * kSimdWidth;
  return {begin, std::min(run.fibers.size(), begin + kSimdWidth)};
}

// Unpermuted schedules: the next ready lane of `self`'s own SIMD-group (after it,
// wrapping), else the next ready fiber after that SIMD-group. Lanes freed by a collective
// thus run again while their frames are still in cache, instead of after every other
// fiber of the threadgroup (a SIMD-group's 32 frames fit in L1; 1,024 threads' do not).
Fiber* next_ready_simd_first(GroupRun& run, const Fiber& self) {
  auto [begin, end] = lanes_of(run, self.simd);
  for (size_t t = self.thread + 1; t < end; ++t) {
    if (run.fibers[t].state == State::Ready) return &run.fibers[t];
  }
  for (size_t t = begin; t < self.thread; ++t) {
    if (run.fibers[t].state == State::Ready) return &run.fibers[t];
  }
  return next_ready(run, uint32_t(end - 1));
}

// Starts loading the saved registers and frame tops of the two fibers after `next` in
// resume order: each switch otherwise waits on cache misses for the incoming fiber's stack
// (1,024 fibers' frames do not stay in cache). block_softmax 4096^2 runs about 1.3x
// faster (benchmarks/cooperative.py); more lines or fibers ahead measured no better.
inline void prefetch_stack_top(const Fiber& f) {
  const auto* sp = static_cast<const char*>(f.sp);
#if defined(__x86_64__)
  // GCC 12 drops __builtin_prefetch here (none is emitted), so the instruction is spelled out.
  asm volatile("prefetcht0 (%0)\n\tprefetcht0 64(%0)" : : "r"(sp));
#else
  __builtin_prefetch(sp);
  __builtin_prefetch(sp + 64);
#endif
}

inline void prefetch_followers(const GroupRun& run, const Fiber& next) {
  size_t at = run.position[next.thread] + 1;
  if (at < run.order.size()) prefetch_stack_top(run.fibers[run.order[at]]);
  if (at + 1 < run.order.size()) prefetch_stack_top(run.fibers[run.order[at + 1]]);
}

// The running fiber stops (its state is already set): hand over straight to the next
// ready fiber, or to the scheduler when none is ready. `from_start`: resume in order
// from the first thread of a new barrier interval.
void hand_over(GroupRun& run, bool from_start = false) {
  Fiber& self = *run.current;
  Fiber* next = from_start              ? next_ready(run, run.order.back())
                : run.schedule->permute ? next_ready(run, self.thread)
                                        : next_ready_simd_first(run, self);
  if (next == &self) return;
  if (next == nullptr) {
    tm_fiber_switch(&self.sp, run.scheduler);
    return;
  }
  run.current = next;
  prefetch_followers(run, *next);
  tm_fiber_switch(&self.sp, next->sp);
}

void block(GroupRun& run, State state, bool from_start = false) {
  run.current->state = state;
  run.runnable--;
  hand_over(run, from_start);
}

// Threads a barrier waits for. Apple GPUs let threads that finished pass (MLX's gemv
// kernels rely on it); Metal leaves it undefined, so the debug schedules wait for all.
uint32_t barrier_quorum(const GroupRun& run) {
  return uint32_t(run.fibers.size()) - (run.schedule->strict_barriers ? 0 : run.done);
}

// Everyone at the barrier goes on; the next interval starts from its first thread.
void release_barrier(GroupRun& run) {
  run.at_barrier = 0;
  for (auto& f : run.fibers) {
    if (f.state == State::AtBarrier) make_ready(run, f);
  }
  plan_interval(run);
}

// Copies a lane's value in 4-byte pieces: the kernel has just stored it in pieces of at
// least that size, and 8-byte loads spanning two 4-byte stores stall store forwarding
// (memcpy's did: half the time of a simdgroup-matrix multiply went there).
inline void deposit(unsigned char* slot, const void* value, uint32_t bytes) {
  const auto* from = static_cast<const unsigned char*>(value);
  uint32_t i = 0;
  for (; i + 4 <= bytes; i += 4) {
    uint32_t piece;
    std::memcpy(&piece, from + i, 4);
    asm("" : "+r"(piece));  // keeps the compiler from merging pieces into wider loads
    std::memcpy(slot + i, &piece, 4);
  }
  for (; i < bytes; ++i) slot[i] = from[i];
}

void complete_exchange(GroupRun& run, uint32_t simd) {
  SimdGroup& s = run.simds[simd];
  uint32_t p = s.phase & 1;
  s.completed[p] = s.deposited[p];
  s.claimed[p] = false;
  s.deposited[p ^ 1] = 0;
  s.arrived = 0;
  s.reserved = 0;
  s.phase++;
  auto [begin, end] = lanes_of(run, simd);
  for (size_t t = begin; t < end; ++t) {
    Fiber& f = run.fibers[t];
    if (f.state == State::InExchange || f.state == State::WaitingToExchange) make_ready(run, f);
  }
}

// Called when every fiber waits. Lanes gathered at a collective are its active lanes (the
// others are in divergent code or at a barrier), unless other lanes wait at a call site of
// lower order: those are inside a branch or loop the gathered lanes have left, and on
// Metal the SIMD-group reconverges only after them. Then the gathered lanes step back
// (they deposit again later) and the lowest site goes first. Returns whether it changed
// anything.
bool settle_exchanges(GroupRun& run, uint32_t simd) {
  SimdGroup& s = run.simds[simd];
  auto [begin, end] = lanes_of(run, simd);
  Fiber* first = nullptr;  // the waiting lane at the lowest site
  for (size_t t = begin; t < end; ++t) {
    Fiber& f = run.fibers[t];
    if (f.state == State::WaitingToExchange && (first == nullptr || f.order < first->order)) first = &f;
  }
  if (s.arrived > 0 && (first == nullptr || first->order >= s.order)) {
    complete_exchange(run, simd);
    return true;
  }
  if (first == nullptr) return false;
  s.reserved = s.arrived > 0 ? first->site : 0;  // none gathered: let the waiting lanes race again
  s.arrived = 0;
  s.deposited[s.phase & 1] = 0;
  for (size_t t = begin; t < end; ++t) {
    Fiber& f = run.fibers[t];
    if (f.state == State::InExchange) f.stepped_back = true;
    if (f.state == State::InExchange || f.state == State::WaitingToExchange) make_ready(run, f);
  }
  return true;
}

void fiber_main(void* argument) {
  auto* fiber = static_cast<Fiber*>(argument);
  GroupRun& run = *current_run;
  run.function(run.addresses, run.dims, run.group, fiber->thread);
  run.done++;
  SimdGroup& s = run.simds[fiber->simd];
  s.live--;
  if (s.arrived > 0 && s.arrived == s.live) complete_exchange(run, fiber->simd);
  bool released = run.at_barrier > 0 && run.at_barrier == barrier_quorum(run);
  if (released) release_barrier(run);
  block(run, State::Done, released);  // never resumed
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

void run_group(ThreadFunction function, const dispatch::Plan& plan, uint32_t group, const std::string& kernel,
               const Schedule& schedule) {
  const uint32_t* dims = plan.dims;
  uint32_t actual[3];
  for (int axis = 0; axis < 3; ++axis) {
    uint32_t origin = (axis == 0 ? group % dims[6] : axis == 1 ? (group / dims[6]) % dims[7] : group / (dims[6] * dims[7])) * dims[3 + axis];
    actual[axis] = std::min(dims[3 + axis], dims[axis] - origin);
  }
  uint32_t threads = actual[0] * actual[1] * actual[2];
  GroupRun& run = group_run;
  run.function = function;
  run.addresses = threadgroup_memory.prepare(plan);
  run.dims = dims;
  run.group = group;
  run.schedule = &schedule;
  run.fibers.assign(threads, Fiber{});
  run.simds.resize((threads + kSimdWidth - 1) / kSimdWidth);
  for (SimdGroup& s : run.simds) {
    s.live = s.arrived = s.phase = s.deposited[0] = s.deposited[1] = 0;
    s.claimed[0] = s.claimed[1] = false;
    s.reserved = 0;
  }
  run.order.resize(threads);
  run.position.resize(threads);
  run.intervals = 0;
  run.at_barrier = run.done = 0;
  for (uint32_t t = 0; t < threads; ++t) {
    Fiber& f = run.fibers[t];
    f.thread = t;
    f.simd = t / kSimdWidth;
    f.lane = t % kSimdWidth;
    run.simds[f.simd].live++;
    run.order[t] = run.position[t] = t;
    // Stack tops at different offsets modulo 64 KiB: stacks are 256 KiB-aligned, so at one
    // offset the hot top lines of all stacks would compete for the same L1 and L2 sets.
    size_t colour = (t % 1024) * 64;
    f.sp = fiber_prepare(stack_pool.get(t), kStackBytes - colour, &fiber_main, &f);
  }
  run.runnable = threads;
  plan_interval(run);
  current_run = &run;
  while (run.done < threads) {
    if (Fiber* next = next_ready(run, run.order.back())) {
      run.current = next;
      tm_fiber_switch(&run.scheduler, next->sp);
      continue;
    }
    bool progress = false;
    for (uint32_t simd = 0; simd < run.simds.size(); ++simd) progress |= settle_exchanges(run, simd);
    if (!progress) {
      current_run = nullptr;
      throw ExecutionError(kernel + ": deadlock in threadgroup " + group_name(dims, group) + ": " +
                           std::to_string(run.at_barrier) + " of " + std::to_string(threads) +
                           " threads wait at a threadgroup barrier that " + std::to_string(run.done) +
                           " threads finished without reaching. In the sequential and permuted schedules "
                           "every thread of a threadgroup must reach each threadgroup_barrier (Metal leaves "
                           "it undefined otherwise; Apple GPUs and the parallel schedule let finished "
                           "threads pass)");
    }
  }
  current_run = nullptr;
}

}  // namespace

void launch_cooperative(const dispatch::Plan& plan, const std::vector<uintptr_t>& thread_functions,
                        bool private_copies, const std::string& kernel, const Schedule& schedule) {
  if (!fibers_supported()) {
    throw ExecutionError(kernel + ": cooperative kernels need fibers, which this CPU architecture lacks");
  }
  const int64_t groups = int64_t(plan.group_count);
  bool parallel = schedule.parallel && groups > 1 &&
                  (!private_copies || thread_functions.size() >= size_t(at::get_num_threads()));
  if (!parallel) {
    auto function = reinterpret_cast<ThreadFunction>(thread_functions.at(0));
    std::vector<uint32_t> order(static_cast<size_t>(groups));
    for (uint32_t g = 0; g < order.size(); ++g) order[g] = g;
    if (schedule.permute) shuffle(order, schedule.seed);
    for (uint32_t g : order) run_group(function, plan, g, kernel, schedule);
    return;
  }
  at::parallel_for(0, groups, 1, [&](int64_t first, int64_t end) {
    auto function = reinterpret_cast<ThreadFunction>(
        thread_functions.at(size_t(private_copies ? at::get_thread_num() : 0)));
    for (int64_t g = first; g < end; ++g) run_group(function, plan, uint32_t(g), kernel, schedule);
  });
}

}  // namespace torch_metallib::cpu

using torch_metallib::cpu::current_run;
using torch_metallib::cpu::State;
using torch_metallib::cpu::block;
using torch_metallib::cpu::deposit;
using torch_metallib::cpu::kSlotBytes;
using torch_metallib::cpu::hand_over;
using torch_metallib::cpu::barrier_quorum;
using torch_metallib::cpu::release_barrier;

extern "C" void tm_rt_barrier() {
  auto& run = *current_run;
  if (++run.at_barrier < barrier_quorum(run)) {
    block(run, State::AtBarrier);
    return;
  }
  release_barrier(run);  // the last to arrive releases everyone
  hand_over(run, /*from_start=*/true);
}

extern "C" const void* tm_rt_simd_exchange(const void* value, uint32_t bytes, uint32_t* info, uint32_t order) {
  auto& run = *current_run;
  auto& fiber = *run.current;
  auto& s = run.simds[fiber.simd];
  auto site = reinterpret_cast<uintptr_t>(__builtin_return_address(0));
  fiber.site = site;  // read by settle_exchanges while this lane waits to enter
  fiber.order = order;
  uint32_t p;
  for (;;) {
    // Wait while another collective gathers, or one that must go first (settle_exchanges).
    while ((s.arrived > 0 && s.site != site) || (s.reserved != 0 && s.reserved != site)) {
      block(run, State::WaitingToExchange);
    }
    uint32_t phase = s.phase;
    p = phase & 1;
    s.site = site;
    s.order = order;
    deposit(s.slots[p][fiber.lane], value, std::min<uint32_t>(bytes, kSlotBytes));
    s.deposited[p] |= 1u << fiber.lane;
    if (++s.arrived == s.live) {
      torch_metallib::cpu::complete_exchange(run, fiber.simd);
      break;
    }
    while (s.phase == phase && !fiber.stepped_back) block(run, State::InExchange);
    if (!fiber.stepped_back) break;
    fiber.stepped_back = false;
  }
  if (info != nullptr) {
    info[0] = s.completed[p];
    info[1] = fiber.lane;
    info[2] = !s.claimed[p];
    s.claimed[p] = true;
  }
  return s.slots[p];
}

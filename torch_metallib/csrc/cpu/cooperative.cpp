#include "cpu/cooperative.h"
#include "cpu/bounds_check.h"
#include "cpu/private_copies.h"
#include "cpu/threadgroup_memory.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace torch_metallib::cpu {
namespace {

constexpr uint32_t kSimdWidth = 32;
constexpr uint32_t kSlotBytes = 64;
constexpr size_t kFrameAlign = 64;  // coroutine frames hold spilled vectors; a cache line each

enum class State { Ready, AtBarrier, InExchange, WaitingToExchange, Done };

// One exchange's result, as JIT-compiled kernels read it (air/target.py: MASK_OFFSET, CLAIMED_OFFSET).
struct alignas(64) ExchangePhase {
  unsigned char slots[kSimdWidth][kSlotBytes];  // lane l's value at slots[l]
  uint32_t mask;                                // the lanes that took part
  uint32_t claimed;                             // 0 until a lane has read the result: the first computes shared results
};
static_assert(offsetof(ExchangePhase, mask) == kSimdWidth * kSlotBytes &&
                  offsetof(ExchangePhase, claimed) == kSimdWidth * kSlotBytes + 4,
              "the layout air/target.py reads");

// One GPU thread of the running threadgroup: a coroutine (see backends/cpu/coroutine.py).
struct Thread {
  void* frame = nullptr;  // its coroutine frame once started; the first word is its resume function
  uint32_t thread = 0;
  uint32_t simd = 0;
  uint32_t lane = 0;
  State state = State::Ready;
  uint32_t site = 0;   // the collective it waits at or to enter,
  uint32_t order = 0;  // and that call site's order
  // InExchange: where to put the slots when the exchange completes. A lane resumed without
  // them (stepped back, or waiting to enter) calls tm_rt_simd_exchange again.
  ExchangeWait* waiting = nullptr;
};

// One SIMD-group's exchange: lanes deposit into the slots of the current phase; two
// phases alternate so a lane may start the next exchange while others still read.
struct SimdGroup {
  uint32_t live = 0;     // lanes not finished
  uint32_t arrived = 0;  // lanes deposited in the current phase
  uint32_t phase = 0;
  uint32_t site = 0;      // call site of the current phase
  uint32_t order = 0;     // and its order (reconvergence, see settle_exchanges)
  uint32_t reserved = 0;  // when set, only this call site may start gathering
  uint32_t deposited[2] = {0, 0};
  ExchangePhase phases[2];
  std::vector<float> staging[2];  // per phase: what tm_rt_simd_stage hands out (grown, kept)
};

// Coroutine frames of one OS thread, reused across threadgroups and calls: thread t's frame
// at t * stride, so a SIMD-group's frames are neighbours in memory.
struct FrameArena {
  std::unique_ptr<unsigned char, decltype(&std::free)> memory{nullptr, &std::free};
  size_t capacity = 0;
  unsigned char* reserve(size_t bytes) {
    if (bytes > capacity) {
      memory.reset(static_cast<unsigned char*>(std::aligned_alloc(kFrameAlign, bytes)));
      if (!memory) throw std::runtime_error("cannot allocate coroutine frames");
      capacity = bytes;
    }
    return memory.get();
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
  std::vector<Thread> threads;
  std::vector<SimdGroup> simds;
  std::vector<uint32_t> order;     // the order threads resume in, within a barrier interval
  std::vector<uint32_t> position;  // thread -> its index in `order`
  uint64_t intervals = 0;          // barrier intervals so far (seeds the permutations)
  unsigned char* frames = nullptr;
  size_t frame_stride = 0;  // 0 until the first thread asks for its frame
  Thread* current = nullptr;
  bool checked = false;            // checked execution: tell the checks which thread runs
  uint32_t origin[3] = {0, 0, 0};  // the group's first thread in the grid
  uint32_t actual[3] = {1, 1, 1};  // its size, cut at the grid edge
  bool from_start = false;         // a barrier opened: resume from the first thread in order
  uint32_t runnable = 0;           // threads in State::Ready, the running one included
  uint32_t at_barrier = 0;
  uint32_t done = 0;
  uint32_t barrier_site = 0;    // the barrier the waiting threads wait at (0: none)
  uint32_t barrier_thread = 0;  // the first of them
  std::string divergence;       // checked execution: threads waiting at different barriers
};

// Read on every barrier and collective: initial-exec skips __tls_get_addr (the extension
// is dlopen'ed), using glibc's static TLS reserve for one pointer.
__attribute__((tls_model("initial-exec"))) thread_local GroupRun* current_run = nullptr;
thread_local GroupRun group_run;
thread_local FrameArena frame_arena;

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

void make_ready(GroupRun& run, Thread& t) {
  t.state = State::Ready;
  run.runnable++;
}

// The running thread stops in `state`: it suspends when its runtime call returns.
void wait(GroupRun& run, State state) {
  run.current->state = state;
  run.runnable--;
}

// The next thread to run after `after` in resume order (wrapping), or nullptr.
Thread* next_ready(GroupRun& run, uint32_t after) {
  if (run.runnable == 0) return nullptr;
  const uint32_t n = uint32_t(run.order.size());
  uint32_t at = run.position[after];
  for (uint32_t step = 0; step < n; ++step) {
    if (++at == n) at = 0;
    Thread& t = run.threads[run.order[at]];
    if (t.state == State::Ready) return &t;
  }
  return nullptr;
}

// Indices in run.threads of SIMD-group `simd`'s lanes: [first, second).
std::pair<size_t, size_t> lanes_of(const GroupRun& run, uint32_t simd) {
  size_t begin = size_t(simd) * kSimdWidth;
  return {begin, std::min(run.threads.size(), begin + kSimdWidth)};
}

// Unpermuted schedules: the next ready lane of `self`'s own SIMD-group (after it,
// wrapping), else the next ready thread after that SIMD-group. Lanes freed by a collective
// thus run again while their frames are still in cache, instead of after every other
// thread of the threadgroup.
Thread* next_ready_simd_first(GroupRun& run, const Thread& self) {
  auto [begin, end] = lanes_of(run, self.simd);
  for (size_t t = self.thread + 1; t < end; ++t) {
    if (run.threads[t].state == State::Ready) return &run.threads[t];
  }
  for (size_t t = begin; t < self.thread; ++t) {
    if (run.threads[t].state == State::Ready) return &run.threads[t];
  }
  return next_ready(run, uint32_t(end - 1));
}

// Who runs after `self` suspended or finished.
Thread* successor(GroupRun& run, const Thread& self) {
  if (run.from_start) return next_ready(run, run.order.back());
  return run.schedule->permute ? next_ready(run, self.thread) : next_ready_simd_first(run, self);
}

// Threads a barrier waits for. Apple GPUs let threads that finished pass (MLX's gemv
// kernels rely on it); Metal leaves it undefined, so the debug schedules wait for all.
uint32_t barrier_quorum(const GroupRun& run) {
  return uint32_t(run.threads.size()) - (run.schedule->strict_barriers ? 0 : run.done);
}

// Everyone at the barrier goes on; the next interval starts from its first thread.
void release_barrier(GroupRun& run) {
  run.at_barrier = 0;
  for (auto& t : run.threads) {
    if (t.state == State::AtBarrier) make_ready(run, t);
  }
  plan_interval(run);
  run.from_start = true;
}

std::string position_of(const GroupRun& run, uint32_t i) {
  const uint32_t x = run.actual[0], xy = run.actual[0] * run.actual[1];
  return "(" + std::to_string(run.origin[0] + i % x) + ", " + std::to_string(run.origin[1] + (i % xy) / x) + ", " +
         std::to_string(run.origin[2] + i / xy) + ")";
}

// Checked execution's report of threads of one threadgroup waiting at different barriers
// (Metal requires every thread to reach the same barrier; what a GPU does is undefined).
std::string describe_divergence(const GroupRun& run, uint32_t site) {
  return "divergent threadgroup barriers: thread " + position_of(run, run.current->thread) +
         " waits at the kernel's barrier #" + std::to_string(site) + " while thread " +
         position_of(run, run.barrier_thread) + " of the same threadgroup waits at barrier #" +
         std::to_string(run.barrier_site) +
         " (barriers numbered in the order of the compiled code). "
         "Every thread of a threadgroup must reach the same threadgroup_barrier: move the barrier out of "
         "the branch";
}

// Copies a lane's value in 4-byte pieces: the kernel has just stored it in pieces of at
// least that size, and 8-byte loads spanning two 4-byte stores stall store forwarding
// (memcpy's did, when simdgroup-matrix products still deposited their fragments here).
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
  s.phases[p].mask = s.deposited[p];
  s.phases[p].claimed = 0;
  s.deposited[p ^ 1] = 0;
  s.arrived = 0;
  s.reserved = 0;
  s.phase++;
  auto [begin, end] = lanes_of(run, simd);
  for (size_t i = begin; i < end; ++i) {
    Thread& t = run.threads[i];
    if (t.state == State::InExchange) t.waiting->slots = s.phases[p].slots;  // read when resumed
    if (t.state == State::InExchange || t.state == State::WaitingToExchange) make_ready(run, t);
  }
}

// Called when no thread is ready. Lanes gathered at a collective are its active lanes (the
// others are in divergent code or at a barrier), unless other lanes wait at a call site of
// lower order: those are inside a branch or loop the gathered lanes have left, and on
// Metal the SIMD-group reconverges only after them. Then the gathered lanes step back
// (they deposit again later) and the lowest site goes first. Returns whether it changed
// anything.
bool settle_exchanges(GroupRun& run, uint32_t simd) {
  SimdGroup& s = run.simds[simd];
  auto [begin, end] = lanes_of(run, simd);
  Thread* first = nullptr;  // the waiting lane at the lowest site
  for (size_t i = begin; i < end; ++i) {
    Thread& t = run.threads[i];
    if (t.state == State::WaitingToExchange && (first == nullptr || t.order < first->order)) first = &t;
  }
  if (s.arrived > 0 && (first == nullptr || first->order >= s.order)) {
    complete_exchange(run, simd);
    return true;
  }
  if (first == nullptr) return false;
  s.reserved = s.arrived > 0 ? first->site : 0;  // none gathered: let the waiting lanes race again
  s.arrived = 0;
  s.deposited[s.phase & 1] = 0;
  for (size_t i = begin; i < end; ++i) {
    Thread& t = run.threads[i];
    if (t.state == State::InExchange || t.state == State::WaitingToExchange) make_ready(run, t);
  }
  return true;
}

// Starts `t` (its coroutine runs to its first suspension or its end) or resumes it.
inline void run_thread(GroupRun& run, Thread& t) {
  run.current = &t;
  if (run.checked) {
    const uint32_t i = t.thread, x = run.actual[0], xy = run.actual[0] * run.actual[1];
    set_check_thread(run.origin[0] + i % x, run.origin[1] + (i % xy) / x, run.origin[2] + i / xy);
  }
  run.from_start = false;
  if (t.frame == nullptr) {
    t.frame = run.function(run.addresses, run.dims, run.group, t.thread);
  } else {
    (*static_cast<void (**)(void*)>(t.frame))(t.frame);  // the switch-resumed coroutine ABI
  }
}

// `run`: this OS thread's group_run, passed to a function GCC does not inline or specialize
// for it (noipa): GCC recomputes a thread_local's address after every call it can see across,
// which cost a __tls_get_addr call per resumed thread.
__attribute__((noipa)) void run_group(GroupRun& run, ThreadFunction function, const dispatch::Plan& plan,
                                      uint32_t group, const std::string& kernel, const Schedule& schedule,
                                      bool checked) {
  const uint32_t* dims = plan.dims;
  uint32_t* actual = run.actual;
  for (int axis = 0; axis < 3; ++axis) {
    uint32_t origin = (axis == 0   ? group % dims[6]
                       : axis == 1 ? (group / dims[6]) % dims[7]
                                   : group / (dims[6] * dims[7])) *
                      dims[3 + axis];
    run.origin[axis] = origin;
    actual[axis] = std::min(dims[3 + axis], dims[axis] - origin);
  }
  uint32_t count = actual[0] * actual[1] * actual[2];
  run.function = function;
  run.checked = checked;
  run.addresses = threadgroup_memory().prepare(plan);
  if (checked) set_check_group_addresses(run.addresses);
  run.dims = dims;
  run.group = group;
  run.schedule = &schedule;
  run.threads.assign(count, Thread{});
  run.simds.resize((count + kSimdWidth - 1) / kSimdWidth);
  for (SimdGroup& s : run.simds) {
    s.live = s.arrived = s.phase = s.deposited[0] = s.deposited[1] = 0;
    s.reserved = 0;
  }
  run.order.resize(count);
  run.position.resize(count);
  run.intervals = 0;
  run.frame_stride = 0;
  run.at_barrier = run.done = 0;
  for (uint32_t i = 0; i < count; ++i) {
    Thread& t = run.threads[i];
    t.thread = i;
    t.simd = i / kSimdWidth;
    t.lane = i % kSimdWidth;
    run.simds[t.simd].live++;
    run.order[i] = run.position[i] = i;
  }
  run.runnable = count;
  plan_interval(run);
  current_run = &run;
  Thread* next = next_ready(run, run.order.back());
  run.divergence.clear();
  while (run.done < count) {
    if (next != nullptr) {
      run_thread(run, *next);
      if (!run.divergence.empty()) {
        current_run = nullptr;
        throw ExecutionError(kernel + ": " + run.divergence);
      }
      next = successor(run, *run.current);
      continue;
    }
    bool progress = false;
    for (uint32_t simd = 0; simd < run.simds.size(); ++simd) progress |= settle_exchanges(run, simd);
    if (!progress) {
      current_run = nullptr;
      throw ExecutionError(deadlock_message(kernel, dims, group, run.at_barrier, count, run.done));
    }
    next = next_ready(run, run.order.back());
  }
  current_run = nullptr;
}

// The running lane enters its SIMD-group's exchange at `site`, unless another collective
// gathers or one must go first (settle_exchanges): then it waits to enter and this returns
// false. Sets waiting->lane; waiting->slots stays null until the exchange completes.
[[gnu::always_inline]] inline bool enter_exchange(GroupRun& run, ExchangeWait* waiting, uint32_t order, uint32_t site) {
  auto& t = *run.current;
  auto& s = run.simds[t.simd];
  waiting->slots = nullptr;
  waiting->lane = t.lane;
  t.site = site;  // read by settle_exchanges while this lane waits to enter
  t.order = order;
  if ((s.arrived > 0 && s.site != site) || (s.reserved != 0 && s.reserved != site)) {
    wait(run, State::WaitingToExchange);
    return false;
  }
  s.site = site;
  s.order = order;
  return true;
}

// The entered lane has deposited: it waits, or, the last to arrive, completes the exchange
// and finds the slots in waiting->slots.
[[gnu::always_inline]] inline void arrive(GroupRun& run, ExchangeWait* waiting) {
  auto& t = *run.current;
  auto& s = run.simds[t.simd];
  uint32_t p = s.phase & 1;
  s.deposited[p] |= 1u << t.lane;
  if (++s.arrived != s.live) {
    t.waiting = waiting;
    wait(run, State::InExchange);
    return;
  }
  complete_exchange(run, t.simd);
  waiting->slots = s.phases[p].slots;
}

}  // namespace

std::string deadlock_message(const std::string& kernel, const uint32_t* dims, uint32_t group, uint32_t waiting,
                             uint32_t count, uint32_t done) {
  uint32_t x = group % dims[6], y = (group / dims[6]) % dims[7], z = group / (dims[6] * dims[7]);
  return kernel + ": deadlock in threadgroup (" + std::to_string(x) + ", " + std::to_string(y) + ", " +
         std::to_string(z) + "): " + std::to_string(waiting) + " of " + std::to_string(count) +
         " threads wait at a threadgroup barrier that " + std::to_string(done) +
         " threads finished without reaching. In the sequential and permuted schedules "
         "every thread of a threadgroup must reach each threadgroup_barrier (Metal leaves "
         "it undefined otherwise; Apple GPUs and the parallel schedule let finished threads pass)";
}

void launch_cooperative(const dispatch::Plan& plan, const std::vector<uintptr_t>& thread_functions, bool private_copies,
                        const std::string& kernel, const Schedule& schedule, CheckedLaunch* checked) {
  const bool check = checked != nullptr;
  const int64_t groups = int64_t(plan.group_count);
  bool parallel =
      schedule.parallel && groups > 1 && (!private_copies || thread_functions.size() >= size_t(at::get_num_threads()));
  if (!parallel) {
    CopyLease copy(thread_functions, private_copies);
    CheckedLaunch::Scope scope(checked);
    auto function = reinterpret_cast<ThreadFunction>(copy.address());
    std::vector<uint32_t> order(static_cast<size_t>(groups));
    for (uint32_t g = 0; g < order.size(); ++g) order[g] = g;
    if (schedule.permute) shuffle(order, schedule.seed);
    GroupRun* run = &group_run;
    for (uint32_t g : order) run_group(*run, function, plan, g, kernel, schedule, check);
    return;
  }
  at::parallel_for(0, groups, 1, [&](int64_t first, int64_t end) {
    CopyLease copy(thread_functions, private_copies);
    CheckedLaunch::Scope scope(checked);
    auto function = reinterpret_cast<ThreadFunction>(copy.address());
    GroupRun* run = &group_run;
    for (int64_t g = first; g < end; ++g) run_group(*run, function, plan, uint32_t(g), kernel, schedule, check);
  });
}

}  // namespace torch_metallib::cpu

using torch_metallib::cpu::current_run;
using torch_metallib::cpu::State;

extern "C" void* tm_rt_frame(uint64_t bytes) {
  auto& run = *current_run;
  if (run.frame_stride == 0) {  // the group's first thread: every thread of a kernel asks the same size
    run.frame_stride = (size_t(bytes) + torch_metallib::cpu::kFrameAlign - 1) & ~(torch_metallib::cpu::kFrameAlign - 1);
    run.frames = torch_metallib::cpu::frame_arena.reserve(run.frame_stride * run.threads.size());
  }
  return run.frames + run.current->thread * run.frame_stride;
}

extern "C" void tm_rt_barrier(uint32_t site) {
  auto& run = *current_run;
  if (run.at_barrier == 0) {
    run.barrier_site = site;
    run.barrier_thread = run.current->thread;
  } else if (site != run.barrier_site && run.checked && run.divergence.empty()) {
    run.divergence = torch_metallib::cpu::describe_divergence(run, site);
  }
  torch_metallib::cpu::wait(run, State::AtBarrier);
  if (++run.at_barrier >= torch_metallib::cpu::barrier_quorum(run)) {
    torch_metallib::cpu::release_barrier(run);  // the last to arrive releases everyone
  }
}

extern "C" uint32_t tm_rt_thread_in_group() { return current_run->current->thread; }

extern "C" void tm_rt_finished() {
  auto& run = *current_run;
  auto& t = *run.current;
  run.done++;
  auto& s = run.simds[t.simd];
  s.live--;
  if (s.arrived > 0 && s.arrived == s.live) torch_metallib::cpu::complete_exchange(run, t.simd);
  torch_metallib::cpu::wait(run, State::Done);
  if (run.at_barrier > 0 && run.at_barrier == torch_metallib::cpu::barrier_quorum(run)) {
    torch_metallib::cpu::release_barrier(run);
  }
}

extern "C" const void* tm_rt_simd_exchange(const void* value, uint32_t bytes, ExchangeWait* waiting, uint32_t order,
                                           uint32_t site) {
  using namespace torch_metallib::cpu;
  auto& run = *current_run;
  if (!enter_exchange(run, waiting, order, site)) return nullptr;
  auto& s = run.simds[run.current->simd];
  deposit(s.phases[s.phase & 1].slots[run.current->lane], value, std::min<uint32_t>(bytes, kSlotBytes));
  arrive(run, waiting);
  return waiting->slots;
}

extern "C" void* tm_rt_simd_stage(uint64_t bytes, ExchangeWait* waiting, uint32_t order, uint32_t site) {
  using namespace torch_metallib::cpu;
  auto& run = *current_run;
  if (!enter_exchange(run, waiting, order, site)) return nullptr;
  auto& s = run.simds[run.current->simd];
  // Every lane at a site asks the same size; a buffer grows only while no lane uses it (its
  // phase's lanes have all read it before any lane enters this phase again).
  auto& staging = s.staging[s.phase & 1];
  if (staging.size() * sizeof(float) < bytes) staging.resize((bytes + sizeof(float) - 1) / sizeof(float));
  arrive(run, waiting);
  return staging.data();
}

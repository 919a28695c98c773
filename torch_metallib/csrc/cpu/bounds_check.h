// Checked execution's runtime (backends/cpu/bounds_checks.py instruments the kernel): an
// access attributed to one argument is compared inline against that argument's bounds in
// the running launch's table (tm_rt_check_context); only a failing or unattributed access
// asks tm_rt_check, which knows threadgroup buffers, argument-buffer members and the
// module's globals. A violation is recorded (the first one, with the thread that made it)
// and the access goes to scratch memory instead, so it can neither crash nor corrupt. The
// launch then raises it.
#pragma once

#include <cstdint>
#include <atomic>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "dispatch/binding_plan.h"

namespace torch_metallib::cpu {

// Raised as torch_metallib.KernelMemoryError.
struct MemoryViolation : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// What checks compare against during one launch, and its first violation.
class CheckedLaunch {
 public:
  // `names[p]` describes IR parameter p for messages ("argument 2 'c' (buffer(2), device
  // float*)"), `spaces[p]` its address space (0 for builtins). Each argument is bounded by
  // the plan's span for it (a tensor's view, unless the call asked for its storage).
  CheckedLaunch(const dispatch::Plan& plan, std::vector<std::string> names, std::vector<int> spaces,
                std::string kernel);

  // While alive, checks on this OS thread report to `launch` (nullptr: checks pass through).
  class Scope {
   public:
    explicit Scope(CheckedLaunch* launch);
    ~Scope();

   private:
    CheckedLaunch* previous_;
  };

  // Throws MemoryViolation if an access fell outside the bound memory.
  void raise_if_violated() const;

  // The launch checks on this OS thread report to (nullptr: none), and a number that
  // changes with every Scope made on it (threadgroup_initcheck.cpp starts afresh then).
  static CheckedLaunch* current();
  static uint64_t scope_generation();

  // For the threadgroup initcheck (threadgroup_initcheck.cpp): the threadgroup of the
  // thread at grid position (x, y, z), numbered as the launch numbers them; the
  // threadgroup allocation holding address p (a threadgroup argument's buffer of the
  // running group, or a threadgroup variable of the kernel), with a name for messages;
  // and a read of `n` bytes at p whose byte `unwritten` (from p) no thread has written.
  uint64_t group_of(uint32_t x, uint32_t y, uint32_t z) const;
  bool threadgroup_allocation(uintptr_t p, uintptr_t& start, uint64_t& bytes, std::string& name) const;
  void record_uninitialized(uintptr_t p, uint64_t n, uint64_t unwritten, uintptr_t start, const std::string& name);

  // For the runtime: whether [p, p + n) is allowed for `origin` (-1: any range of `space`).
  bool allowed(uintptr_t p, uint64_t n, int origin, int space) const;
  void record(uintptr_t p, uint64_t n, int origin, int space, bool write);

  // What the inline check reads, per IR parameter (layout known to bounds_checks.py):
  // start and bytes; {0, 0} where only tm_rt_check can tell (threadgroup memory, builtins).
  struct Bounds {
    uint64_t start = 0;
    uint64_t bytes = 0;
  };
  const Bounds* bounds() const { return bounds_.data(); }
  // bounds() with the threadgroup arguments at the running group's buffers.
  void group_bounds(void* const* addresses, std::vector<Bounds>& out) const;

 private:
  struct Range {
    uintptr_t start = 0;
    uint64_t bytes = 0;
    int space = 0;
    int owner = -1;         // argument-buffer members: the IR parameter holding the pointer
    uintptr_t address = 0;  //   and the address it holds (offsets are told from there)
    bool storage = false;   //   bounded by the tensor's storage, not its view
  };
  Range range_of(int position) const;  // threadgroup arguments: the running group's buffer
  std::string describe(uintptr_t p, uint64_t n, int origin, int space, bool write) const;

  // What a violation is told against: the access's offset from the bound address, the span allowed.
  std::string against(uintptr_t p, uint64_t n, size_t position, const Range& range) const;

  std::vector<Range> ranges_;               // per IR parameter
  std::vector<Bounds> bounds_;              // per IR parameter, for the inline check
  std::vector<Range> extra_;                // argument-buffer members
  std::vector<int64_t> threadgroup_bytes_;  // per IR parameter, -1 if not threadgroup memory
  std::vector<std::string> names_;
  // Per IR parameter, for messages: where it is bound (offsets are told from there), its
  // span, and whether a tensor is bound (else the bytes of a value).
  struct Binding {
    uintptr_t address = 0;
    dispatch::Span span;
    bool tensor = false;
  };
  std::vector<Binding> bound_;
  std::string kernel_;
  uint32_t grid_[3] = {1, 1, 1};
  uint32_t group_[3] = {1, 1, 1};  // threads per threadgroup
  uint32_t groups_[2] = {1, 1};    // threadgroups along x and y
  uint64_t thread_key() const;     // the running thread, in grid order
  // Keeps the first violation in grid order: `message` is made only for one that is.
  template <typename Message>
  void report(Message message);
  mutable std::mutex mutex_;
  // The violation reported: the one of the thread first in grid order (deterministic under
  // any schedule), that thread's first; ~0 until there is one.
  std::atomic<uint64_t> reported_{~uint64_t(0)};
  std::string message_;
};

// The running thread's position in the grid, for messages (the launcher and the
// cooperative runtime set it), and the running threadgroup's addresses (threadgroup
// buffers are per group; the inline checks see them from here on, on this OS thread).
void set_check_thread(uint32_t x, uint32_t y, uint32_t z);
const uint32_t* check_thread();  // {x, y, z}
void set_check_group_addresses(void* const* addresses);

}  // namespace torch_metallib::cpu

extern "C" {
// The OS thread's check context: {uint32 thread x, y, z; uint32 unused; const Bounds*
// bounds of the launch running on it}. Constant for the life of a launch on that thread.
void* tm_rt_check_context();
// Returns `p` if [p, p + bytes) is allowed, else scratch memory of at least `bytes`.
// flags: bit 0 a write, bits 8-15 the address space; origin: the kernel parameter, or -1;
// (x, y, z) the thread's position in grid, or x = -1 where the context's thread holds.
void* tm_rt_check(void* p, uint64_t bytes, int32_t origin, int32_t flags, int32_t x, int32_t y, int32_t z);
// A module's constant or threadgroup global (registered once per loaded copy).
// `name`: the variable's name for messages (a string the module keeps).
void tm_rt_check_static(void* p, uint64_t bytes, int32_t space, const char* name);
}

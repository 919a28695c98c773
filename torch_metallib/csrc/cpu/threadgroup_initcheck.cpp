#include "cpu/threadgroup_initcheck.h"

#include <algorithm>
#include <string>
#include <vector>

#include "cpu/bounds_check.h"

namespace torch_metallib::cpu {
namespace {

struct Allocation {
  uintptr_t start = 0;
  uint64_t bytes = 0;
  std::string name;
  std::vector<uint8_t> written;  // one per byte
};

// The threadgroup running on this OS thread: which one, and what its threads wrote.
struct GroupShadow {
  const CheckedLaunch* launch = nullptr;
  uint64_t scope = ~uint64_t(0);
  uint64_t group = ~uint64_t(0);
  bool unseen = false;  // written by code the checks cannot see: every read passes
  std::vector<Allocation> allocations;
};
thread_local GroupShadow shadow;

// The running threadgroup's shadow (empty if the threadgroup is new), or nullptr outside a
// checked launch.
GroupShadow* running(int32_t x, int32_t y, int32_t z) {
  CheckedLaunch* launch = CheckedLaunch::current();
  if (launch == nullptr) return nullptr;
  if (x != -1) set_check_thread(uint32_t(x), uint32_t(y), uint32_t(z));
  const uint32_t* thread = check_thread();
  const uint64_t group = launch->group_of(thread[0], thread[1], thread[2]);
  const uint64_t scope = CheckedLaunch::scope_generation();
  if (shadow.launch != launch || shadow.scope != scope || shadow.group != group) {
    shadow.launch = launch;
    shadow.scope = scope;
    shadow.group = group;
    shadow.unseen = false;
    shadow.allocations.clear();
  }
  return &shadow;
}

// The allocation holding p; nullptr for memory that is not threadgroup memory of the launch
// (the scratch a failed bounds check hands out).
Allocation* allocation_at(GroupShadow& s, uintptr_t p) {
  for (Allocation& a : s.allocations) {
    if (p >= a.start && p - a.start < a.bytes) return &a;
  }
  Allocation found;
  if (!s.launch->threadgroup_allocation(p, found.start, found.bytes, found.name)) return nullptr;
  found.written.assign(size_t(found.bytes), 0);
  s.allocations.push_back(std::move(found));
  return &s.allocations.back();
}

}  // namespace
}  // namespace torch_metallib::cpu

using torch_metallib::cpu::Allocation;
using torch_metallib::cpu::GroupShadow;

extern "C" void* tm_rt_tg_read(void* p, uint64_t bytes, int32_t x, int32_t y, int32_t z) {
  GroupShadow* s = torch_metallib::cpu::running(x, y, z);
  if (s == nullptr || s->unseen) return p;
  const auto address = reinterpret_cast<uintptr_t>(p);
  Allocation* a = torch_metallib::cpu::allocation_at(*s, address);
  if (a == nullptr) return p;
  const uint64_t offset = address - a->start, end = std::min<uint64_t>(a->bytes, offset + bytes);
  for (uint64_t i = offset; i < end; ++i) {
    if (!a->written[size_t(i)]) {
      torch_metallib::cpu::CheckedLaunch::current()->record_uninitialized(address, bytes, i - offset, a->start,
                                                                          a->name);
      break;
    }
  }
  return p;
}

extern "C" void tm_rt_tg_write(void* p, uint64_t bytes, int32_t x, int32_t y, int32_t z) {
  GroupShadow* s = torch_metallib::cpu::running(x, y, z);
  if (s == nullptr || s->unseen) return;
  const auto address = reinterpret_cast<uintptr_t>(p);
  Allocation* a = torch_metallib::cpu::allocation_at(*s, address);
  if (a == nullptr) return;
  const uint64_t offset = address - a->start, end = std::min<uint64_t>(a->bytes, offset + bytes);
  for (uint64_t i = offset; i < end; ++i) a->written[size_t(i)] = 1;
}

extern "C" void tm_rt_tg_unseen(int32_t x, int32_t y, int32_t z) {
  GroupShadow* s = torch_metallib::cpu::running(x, y, z);
  if (s != nullptr) s->unseen = true;
}

#include "cpu/bounds_check.h"

#include <algorithm>
#include <map>
#include <shared_mutex>

namespace torch_metallib::cpu {

namespace {

thread_local CheckedLaunch* current_launch = nullptr;
// Read by the kernel (tm_rt_check_context's layout); the launcher writes the thread.
struct CheckContext {
  uint32_t thread[3] = {0, 0, 0};
  uint32_t unused = 0;
  const CheckedLaunch::Bounds* bounds = nullptr;
};
thread_local CheckContext context;
thread_local uint64_t scopes_made = 0;
thread_local std::vector<CheckedLaunch::Bounds> group_bounds;
thread_local void* const* current_group_addresses = nullptr;
thread_local std::vector<uint64_t> scratch;

// The globals of every loaded module (start -> bytes, space, name): engines live as long as the process.
struct Static {
  uint64_t bytes = 0;
  int space = 0;
  const char* name = "";
};
std::shared_mutex statics_mutex;
std::map<uintptr_t, Static> statics;

bool inside(uintptr_t p, uint64_t n, uintptr_t start, uint64_t bytes) {
  return p >= start && n <= bytes && p - start <= bytes - n;
}

const char* space_name(int space) {
  return space == 1 ? "device" : space == 2 ? "constant" : space == 3 ? "threadgroup" : "private";
}

}  // namespace

CheckedLaunch::CheckedLaunch(const dispatch::Plan& plan, std::vector<std::string> names, std::vector<int> spaces,
                             std::string kernel)
    : names_(std::move(names)), kernel_(std::move(kernel)) {
  for (int axis = 0; axis < 3; ++axis) grid_[axis] = plan.dims[axis];
  for (int axis = 0; axis < 3; ++axis) group_[axis] = std::max<uint32_t>(1, plan.dims[3 + axis]);
  groups_[0] = std::max<uint32_t>(1, plan.dims[6]);
  groups_[1] = std::max<uint32_t>(1, plan.dims[7]);
  const size_t count = plan.addresses.size();
  ranges_.resize(count);
  threadgroup_bytes_.assign(count, -1);
  names_.resize(count);
  spaces.resize(count, 0);
  bound_.resize(count);
  for (size_t p = 0; p < count; ++p) {
    Binding& bound = bound_[p];
    bound.address = reinterpret_cast<uintptr_t>(plan.addresses[p]);
    bound.span = plan.span(int(p));
    bound.tensor = p < plan.bindings.size() && plan.bindings[p].kind == dispatch::ParameterBinding::Kind::Tensor;
    const uintptr_t start = bound.address == 0 ? 0 : bound.address + uintptr_t(bound.span.begin);
    ranges_[p] = {start, uint64_t(std::max<int64_t>(0, bound.span.bytes)), spaces[p]};
  }
  for (const auto& [position, bytes] : plan.threadgroup_buffers) threadgroup_bytes_[size_t(position)] = bytes;
  bounds_.resize(count);
  for (size_t p = 0; p < count; ++p) {
    if (threadgroup_bytes_[p] < 0 && ranges_[p].start != 0) bounds_[p] = {ranges_[p].start, ranges_[p].bytes};
  }
  for (const dispatch::ArgumentBuffer& buffer : plan.argument_buffers) {
    const bool storage = plan.storage_bounded(buffer.position);
    for (const dispatch::ArgumentBufferSlot& slot : buffer.slots) {
      const auto first = reinterpret_cast<uintptr_t>(slot.tensor.data_ptr());
      if (first == 0) continue;
      const dispatch::Span span = storage ? dispatch::storage_span(slot.tensor) : dispatch::view_span(slot.tensor);
      extra_.push_back({first + uintptr_t(span.begin), uint64_t(std::max<int64_t>(0, span.bytes)), 0, buffer.position,
                        first, storage});
    }
  }
}

CheckedLaunch::Scope::Scope(CheckedLaunch* launch) : previous_(current_launch) {
  ++scopes_made;
  current_launch = launch;
  context.bounds = launch ? launch->bounds() : nullptr;
}
CheckedLaunch::Scope::~Scope() {
  current_launch = previous_;
  context.bounds = previous_ ? previous_->bounds() : nullptr;
}

CheckedLaunch::Range CheckedLaunch::range_of(int position) const {
  Range range = ranges_[size_t(position)];
  const int64_t group_bytes = threadgroup_bytes_[size_t(position)];
  if (group_bytes >= 0) {
    range.start = current_group_addresses ? reinterpret_cast<uintptr_t>(current_group_addresses[position]) : 0;
    range.bytes = uint64_t(group_bytes);
    range.space = 3;
  }
  return range;
}

bool CheckedLaunch::allowed(uintptr_t p, uint64_t n, int origin, int space) const {
  if (origin >= 0 && size_t(origin) < ranges_.size()) {
    const Range range = range_of(origin);
    return range.start != 0 && inside(p, n, range.start, range.bytes);
  }
  for (size_t position = 0; position < ranges_.size(); ++position) {
    const Range range = range_of(int(position));
    if (range.start != 0 && (range.space == space || space == 0) && inside(p, n, range.start, range.bytes)) return true;
  }
  for (const Range& range : extra_) {
    if (inside(p, n, range.start, range.bytes)) return true;
  }
  std::shared_lock lock(statics_mutex);
  auto at = statics.upper_bound(p);
  if (at == statics.begin()) return false;
  --at;
  return inside(p, n, at->first, at->second.bytes);
}

std::string CheckedLaunch::against(uintptr_t p, uint64_t n, size_t position, const Range& range) const {
  using std::to_string;
  const bool group = threadgroup_bytes_[position] >= 0;
  const int64_t offset = int64_t(p - (group ? range.start : bound_[position].address));
  const int64_t low = group ? 0 : bound_[position].span.begin;
  const std::string bytes = to_string(range.bytes);
  std::string allowed;
  if (group) {
    allowed = "its " + bytes + " bytes of threadgroup memory";
  } else if (!bound_[position].tensor) {
    allowed = "the " + bytes + " bytes of its value";
  } else if (bound_[position].span.storage) {
    allowed = "its storage's " + bytes + " bytes, as storage_bounds asks";
  } else {
    allowed = "the " + bytes + " bytes its view spans";
  }
  return "at byte offset " + to_string(offset) + " of " + names_[position] + "; expected byte offsets " +
         to_string(low) + " to " + to_string(low + int64_t(range.bytes)) + " (" + allowed + "), got " +
         to_string(offset) + " to " + to_string(offset + int64_t(n));
}

std::string CheckedLaunch::describe(uintptr_t p, uint64_t n, int origin, int space, bool write) const {
  // std::to_string, not a stream (see ArgumentSpec::describe).
  using std::to_string;
  std::string out = kernel_ + ": thread (" + to_string(context.thread[0]) + ", " + to_string(context.thread[1]) + ", " +
                    to_string(context.thread[2]) + ") " + (write ? "writes " : "reads ") + to_string(n) + " bytes ";
  if (origin >= 0 && size_t(origin) < ranges_.size()) {
    const size_t position = size_t(origin);
    const Range range = range_of(origin);
    if (threadgroup_bytes_[position] >= 0) {
      return out + against(p, n, position, range) + ". Pass a larger threadgroup_memory, or dispatch fewer threads";
    }
    if (range.start == 0 || (bound_[position].tensor && range.bytes == 0)) {
      return out + "through " + names_[position] +
             ", whose view has no elements; expected no "
             "access, got one. Bind a tensor with elements, or dispatch no threads";
    }
    out += against(p, n, position, range);
    if (!bound_[position].tensor) return out + ". Pass a larger value, or dispatch fewer threads";
    // The argument's name, as storage_bounds takes it: "argument 2 'c' (...)" -> c.
    const std::string& described = names_[position];
    const size_t open = described.find('\''), close = described.find('\'', open + 1);
    if (bound_[position].span.storage || close == std::string::npos) {
      return out + ". Bind a larger tensor, or dispatch fewer threads";
    }
    return out +
           ". Bind a larger tensor (or a view over what the kernel reaches), or dispatch fewer threads; a "
           "kernel that indexes past the view on purpose may reach its storage with storage_bounds={" +
           described.substr(open, close - open + 1) + "}";
  }
  // Not attributable to one argument: name the nearest bound range below the address.
  int nearest = -1;
  uintptr_t best = 0;
  for (size_t position = 0; position < ranges_.size(); ++position) {
    const Range range = range_of(int(position));
    if (range.start != 0 && range.start <= p && range.start >= best) {
      best = range.start;
      nearest = int(position);
    }
  }
  // A tensor an argument buffer points to (Mojo's pointer arguments) may be nearer.
  const Range* pointed = nullptr;
  for (const Range& range : extra_) {
    if (range.start <= p && range.start >= best) {
      best = range.start;
      pointed = &range;
    }
  }
  out += std::string("of ") + space_name(space) + " memory outside every bound argument and the kernel's own variables";
  if (pointed != nullptr) {
    const int64_t offset = int64_t(p - pointed->address), low = int64_t(pointed->start - pointed->address);
    out += " (at byte offset " + to_string(offset) + " of the tensor " + names_[size_t(pointed->owner)] +
           " points to; expected byte offsets " + to_string(low) + " to " + to_string(low + int64_t(pointed->bytes)) +
           " (the " + to_string(pointed->bytes) +
           (pointed->storage ? " bytes of its storage" : " bytes its view spans") + "), got " + to_string(offset) +
           " to " + to_string(offset + int64_t(n)) + ")";
  } else if (nearest >= 0) {
    out += " (" + against(p, n, size_t(nearest), range_of(nearest)) + ")";
  }
  return out + ". Bind larger tensors, or dispatch fewer threads";
}

uint64_t CheckedLaunch::thread_key() const {
  return (uint64_t(context.thread[2]) * grid_[1] + context.thread[1]) * grid_[0] + context.thread[0];
}

template <typename Message>
void CheckedLaunch::report(Message message) {
  const uint64_t key = thread_key();
  if (key >= reported_.load(std::memory_order_relaxed)) return;
  std::lock_guard lock(mutex_);
  if (key >= reported_.load(std::memory_order_relaxed)) return;
  reported_.store(key, std::memory_order_relaxed);
  message_ = message();
}

void CheckedLaunch::record(uintptr_t p, uint64_t n, int origin, int space, bool write) {
  report([&] { return describe(p, n, origin, space, write); });
}

CheckedLaunch* CheckedLaunch::current() { return current_launch; }
uint64_t CheckedLaunch::scope_generation() { return scopes_made; }

uint64_t CheckedLaunch::group_of(uint32_t x, uint32_t y, uint32_t z) const {
  return (uint64_t(z / group_[2]) * groups_[1] + y / group_[1]) * groups_[0] + x / group_[0];
}

bool CheckedLaunch::threadgroup_allocation(uintptr_t p, uintptr_t& start, uint64_t& bytes, std::string& name) const {
  for (size_t position = 0; position < ranges_.size(); ++position) {
    if (threadgroup_bytes_[position] < 0) continue;
    const Range range = range_of(int(position));
    if (range.start != 0 && p >= range.start && p - range.start < range.bytes) {
      start = range.start;
      bytes = range.bytes;
      name = names_[position];
      return true;
    }
  }
  std::shared_lock lock(statics_mutex);
  auto at = statics.upper_bound(p);
  if (at == statics.begin()) return false;
  --at;
  if (at->second.space != 3 || p - at->first >= at->second.bytes) return false;
  start = at->first;
  bytes = at->second.bytes;
  name = std::string("threadgroup variable '") + at->second.name + "'";
  return true;
}

void CheckedLaunch::record_uninitialized(uintptr_t p, uint64_t n, uint64_t unwritten, uintptr_t start,
                                         const std::string& name) {
  report([&] {
    using std::to_string;
    const uint64_t offset = p - start;
    return kernel_ + ": thread (" + to_string(context.thread[0]) + ", " + to_string(context.thread[1]) + ", " +
           to_string(context.thread[2]) + ") reads " + to_string(n) + " bytes at byte offset " + to_string(offset) +
           " of " + name +
           " that no thread of its threadgroup has written in this launch; expected threadgroup memory written "
           "before it is read, got byte offset " +
           to_string(offset + unwritten) +
           " unwritten. Write it first (with a threadgroup barrier between the write and the read), or dispatch "
           "the threadgroup size the kernel is written for";
  });
}

void CheckedLaunch::raise_if_violated() const {
  std::lock_guard lock(mutex_);
  if (reported_.load() != ~uint64_t(0)) throw MemoryViolation(message_);
}

void set_check_thread(uint32_t x, uint32_t y, uint32_t z) {
  context.thread[0] = x;
  context.thread[1] = y;
  context.thread[2] = z;
}

const uint32_t* check_thread() { return context.thread; }

void CheckedLaunch::group_bounds(void* const* addresses, std::vector<Bounds>& out) const {
  out = bounds_;
  for (size_t p = 0; p < out.size(); ++p) {
    if (threadgroup_bytes_[p] >= 0)
      out[p] = {reinterpret_cast<uintptr_t>(addresses[p]), uint64_t(threadgroup_bytes_[p])};
  }
}

void set_check_group_addresses(void* const* addresses) {
  current_group_addresses = addresses;
  if (current_launch == nullptr) return;
  current_launch->group_bounds(addresses, group_bounds);
  context.bounds = group_bounds.data();
}

}  // namespace torch_metallib::cpu

using torch_metallib::cpu::current_launch;

extern "C" void* tm_rt_check(void* p, uint64_t bytes, int32_t origin, int32_t flags, int32_t x, int32_t y, int32_t z) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(p);
  const int space = (flags >> 8) & 0xff;
  if (current_launch == nullptr || current_launch->allowed(address, bytes, origin, space)) return p;
  if (x != -1) torch_metallib::cpu::set_check_thread(uint32_t(x), uint32_t(y), uint32_t(z));
  current_launch->record(address, bytes, origin, space, flags & 1);
  auto& memory = torch_metallib::cpu::scratch;
  if (memory.size() * 8 < bytes) memory.resize(size_t(bytes + 7) / 8);
  return memory.data();
}

extern "C" void* tm_rt_check_context() { return &torch_metallib::cpu::context; }

extern "C" void tm_rt_check_static(void* p, uint64_t bytes, int32_t space, const char* name) {
  std::unique_lock lock(torch_metallib::cpu::statics_mutex);
  torch_metallib::cpu::statics[reinterpret_cast<uintptr_t>(p)] = {bytes, space, name};
}

#include "dispatch/call_modes.h"

#include <atomic>
#include <cstdlib>

namespace torch_metallib::dispatch {
namespace {

std::atomic<int> debug_schedule_users{0};
std::atomic<int> checked_blocks{0};
std::atomic<uint64_t> generation{0};

bool set(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0';
}

}  // namespace

void add_debug_schedule_users(int delta) { debug_schedule_users.fetch_add(delta); }
bool debug_schedule_in_use() { return debug_schedule_users.load(std::memory_order_relaxed) != 0; }
void add_checked_blocks(int delta) { checked_blocks.fetch_add(delta); }
void backends_changed() { generation.fetch_add(1); }
uint64_t backends_generation() { return generation.load(std::memory_order_relaxed); }

bool plain_calls() {
  // Any value of the variables (even one that means "off") takes the full path, which reads it.
  return checked_blocks.load(std::memory_order_relaxed) == 0 && !debug_schedule_in_use() &&
         !set("TORCH_METALLIB_CHECKED") && !set("TORCH_METALLIB_CPU_SCHEDULE");
}

}  // namespace torch_metallib::dispatch

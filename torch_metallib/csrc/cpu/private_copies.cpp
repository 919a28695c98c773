#include "cpu/private_copies.h"

#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <unordered_set>

namespace torch_metallib::cpu {
namespace {

std::mutex mutex;
std::condition_variable freed;
std::unordered_set<uintptr_t> leased;  // copies some chunk is running now

}  // namespace

CopyLease::CopyLease(const std::vector<uintptr_t>& copies, bool private_copies) {
  if (copies.empty()) throw std::logic_error("CopyLease: no loaded copy of the kernel");
  if (!private_copies) {
    address_ = copies.front();
    return;
  }
  std::unique_lock<std::mutex> lock(mutex);
  for (;;) {
    for (uintptr_t copy : copies) {
      if (leased.insert(copy).second) {
        address_ = copy;
        leased_ = true;
        return;
      }
    }
    freed.wait(lock);  // every copy is running a chunk: one finishes without needing ours
  }
}

CopyLease::~CopyLease() {
  if (!leased_) return;
  {
    std::lock_guard<std::mutex> lock(mutex);
    leased.erase(address_);
  }
  freed.notify_all();
}

}  // namespace torch_metallib::cpu

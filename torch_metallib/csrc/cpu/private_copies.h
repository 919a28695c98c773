// Kernels with threadgroup variables are loaded once per worker ("private copies"): the
// variables live in the loaded object, so two threadgroups running at once must never use
// the same copy. Which worker runs a chunk of threadgroups is not enough to pick one:
// calls from several Python threads each run their own parallel region, whose workers
// are numbered from 0 again. A lease takes a copy no running chunk holds, and gives it
// back when the chunk ends.
#pragma once

#include <cstdint>
#include <vector>

namespace torch_metallib::cpu {

class CopyLease {
 public:
  // Waits until one of `copies` (launcher or thread-function addresses, one per loaded
  // copy) is free and takes it. With `private_copies` false, takes copies[0] and shares it.
  CopyLease(const std::vector<uintptr_t>& copies, bool private_copies);
  ~CopyLease();
  CopyLease(const CopyLease&) = delete;
  CopyLease& operator=(const CopyLease&) = delete;

  uintptr_t address() const { return address_; }

 private:
  uintptr_t address_ = 0;
  bool leased_ = false;
};

}  // namespace torch_metallib::cpu

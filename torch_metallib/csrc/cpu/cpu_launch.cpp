#include "cpu/cpu_launch.h"
#include "cpu/private_copies.h"
#include "cpu/bounds_check.h"

#include <ATen/Parallel.h>

#include <algorithm>

namespace torch_metallib::cpu {

namespace {
// Threads per parallel_for chunk: enough work to amortize handing out a chunk.
constexpr int64_t kThreadsPerChunk = 1 << 15;
}  // namespace

void launch(const dispatch::Plan& plan, const std::vector<uintptr_t>& launchers, bool private_copies, bool parallel,
            CheckedLaunch* checked) {
  const int64_t groups = int64_t(plan.group_count);
  const int64_t group_threads = int64_t(plan.dims[3]) * plan.dims[4] * plan.dims[5];
  parallel = parallel && groups > 1 && (!private_copies || launchers.size() >= size_t(at::get_num_threads()));
  if (!parallel) {
    CopyLease copy(launchers, private_copies);
    CheckedLaunch::Scope scope(checked);
    reinterpret_cast<LaunchFunction>(copy.address())(plan.addresses.data(), plan.dims, 0, groups);
    return;
  }
  const int64_t grain = std::max<int64_t>(1, kThreadsPerChunk / group_threads);
  at::parallel_for(0, groups, grain, [&](int64_t first, int64_t end) {
    CopyLease copy(launchers, private_copies);
    CheckedLaunch::Scope scope(checked);
    reinterpret_cast<LaunchFunction>(copy.address())(plan.addresses.data(), plan.dims, first, end);
  });
}

}  // namespace torch_metallib::cpu

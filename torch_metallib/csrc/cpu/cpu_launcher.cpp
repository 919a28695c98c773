#include "cpu/cpu_launcher.h"

#include <ATen/Parallel.h>

#include "cpu/cooperative.h"
#include "cpu/cpu_launch.h"
#include "cpu/lanes.h"
#include "dispatch/call_modes.h"

namespace torch_metallib::cpu {

bool CpuLauncher::accepts(const dispatch::Plan& plan) const {
  // A kernel with threadgroup variables needs a loaded copy per worker: more workers than
  // when it was compiled take the full path, which loads more.
  return plan.device.is_cpu() && dispatch::same_constants(plan.constants, constants_) && dispatch::plain_calls() &&
         (!private_copies_ || entries_.size() >= size_t(at::get_num_threads()));
}

bool CpuLauncher::releases_gil(const dispatch::Plan& plan) const {
  // Other Python threads wait while a kernel holds the GIL: keep it only for a few
  // thousand threads run one after another (a microsecond or so).
  constexpr uint64_t kHeldThreads = 4096;
  return scheme_ != Scheme::Threads || uint64_t(plan.dims[0]) * plan.dims[1] * plan.dims[2] > kHeldThreads;
}

const char* CpuLauncher::cpu_scheme() const {
  switch (scheme_) {
    case Scheme::Threads: return "threads";
    case Scheme::Lanes: return "lanes";
    case Scheme::Vector: return "vector";
    case Scheme::Coroutines: break;
  }
  return "coroutines";
}

void CpuLauncher::launch(const dispatch::Plan& plan) {
  const Schedule parallel{true, false, 0, /*strict_barriers=*/false};
  switch (scheme_) {
    case Scheme::Threads: cpu::launch(plan, entries_, private_copies_, true); break;
    case Scheme::Lanes:
    case Scheme::Vector: launch_lanes(plan, entries_, private_copies_, kernel_, parallel); break;
    case Scheme::Coroutines: launch_cooperative(plan, entries_, private_copies_, kernel_, parallel); break;
  }
}

}  // namespace torch_metallib::cpu

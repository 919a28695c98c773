#include "cpu/lanes.h"
#include "cpu/private_copies.h"
#include "cpu/threadgroup_memory.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>

namespace torch_metallib::cpu {
namespace {

constexpr uint32_t kSimdWidth = 32;
constexpr uint32_t kDone = 0xFFFFFFFFu;
constexpr uint32_t kBarrier = 1;
constexpr uint32_t kKind = 3;           // a region's kind: its start, after a barrier or after an exchange
constexpr uint32_t kWholeGroup = 4;     // ... and a flag: it runs the lanes of any run of whole SIMD-groups
constexpr uint64_t kPhaseBytes = 2112;  // %tm.xphase: 32 slots of 64 bytes, mask, claimed; 64-aligned
constexpr uint64_t kMaskOffset = 2048;

// One OS thread's context and thread states, reused across threadgroups and calls.
struct LanesRun {
  std::unique_ptr<unsigned char, decltype(&std::free)> context{nullptr, &std::free};
  uint64_t capacity = 0;
  std::vector<uint32_t> points;
  std::vector<uint32_t> agreed;  // per SIMD-group: the point its last region run returned

  unsigned char* reserve(uint64_t bytes) {
    if (bytes > capacity) {
      context.reset(static_cast<unsigned char*>(std::aligned_alloc(64, (bytes + 63) & ~uint64_t(63))));
      if (!context) throw std::runtime_error("cannot allocate the lane loops' context");
      capacity = bytes;
    }
    return context.get();
  }
};
thread_local LanesRun lanes_run;

// Whether threads [begin, end) all stand at one point: the common case, checked before the
// per-thread scans below, once per region run. A whole SIMD-group is an OR of differences
// over a fixed count, which the compiler vectorizes at -O2 (memcmp, called, cost more); its
// loads still wait for the region's stores of the points (no store forwarding from several
// stores to one wide load; point by point with an early exit was slower). A longer range
// is memcmp of the range and itself shifted by one.
bool uniform(const uint32_t* points, uint32_t begin, uint32_t end) {
  if (end - begin == kSimdWidth) {
    const uint32_t* lanes = points + begin;  // a pointer, not points[begin + i]: that index may wrap
    uint32_t differ = 0;
    for (uint32_t i = 0; i < kSimdWidth; ++i) differ |= lanes[i] ^ lanes[0];
    return differ == 0;
  }
  return end - begin < 2 || std::memcmp(points + begin, points + begin + 1, sizeof(uint32_t) * (end - begin - 1)) == 0;
}

// The point among threads [begin, end) that goes first (lowest rank), or kDone if all returned.
uint32_t first_point_of_many(const LanesTable& table, const uint32_t* points, uint32_t begin, uint32_t end) {
  uint32_t best = kDone;
  for (uint32_t t = begin; t < end; ++t) {
    uint32_t p = points[t];
    if (p != kDone && (best == kDone || table.region[p].rank < table.region[best].rank)) best = p;
  }
  return best;
}

uint32_t first_point(const LanesTable& table, const uint32_t* points, uint32_t begin, uint32_t end) {
  return uniform(points, begin, end) ? points[begin] : first_point_of_many(table, points, begin, end);
}

// Each region's exchange site: its index among the exchanges (regions.py numbers them in
// marker order); computed once per launch.
std::vector<uint32_t> exchange_sites(const LanesTable& table) {
  std::vector<uint32_t> sites(table.regions, 0);
  for (uint32_t r = 1, site = 0; r < table.regions; ++r) {
    sites[r] = site;
    site += (table.region[r].kind & kKind) != kBarrier;
  }
  return sites;
}

void run_group(LanesRun& run, const LanesTable& table, const std::vector<uint32_t>& sites, const dispatch::Plan& plan,
               uint32_t group, const std::string& kernel, bool strict_barriers) {
  const uint32_t* dims = plan.dims;
  uint32_t count = 1;
  for (int axis = 0; axis < 3; ++axis) {
    uint32_t index = axis == 0   ? group % dims[6]
                     : axis == 1 ? (group / dims[6]) % dims[7]
                                 : group / (dims[6] * dims[7]);
    count *= std::min(dims[3 + axis], dims[axis] - index * dims[3 + axis]);
  }
  void* const* addresses = threadgroup_memory().prepare(plan);
  unsigned char* context = run.reserve(table.context_bytes);
  const uint32_t simds = (count + kSimdWidth - 1) / kSimdWidth;
  auto* phases = reinterpret_cast<uint32_t*>(context + table.phases_offset);
  std::memset(phases, 0, sizeof(uint32_t) * kSimdWidth * table.sites);
  run.points.assign(count, 0);
  uint32_t* points = run.points.data();
  run.agreed.assign(simds, 0);  // every lane starts at region 0
  uint32_t* agreed = run.agreed.data();
  // Region r for the lanes of SIMD-group [begin, end) that stand at r: a region's loop runs
  // every lane of a range (no test per lane, so LLVM vectorizes it), one range per run of them.
  auto runs = [&](uint32_t r, uint32_t begin, uint32_t end) {
    for (uint32_t t = begin; t < end;) {
      if (points[t] != r) {
        ++t;
        continue;
      }
      uint32_t first = t;
      while (t < end && points[t] == r) ++t;
      table.region[r].function(context, addresses, dims, group, first, t, points);
    }
  };
  auto region = [&](uint32_t r, uint32_t begin, uint32_t end) {
    uint32_t& known = agreed[begin / kSimdWidth];
    if (known == kScanPoints && !uniform(points, begin, end)) return runs(r, begin, end);
    if ((known == kScanPoints ? points[begin] : known) == r)
      known = table.region[r].function(context, addresses, dims, group, begin, end, points);
  };
  // Region r for every SIMD-group at it; all threads at r: in one run where the region takes
  // several SIMD-groups (no exchange of its own: its set-up is then made once, not per group).
  auto every_simd = [&](uint32_t r, bool all_at_r) {
    if (all_at_r && (table.region[r].kind & kWholeGroup)) {
      std::fill(agreed, agreed + simds, table.region[r].function(context, addresses, dims, group, 0, count, points));
      return;
    }
    for (uint32_t begin = 0; begin < count; begin += kSimdWidth) region(r, begin, std::min(count, begin + kSimdWidth));
  };
  every_simd(0, true);
  for (;;) {
    // Each SIMD-group completes its exchanges until its lanes wait at a barrier or returned.
    for (uint32_t s = 0; s < simds; ++s) {
      const uint32_t begin = s * kSimdWidth, end = std::min(count, begin + kSimdWidth);
      for (;;) {
        // All lanes at p is the common case: the region that ran them says so, else one
        // uniformity test per exchange (no scans).
        const uint32_t known = agreed[s];
        const bool together = known != kScanPoints || uniform(points, begin, end);
        const uint32_t p = known != kScanPoints ? known
                           : together           ? points[begin]
                                                : first_point_of_many(table, points, begin, end);
        agreed[s] = together ? p : kScanPoints;
        if (p == kDone || (table.region[p].kind & kKind) == kBarrier) break;
        uint32_t mask = together ? uint32_t(~uint64_t(0) >> (64 - (end - begin))) : 0;
        for (uint32_t t = begin; !together && t < end; ++t) mask |= uint32_t(points[t] == p) << (t - begin);
        const uint32_t site = sites[p];
        uint32_t& phase = phases[s * table.sites + site];
        phase ^= 1;
        unsigned char* area =
            context + table.areas_offset + ((uint64_t(s) * table.sites + site) * 2 + phase) * kPhaseBytes;
        std::memcpy(area + kMaskOffset, &mask, sizeof mask);
        if (together) {
          agreed[s] = table.region[p].function(context, addresses, dims, group, begin, end, points);
        } else {
          runs(p, begin, end);
        }
      }
    }
    // Every SIMD-group's lanes at one point (known from their regions): no scan of the group.
    const bool agree =
        std::all_of(agreed, agreed + simds, [&](uint32_t a) { return a == agreed[0]; }) && agreed[0] != kScanPoints;
    uint32_t p = agree ? agreed[0] : first_point(table, points, 0, count);
    if (p == kDone) return;
    uint32_t waiting = count, done = 0;
    const bool all_at_p = agree || uniform(points, 0, count);
    if (!all_at_p) {
      waiting = 0;
      for (uint32_t t = 0; t < count; ++t) {
        waiting += points[t] == p;
        done += points[t] == kDone;
      }
    }
    if (strict_barriers && done > 0) throw ExecutionError(deadlock_message(kernel, dims, group, waiting, count, done));
    every_simd(p, all_at_p);  // the barrier opens for the threads at it (the lowest, where threads diverged)
  }
}

}  // namespace

void launch_lanes(const dispatch::Plan& plan, const std::vector<uintptr_t>& tables, bool private_copies,
                  const std::string& kernel, const Schedule& schedule) {
  const int64_t groups = int64_t(plan.group_count);
  bool parallel =
      schedule.parallel && groups > 1 && (!private_copies || tables.size() >= size_t(at::get_num_threads()));
  // Every loaded copy has the same regions.
  const std::vector<uint32_t> sites = exchange_sites(*reinterpret_cast<const LanesTable*>(tables.at(0)));
  auto run_range = [&](int64_t first, int64_t end) {
    CopyLease copy(tables, private_copies);
    const auto& table = *reinterpret_cast<const LanesTable*>(copy.address());
    for (int64_t g = first; g < end; ++g) {
      run_group(lanes_run, table, sites, plan, uint32_t(g), kernel, schedule.strict_barriers);
    }
  };
  if (!parallel) {
    run_range(0, groups);
    return;
  }
  at::parallel_for(0, groups, 1, run_range);
}

}  // namespace torch_metallib::cpu

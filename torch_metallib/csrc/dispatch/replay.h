// A plan rebuilt from what a Metal encoder was told: the simulated Metal records the
// setBuffer / setBytes / setThreadgroupMemoryLength / dispatchThreads calls the Metal
// backend makes, and the CPU backend runs the plan rebuilt from them. So the Objective-C++
// encoder's output, not the command list it was given, decides the results: an encoding
// mistake shows up as a wrong result.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "dispatch/binding_plan.h"

namespace torch_metallib::dispatch {

struct EncodedCommands {
  std::map<int, void*> buffers;               // index -> buffer contents + offset
  std::map<int, std::vector<uint8_t>> bytes;  // index -> setBytes data
  std::map<int, int64_t> threadgroup;         // index -> threadgroup memory length
  uint32_t grid[3] = {1, 1, 1};
  uint32_t group[3] = {1, 1, 1};
};

// `plan` with its addresses, threadgroup lengths and grid taken from `encoded` (matched by
// Metal binding index). Throws std::invalid_argument naming a binding the encoder left unset.
Plan replayed_plan(const Plan& plan, const EncodedCommands& encoded);

}  // namespace torch_metallib::dispatch

// The switches that make a kernel call leave the native fast path for the full one, where
// Python decides what they mean: checked execution (a checked() block or the environment)
// and the CPU's debug schedules (a cpu_schedule() block or the environment). Counting the
// blocks here lets a native launcher tell in a few nanoseconds that none is in effect.
#pragma once

#include <cstdint>

namespace torch_metallib::dispatch {

// cpu_schedule() blocks with a debug mode, and the environment's debug schedule once
// registered (backends/cpu/schedule.py).
void add_debug_schedule_users(int delta);
bool debug_schedule_in_use();

// checked() blocks that turn checking on (dispatch/checked_mode.py).
void add_checked_blocks(int delta);

// Counts registrations of backends (dispatch/backend.py): a launcher made before the last
// one may belong to a backend no longer registered for its device.
void backends_changed();
uint64_t backends_generation();

// True while no switch above is in effect and neither TORCH_METALLIB_CHECKED nor
// TORCH_METALLIB_CPU_SCHEDULE is set: a call then runs as its native launcher was made.
bool plain_calls();

}  // namespace torch_metallib::dispatch

// User-space context switching for the threads of one threadgroup (DESIGN.md §4.3): a
// switch saves the callee-saved registers and the stack pointer, like boost's fcontext
// (~10 ns), instead of ucontext's syscall.
#pragma once

#include <cstddef>

namespace torch_metallib::cpu {

// True where fiber_switch has an implementation (x86-64 System V).
bool fibers_supported();

// Saves the current context's stack pointer into *save and resumes the one at `resume`.
extern "C" void tm_fiber_switch(void** save, void* resume);

// Prepares a stack (top = stack + size) so that the first switch to the returned stack
// pointer calls entry(argument); entry must never return.
void* fiber_prepare(void* stack, size_t size, void (*entry)(void*), void* argument);

}  // namespace torch_metallib::cpu

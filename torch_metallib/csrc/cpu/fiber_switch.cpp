#include "cpu/fiber_switch.h"

#include <cstdint>

namespace torch_metallib::cpu {

#if defined(__x86_64__) && !defined(_WIN32)

// Stack layout at a saved stack pointer, lowest address first: r15, r14, r13, r12, rbx,
// rbp, return address. The fibers of one OS thread share its floating-point environment
// (MXCSR, x87 control word): kernels never change it, and loading it on every switch cost
// most of the switch.
asm(R"(
    .text
    .globl tm_fiber_switch
    .hidden tm_fiber_switch
    .type tm_fiber_switch,@function
tm_fiber_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size tm_fiber_switch, .-tm_fiber_switch

    .globl tm_fiber_start
    .hidden tm_fiber_start
    .type tm_fiber_start,@function
tm_fiber_start:
    movq %r12, %rdi
    callq *%r13
    ud2
    .size tm_fiber_start, .-tm_fiber_start
)");

extern "C" void tm_fiber_start();

bool fibers_supported() { return true; }

void* fiber_prepare(void* stack, size_t size, void (*entry)(void*), void* argument) {
  auto top = (reinterpret_cast<uintptr_t>(stack) + size) & ~uintptr_t(15);
  auto* slot = reinterpret_cast<uint64_t*>(top - 8);  // return address: 16-aligned after ret
  slot[0] = reinterpret_cast<uint64_t>(&tm_fiber_start);
  uint64_t* sp = slot - 6;
  sp[0] = 0;                                            // r15
  sp[1] = 0;                                            // r14
  sp[2] = reinterpret_cast<uint64_t>(entry);            // r13
  sp[3] = reinterpret_cast<uint64_t>(argument);         // r12
  sp[4] = 0;                                            // rbx
  sp[5] = 0;                                            // rbp
  return sp;
}

#else

bool fibers_supported() { return false; }
extern "C" void tm_fiber_switch(void**, void*) {}
void* fiber_prepare(void*, size_t, void (*)(void*), void*) { return nullptr; }

#endif

}  // namespace torch_metallib::cpu

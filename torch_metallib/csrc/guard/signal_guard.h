// Runs code that may abort() or fault on hostile input (LLVM's bitcode reader aborts on
// some damaged bitcode: "LLVM ERROR: out of memory") and turns that into a returned signal
// number instead of a dead process. Handlers are installed only for the duration of the
// call, and a signal raised by another thread meanwhile goes to the handler that was there
// before. What the guarded code left half-built (an LLVM context) must be leaked, never used.
#pragma once

#include <c10/util/FunctionRef.h>

namespace torch_metallib::guard {

// 0 if `body` returned, else the signal (SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL) that
// interrupted it. Not reentrant; callers serialize (llvmlite's lock does).
int run_guarded(c10::function_ref<void()> body);

}  // namespace torch_metallib::guard

#include "guard/signal_guard.h"

#include <csetjmp>
#include <csignal>

namespace torch_metallib::guard {
namespace {

constexpr int kSignals[] = {SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL};
thread_local sigjmp_buf* t_jump = nullptr;  // set while this thread runs guarded code
struct sigaction previous[NSIG];

void on_signal(int signal, siginfo_t*, void*) {
  if (sigjmp_buf* jump = t_jump) {
    t_jump = nullptr;
    siglongjmp(*jump, signal);
  }
  // Another thread's signal: give it back to the handler that was there before, which
  // runs when the fault repeats (or, for abort(), when glibc raises again).
  sigaction(signal, &previous[signal], nullptr);
}

}  // namespace

int run_guarded(c10::function_ref<void()> body) {
  struct sigaction action{};
  action.sa_sigaction = on_signal;
  action.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigemptyset(&action.sa_mask);
  for (int signal : kSignals) sigaction(signal, &action, &previous[signal]);
  sigjmp_buf jump;
  int caught = sigsetjmp(jump, /*savemask=*/1);
  if (caught == 0) {
    t_jump = &jump;
    body();
  }
  t_jump = nullptr;
  for (int signal : kSignals) sigaction(signal, &previous[signal], nullptr);
  return caught;
}

}  // namespace torch_metallib::guard

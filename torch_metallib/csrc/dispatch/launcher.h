// A backend's native launcher: one compiled function with one set of constant values on
// one device, run straight from a bound plan with no Python in between. The full path
// (dispatch/calls.py) makes them; a call that one accepts never leaves native code.
#pragma once

#include <memory>
#include <vector>

#include "dispatch/binding_plan.h"
#include "dispatch/call_modes.h"

namespace torch_metallib::dispatch {

class Launcher {
 public:
  virtual ~Launcher() = default;
  // Whether `plan` runs here exactly as the full path would run it.
  virtual bool accepts(const Plan& plan) const = 0;
  // Runs it (may be called without the GIL).
  virtual void launch(const Plan& plan) = 0;
  // Whether launch() should run with the GIL released: where it may take a while (the
  // GIL's round trip costs about as much as a small CPU kernel; a GPU launch returns at once).
  virtual bool releases_gil(const Plan& plan) const { return true; }
  // How it runs a CPU kernel's threads (KernelFunction.cpu_scheme), or nullptr.
  virtual const char* cpu_scheme() const { return nullptr; }
  // Made while the backends registered now were: it runs what their backend would.
  bool current() const { return generation_ == backends_generation(); }

 private:
  uint64_t generation_ = backends_generation();
};

// A function's launchers, the most recent first; at most kMaxLaunchers are kept. Used
// with the GIL held.
class Launchers {
 public:
  static constexpr size_t kMaxLaunchers = 16;
  void add(std::shared_ptr<Launcher> launcher);
  // The first that accepts `plan`, remembered as the last one used; null if none does.
  // Shared: another thread may drop it from the list while it runs without the GIL.
  std::shared_ptr<Launcher> find(const Plan& plan);
  bool covers(const Plan& plan) const { return first_accepting(plan) != nullptr; }
  // The launcher of the function's last call, if that call ran natively.
  const Launcher* last() const { return last_; }
  void forget_last() { last_ = nullptr; }
  void clear();
  size_t size() const { return entries_.size(); }

 private:
  const std::shared_ptr<Launcher>* first_accepting(const Plan& plan) const;
  std::vector<std::shared_ptr<Launcher>> entries_;
  const Launcher* last_ = nullptr;
};

// Constant values equal, as a compiled function's key compares them.
bool same_constants(const std::vector<ConstantValue>& a, const std::vector<ConstantValue>& b);

}  // namespace torch_metallib::dispatch

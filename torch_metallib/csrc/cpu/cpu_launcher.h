// The CPU backend's native launcher (dispatch/launcher.h): a compiled kernel's entry
// points, run on torch's thread pool in the default (parallel, unchecked) schedule.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dispatch/launcher.h"

namespace torch_metallib::cpu {

// How a compiled kernel runs its threads (KernelFunction.cpu_scheme). Vector: lane loops some
// of whose regions run a chunk of lanes as vector lanes (vectorize.py); the same runner.
enum class Scheme { Threads, Lanes, Vector, Coroutines };

class CpuLauncher final : public dispatch::Launcher {
 public:
  // `entries`: one per loaded copy (launchers, region tables or thread functions, as
  // `scheme` says); `private_copies`: the kernel has threadgroup variables.
  CpuLauncher(std::vector<dispatch::ConstantValue> constants, std::vector<uintptr_t> entries, bool private_copies,
              Scheme scheme, std::string kernel)
      : constants_(std::move(constants)),
        entries_(std::move(entries)),
        private_copies_(private_copies),
        scheme_(scheme),
        kernel_(std::move(kernel)) {}

  bool accepts(const dispatch::Plan& plan) const override;
  void launch(const dispatch::Plan& plan) override;
  bool releases_gil(const dispatch::Plan& plan) const override;
  const char* cpu_scheme() const override;

 private:
  std::vector<dispatch::ConstantValue> constants_;
  std::vector<uintptr_t> entries_;
  bool private_copies_;
  Scheme scheme_;
  std::string kernel_;
};

}  // namespace torch_metallib::cpu

// torch_metallib._C.parse_bitcode_guarded: llvmlite's LLVMPY_ParseBitcode called under the
// signal guard, so bitcode that makes LLVM abort raises instead of killing the process.
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <new>
#include <cstdio>
#include <string>

#include "bindings.h"
#include "guard/signal_guard.h"

namespace py = pybind11;

namespace torch_metallib::bindings {
namespace {

// Address space a parse may add. Legitimate modules need megabytes; damaged length fields
// make LLVM reserve (and then fill) many gigabytes, which the limit turns into a failed
// allocation, and so an abort the guard catches. Other threads share the limit while a
// parse runs (well under a millisecond), so it is generous.
constexpr uint64_t kParseHeadroom = uint64_t(4) << 30;

// Lowers RLIMIT_AS to the current address space plus kParseHeadroom for its lifetime
// (Linux; elsewhere nothing).
class AddressSpaceCap {
 public:
  AddressSpaceCap() {
#ifdef __linux__
    unsigned long long pages = 0;
    if (FILE* statm = std::fopen("/proc/self/statm", "r")) {
      active_ = std::fscanf(statm, "%llu", &pages) == 1 && getrlimit(RLIMIT_AS, &saved_) == 0;
      std::fclose(statm);
    }
    if (active_) {
      const uint64_t cap = uint64_t(pages) * uint64_t(sysconf(_SC_PAGESIZE)) + kParseHeadroom;
      if (saved_.rlim_cur != RLIM_INFINITY && saved_.rlim_cur <= cap) {
        active_ = false;  // already tighter
      } else {
        rlimit lowered = saved_;
        lowered.rlim_cur = cap;
        active_ = setrlimit(RLIMIT_AS, &lowered) == 0;
      }
    }
#endif
  }
  ~AddressSpaceCap() {
    if (active_) setrlimit(RLIMIT_AS, &saved_);
  }
  AddressSpaceCap(const AddressSpaceCap&) = delete;
  AddressSpaceCap& operator=(const AddressSpaceCap&) = delete;

 private:
  bool active_ = false;
  rlimit saved_{};
};

}  // namespace

void bind_guard(py::module_& m) {
  m.def(
      "parse_bitcode_guarded",
      [](uintptr_t parse, uintptr_t dispose_string, uintptr_t context, const py::bytes& bitcode) {
        using Parse = void* (*)(void*, const char*, size_t, char**);
        using Dispose = void (*)(const char*);
        const std::string_view data(bitcode);
        void* module = nullptr;
        char* message = nullptr;
        AddressSpaceCap cap;
        const char* thrown = nullptr;  // a C++ exception LLVM let through (an allocation over the cap)
        const int signal = guard::run_guarded([&] {
          try {
            module =
                reinterpret_cast<Parse>(parse)(reinterpret_cast<void*>(context), data.data(), data.size(), &message);
          } catch (const std::bad_alloc&) {
            thrown = "std::bad_alloc";
          } catch (...) {
            thrown = "a C++ exception";
          }
        });
        std::string text;
        if (signal == 0 && thrown == nullptr && message != nullptr) {
          text = message;
          reinterpret_cast<Dispose>(dispose_string)(message);
        }
        // Why the parse stopped: "" if it returned, else the signal's name or the exception.
        const std::string stopped = signal != 0         ? (signal == SIGABRT   ? "SIGABRT"
                                                           : signal == SIGSEGV ? "SIGSEGV"
                                                                               : "signal " + std::to_string(signal))
                                    : thrown != nullptr ? thrown
                                                        : "";
        // The message may quote bytes of the bitcode: bytes, decoded by the caller.
        return py::make_tuple(stopped.empty() ? reinterpret_cast<uintptr_t>(module) : uintptr_t(0), py::bytes(text),
                              stopped);
      },
      py::arg("parse"), py::arg("dispose_string"), py::arg("context"), py::arg("bitcode"),
      "(module address or 0, LLVM's error message, why the parse stopped: '' if it returned).");
}

}  // namespace torch_metallib::bindings

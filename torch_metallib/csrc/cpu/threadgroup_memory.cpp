#include "cpu/threadgroup_memory.h"

namespace torch_metallib::cpu {

ThreadgroupMemory& threadgroup_memory() {
  thread_local ThreadgroupMemory memory;
  return memory;
}

}  // namespace torch_metallib::cpu

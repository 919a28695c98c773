#include "cuda/cuda_launcher.h"

#include <algorithm>
#include <cstring>

#include "dispatch/command_list.h"

namespace torch_metallib::cuda {
namespace {

constexpr int64_t kDefaultShared = 48 * 1024;  // dynamic shared memory without opting in
constexpr int64_t kMaxBlocks[3] = {2147483647, 65535, 65535};

// One launch: its blocks, block shape and first threadgroup (the grid's edge threadgroups,
// smaller, go in launches of their own so every CUDA block is one Metal threadgroup).
struct Part {
  int64_t blocks, block, first;
};

std::vector<Part> parts(int64_t grid, int64_t group, int axis) {
  std::vector<Part> out;
  const int64_t full = grid / group, rest = grid % group;
  for (int64_t start = 0; start < full; start += kMaxBlocks[axis]) {
    out.push_back({std::min(full - start, kMaxBlocks[axis]), group, start});
  }
  if (rest) out.push_back({1, rest, full});
  return out;
}

}  // namespace

CudaLauncher::CudaLauncher(std::vector<dispatch::ConstantValue> constants, KernelHandles kernel,
                           std::vector<ParameterSlot> slots, std::function<Stream(int)> current_stream)
    : constants_(std::move(constants)), kernel_(kernel), slots_(std::move(slots)),
      current_stream_(std::move(current_stream)), api_(driver_api()) {
  // The entry's parameters at their natural alignment: a u64 pointer or a u32 offset per
  // slot, then the 9 u32 launch parameters (backends/cuda/backend.py, _parameter_layout).
  size_t offset = 0;
  auto place = [&](size_t size) {
    offset += (size - offset % size) % size;
    offsets_.push_back(offset);
    offset += size;
  };
  for (const ParameterSlot& slot : slots_) place(slot.threadgroup ? 4 : 8);
  for (int i = 0; i < 9; ++i) place(4);
  size_ = offset;
}

CudaLauncher::~CudaLauncher() {
  // Freed after the launches that read them; a stream or context already gone leaves
  // nothing to order against, and the memory goes with the context.
  for (const auto& [key, copy] : bytes_) api_.mem_free_async(copy.base, copy.stream);
}

int CudaLauncher::slot_of(bool threadgroup, int binding) const {
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].threadgroup == threadgroup && slots_[i].binding == binding) return int(i);
  }
  return -1;
}

void CudaLauncher::shape(const dispatch::CommandList& commands, int64_t grid[3], int64_t block[3]) const {
  // CUDA's threads: the grid's, or where each runs `coarsening` positions along x, fewer.
  grid[0] = (int64_t(commands.grid[0]) + kernel_.coarsening - 1) / kernel_.coarsening;
  grid[1] = commands.grid[1];
  grid[2] = commands.grid[2];
  for (int axis = 0; axis < 3; ++axis) block[axis] = commands.group[axis];
  if (kernel_.grid_only && grid[1] == 1 && grid[2] == 1) {  // the block is ours to choose
    block[0] = std::max<int64_t>(1, std::min<int64_t>(kernel_.grid_only_block, grid[0]));
    block[1] = block[2] = 1;
  }
}

bool CudaLauncher::accepts(const dispatch::Plan& plan) const {
  if (!plan.device.is_cuda() || plan.device.index() != kernel_.device || !plan.commands) return false;
  const dispatch::CommandList& commands = *plan.commands;
  int64_t grid[3], block[3];
  shape(commands, grid, block);
  const int64_t threads = block[0] * block[1] * block[2];
  int64_t dynamic = 0;
  for (const dispatch::ThreadgroupCommand& t : commands.threadgroup) dynamic += t.length;
  // Larger blocks than the kernel was loaded for, more shared memory than it was opted in
  // to, and device copies of bytes are the full path's to arrange (or refuse).
  return (commands.bytes.empty() || api_.mem_alloc_async != nullptr) && threads <= kernel_.max_threads &&
         (dynamic + kernel_.static_shared <= kDefaultShared || dynamic <= kernel_.dynamic_allowed) &&
         dispatch::same_constants(plan.constants, constants_);
}

void CudaLauncher::launch(const dispatch::Plan& plan) {
  const dispatch::CommandList& commands = *plan.commands;
  Context current = nullptr;
  api_.check(api_.ctx_get_current(&current), "cuCtxGetCurrent");
  if (current != kernel_.context) api_.check(api_.ctx_set_current(kernel_.context), "cuCtxSetCurrent");
  alignas(8) uint8_t packed[4096];
  if (size_ > sizeof packed) throw DriverError(commands.function + ": too many parameters for a native launch");
  std::memset(packed, 0, size_);  // unbound arguments: null pointers
  for (const dispatch::BufferCommand& b : commands.buffers) {
    const int slot = slot_of(false, b.index);
    if (slot < 0) continue;
    const uint64_t address = reinterpret_cast<uintptr_t>(b.tensor.storage().data_ptr().get()) + uint64_t(b.offset);
    std::memcpy(packed + offsets_[size_t(slot)], &address, 8);
  }
  const Stream stream = current_stream_(kernel_.device);
  if (!commands.bytes.empty()) place_bytes(commands, stream, packed);
  uint32_t dynamic = 0;
  for (const dispatch::ThreadgroupCommand& t : commands.threadgroup) {
    const int slot = slot_of(true, t.index);
    if (slot >= 0) std::memcpy(packed + offsets_[size_t(slot)], &dynamic, 4);
    dynamic += uint32_t(t.length);
  }
  int64_t grid[3], group[3];
  shape(commands, grid, group);
  uint32_t launch_parameters[9] = {commands.grid[0], commands.grid[1], commands.grid[2],
                                   uint32_t(group[0]), uint32_t(group[1]), uint32_t(group[2]), 0, 0, 0};
  size_t size = size_;
  void* extra[] = {reinterpret_cast<void*>(uintptr_t(1)), packed, reinterpret_cast<void*>(uintptr_t(2)), &size,
                   nullptr};
  const std::vector<Part> x = parts(grid[0], group[0], 0), y = parts(grid[1], group[1], 1),
                          z = parts(grid[2], group[2], 2);
  for (const Part& pz : z) {
    for (const Part& py : y) {
      for (const Part& px : x) {
        launch_parameters[6] = uint32_t(px.first);
        launch_parameters[7] = uint32_t(py.first);
        launch_parameters[8] = uint32_t(pz.first);
        for (int i = 0; i < 9; ++i) std::memcpy(packed + offsets_[slots_.size() + size_t(i)], &launch_parameters[i], 4);
        api_.check(api_.launch_kernel(kernel_.function, unsigned(px.blocks), unsigned(py.blocks), unsigned(pz.blocks),
                                      unsigned(px.block), unsigned(py.block), unsigned(pz.block), dynamic, stream,
                                      nullptr, extra),
                   "cuLaunchKernel");
      }
    }
  }
}

void CudaLauncher::place_bytes(const dispatch::CommandList& commands, Stream stream, uint8_t* packed) {
  // Kernels never write these bytes, so one device copy serves every call with the same
  // content on the same stream (on another stream it could be read before its copy ran).
  std::string key(reinterpret_cast<const char*>(&stream), sizeof stream);
  std::vector<size_t> starts;
  size_t end = 0;
  for (const dispatch::BytesCommand& b : commands.bytes) {
    end += (256 - end % 256) % 256;  // each part 256-byte aligned
    starts.push_back(end);
    end += size_t(b.length);
    key.append(reinterpret_cast<const char*>(&b.index), sizeof b.index);
    key.append(reinterpret_cast<const char*>(&b.length), sizeof b.length);
    key.append(static_cast<const char*>(b.data), size_t(b.length));
  }
  auto found = bytes_.find(key);
  if (found == bytes_.end()) {
    if (bytes_.size() >= kKeptBytes) {  // the least recently used goes, after the launches that read it
      auto oldest = bytes_.begin();
      for (auto it = bytes_.begin(); it != bytes_.end(); ++it) {
        if (it->second.used < oldest->second.used) oldest = it;
      }
      api_.check(api_.mem_free_async(oldest->second.base, oldest->second.stream), "cuMemFreeAsync");
      bytes_.erase(oldest);
    }
    std::vector<uint8_t> blob(end);
    for (size_t i = 0; i < commands.bytes.size(); ++i) {
      std::memcpy(blob.data() + starts[i], commands.bytes[i].data, size_t(commands.bytes[i].length));
    }
    DeviceBytes copy;
    copy.stream = stream;
    api_.check(api_.mem_alloc_async(&copy.base, std::max<size_t>(end, 1), stream), "cuMemAllocAsync");
    // From pageable memory the driver stages the bytes before it returns: `blob` may go.
    api_.check(api_.memcpy_htod_async(copy.base, blob.data(), end, stream), "cuMemcpyHtoDAsync");
    found = bytes_.emplace(std::move(key), copy).first;
  }
  found->second.used = ++clock_;
  for (size_t i = 0; i < commands.bytes.size(); ++i) {
    const int slot = slot_of(false, commands.bytes[i].index);
    if (slot < 0) continue;
    const uint64_t address = found->second.base + starts[i];
    std::memcpy(packed + offsets_[size_t(slot)], &address, 8);
  }
}

}  // namespace torch_metallib::cuda

#include "dispatch/binding_plan.h"
#include "dispatch/command_list.h"

#include <ATen/MemoryOverlap.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

namespace torch_metallib::dispatch {
namespace {

constexpr int64_t kMetalMaxThreadsPerGroup = 1024;
constexpr int64_t kMetalMaxThreadgroupBytes = 32768;  // Apple GPUs' threadgroup memory
constexpr int64_t kMetalMaxGroupDim[3] = {1024, 1024, 64};

}  // namespace

ArgumentKind argument_kind(const std::string& name) {
  return name == "buffer"            ? ArgumentKind::Buffer
         : name == "indirect_buffer" ? ArgumentKind::IndirectBuffer
         : name == "threadgroup"     ? ArgumentKind::Threadgroup
                                     : ArgumentKind::Other;
}

Access access_of(const std::string& name) {
  return name == "write" ? Access::Write : name == "read_write" ? Access::ReadWrite : Access::Read;
}

int64_t available_bytes(const at::Tensor& tensor) {
  return int64_t(tensor.storage().nbytes()) - tensor.storage_offset() * int64_t(tensor.element_size());
}

Span view_span(const at::Tensor& tensor) {
  if (tensor.numel() == 0) return {};
  int64_t low = 0, high = 0;  // elements from the first one, below and above it
  for (int64_t d = 0; d < tensor.dim(); ++d) {
    const int64_t reach = (tensor.sizes()[size_t(d)] - 1) * tensor.strides()[size_t(d)];
    (reach < 0 ? low : high) += reach;
  }
  const int64_t item = int64_t(tensor.element_size());
  return {low * item, (high - low + 1) * item, false};
}

Span storage_span(const at::Tensor& tensor) {
  return {-int64_t(tensor.storage_offset()) * int64_t(tensor.element_size()), int64_t(tensor.storage().nbytes()), true};
}

bool Plan::storage_bounded(int position) const {
  return size_t(position) < storage_bounds.size() && storage_bounds[size_t(position)];
}

Span Plan::span(int position) const {
  const ParameterBinding& binding = bindings[size_t(position)];
  if (binding.kind == ParameterBinding::Kind::Tensor) {
    return storage_bounded(position) ? storage_span(binding.tensor) : view_span(binding.tensor);
  }
  return {0, extents[size_t(position)]};
}

std::string ArgumentSpec::describe() const {
  // Built with std::to_string, not a stream: an extension's inlined stream code met a
  // system libstdc++ it did not match on one GPU machine (torch 2.11) and crashed.
  if (!description.empty()) return description;
  const std::string head = "argument " + std::to_string(position) + " '" + name + "' (";
  if (holds_pointer && !members.empty()) return members.front().element->describe();
  if (kind == ArgumentKind::IndirectBuffer) {
    return head + "buffer(" + std::to_string(binding) + "), argument buffer " + type_name + ")";
  }
  std::string out = head + (kind == ArgumentKind::Threadgroup ? "threadgroup" : "buffer") + "(" +
                    std::to_string(binding) + "), " + address_space +
                    (access == Access::Read && address_space == "device" ? " const " : " ") + type_name;
  if (buffer_size < 0) {
    out += "*";
  } else if (type_size > 0 && buffer_size > type_size) {
    out += " (&)[" + std::to_string(buffer_size / type_size) + "]";
  } else {
    out += "&";
  }
  return out + ")";
}

KernelSpec::KernelSpec(std::string name, int parameter_count, std::vector<ArgumentSpec> arguments,
                       std::vector<ConstantSpec> constants, int64_t max_threads, int64_t static_threadgroup_bytes,
                       std::vector<std::pair<std::string, ConstantPredicate>> predicates)
    : name_(std::move(name)),
      parameter_count_(parameter_count),
      arguments_(std::move(arguments)),
      constants_(std::move(constants)),
      max_threads_(max_threads > 0 ? max_threads : kMetalMaxThreadsPerGroup),
      static_threadgroup_bytes_(static_threadgroup_bytes),
      predicates_(std::move(predicates)) {
  for (ArgumentSpec& argument : arguments_) argument.type = find_metal_type(argument.type_name);
  for (ConstantSpec& constant : constants_) constant.type = find_metal_type(constant.type_name);
  std::stable_sort(arguments_.begin(), arguments_.end(), [](const ArgumentSpec& a, const ArgumentSpec& b) {
    // Buffer slots first ([[buffer(n)]], argument buffers included), in binding order.
    return std::make_pair(!a.buffer_slot(), a.binding) < std::make_pair(!b.buffer_slot(), b.binding);
  });
}

void KernelSpec::check_device(Plan& plan, const ArgumentSpec& argument, const at::Tensor& tensor,
                              bool& device_seen) const {
  if (device_seen && tensor.device() != plan.device) {
    throw ArgumentError(name_ + ": " + argument.describe() + ": expected a tensor on " + plan.device.str() +
                        " like the arguments before it, got one on " + tensor.device().str() +
                        ". Move all tensors to one device");
  }
  plan.device = tensor.device();
  device_seen = true;
}

// torch's names of the layouts (no stream: see ArgumentSpec::describe).
static std::string layout_name(c10::Layout layout) {
  switch (layout) {
    case c10::kStrided: return "torch.strided";
    case c10::kSparse: return "torch.sparse_coo";
    case c10::kSparseCsr: return "torch.sparse_csr";
    case c10::kSparseCsc: return "torch.sparse_csc";
    case c10::kSparseBsr: return "torch.sparse_bsr";
    case c10::kSparseBsc: return "torch.sparse_bsc";
    case c10::kMkldnn: return "torch._mkldnn";
    default: return "number " + std::to_string(int(layout));
  }
}

void KernelSpec::check_layout(const ArgumentSpec& argument, const at::Tensor& tensor) const {
  if (tensor.layout() != c10::kStrided) {
    throw ArgumentError(name_ + ": " + argument.describe() +
                        ": expected a dense (strided) tensor, got one with layout " + layout_name(tensor.layout()) +
                        ", whose elements have no address a kernel can use. "
                        "Pass x.to_dense()");
  }
}

void KernelSpec::bind_tensor(Plan& plan, const ArgumentSpec& argument, const at::Tensor& tensor,
                             bool& device_seen) const {
  check_layout(argument, tensor);
  // A 0-d CPU tensor read as a value (of another dtype, or beside tensors on a GPU, as
  // torch takes CPU scalars): its value, converted to the kernel's type.
  const bool beside_gpu_tensors = device_seen && !plan.device.is_cpu() && !plan.device.is_meta();
  if (tensor.dim() == 0 && tensor.device().is_cpu() && !argument.writable() && argument.type != nullptr &&
      (tensor.scalar_type() != argument.type->dtypes.front() || beside_gpu_tensors)) {
    at::Scalar item = tensor.item();
    bind_number(plan, argument,
                item.isFloatingPoint() ? Number::of(item.toDouble())
                : item.isBoolean()     ? Number::of_bool(item.toBool())
                                       : Number::of(item.toLong()));
    return;
  }
  check_device(plan, argument, tensor, device_seen);
  check_tensor(argument, tensor);
  refuse_overlap(argument, tensor);
  plan.addresses[argument.position] = tensor.data_ptr();
  plan.extents[argument.position] = available_bytes(tensor);
  plan.bindings[argument.position] = {ParameterBinding::Kind::Tensor, argument.binding, tensor, argument.writable()};
}

void KernelSpec::check_tensor(const ArgumentSpec& argument, const at::Tensor& tensor) const {
  auto where = [&] { return name_ + ": " + argument.describe(); };
  if (argument.type != nullptr) {
    const auto& dtypes = argument.type->dtypes;
    if (std::find(dtypes.begin(), dtypes.end(), tensor.scalar_type()) == dtypes.end()) {
      throw ArgumentError(where() + ": expected a tensor of " + dtype_names(*argument.type) + ", got " +
                          torch_dtype_name(tensor.scalar_type()) + ". Convert it with .to(" +
                          torch_dtype_name(dtypes.front()) + ")");
    }
  }
  // What the kernel's type says it reads from the tensor's first element: a reference's
  // bytes (a struct, an array, a `constant T&`), or one struct through a pointer. The view
  // must hold them itself: bytes past its end belong to other tensors or other slices.
  const int64_t needed = argument.buffer_size >= 0 ? argument.buffer_size : (argument.type ? 0 : argument.type_size);
  if (needed <= 0) return;
  const Span view = view_span(tensor);
  const int64_t bytes = view.begin + view.bytes;  // from its first element to the end of its reach
  if (bytes < needed) {
    const int64_t storage = available_bytes(tensor);
    throw DispatchFailure(where() + ": expected at least " + std::to_string(needed) + " bytes, got a tensor with " +
                          std::to_string(bytes) + " bytes (" + std::to_string(tensor.numel()) +
                          (tensor.numel() == 1 ? " element of " : " elements of ") +
                          std::to_string(tensor.element_size()) + (tensor.element_size() == 1 ? " byte" : " bytes") +
                          (storage > bytes ? "; its storage holds " + std::to_string(storage) +
                                                 " from its first element, but they are not the view's"
                                           : "") +
                          "). Pass a tensor whose own elements hold all " + std::to_string(needed) + " bytes");
  }
}

// "[64, 1]" (no stream: see ArgumentSpec::describe).
static std::string int_list(c10::IntArrayRef values) {
  std::string out;
  for (int64_t v : values) out += (out.empty() ? "" : ", ") + std::to_string(v);
  return "[" + out + "]";
}

std::string overlap_refusal(const at::Tensor& tensor) {
  // torch's own test (Yes: a stride 0 over more than one element); TooHard passes, as in torch.
  if (at::has_internal_overlap(tensor) != at::MemOverlap::Yes) return "";
  return "expected a tensor whose elements do not overlap, got sizes " + int_list(tensor.sizes()) + " and strides " +
         int_list(tensor.strides()) +
         ", in which several indices reach one element (torch refuses in-place "
         "writes into such a tensor too). Pass a tensor of its own, e.g. x.clone()";
}

void KernelSpec::refuse_overlap(const ArgumentSpec& argument, const at::Tensor& tensor) const {
  if (!argument.writable()) return;  // reading one element twice is fine
  const std::string problem = overlap_refusal(tensor);
  if (!problem.empty())
    throw ArgumentError(name_ + ": " + argument.describe() + ": the kernel writes to it; " + problem);
}

void KernelSpec::bind_number(Plan& plan, const ArgumentSpec& argument, const Number& number) const {
  auto where = [&] { return name_ + ": " + argument.describe(); };
  if (argument.writable()) {
    throw ArgumentError(where() + ": the kernel writes to it; expected a tensor, got " + number_text(number));
  }
  if (argument.type == nullptr || argument.type->components != 1) {
    throw ArgumentError(where() + ": '" + argument.type_name + "' is not a scalar type; expected a tensor, got " +
                        number_text(number));
  }
  auto storage = allocate(size_t(std::max<int64_t>(argument.type_size, argument.type->element_bytes)));
  PackProblem problem = pack_number(*argument.type, number, reinterpret_cast<uint8_t*>(storage->data()));
  if (problem != PackProblem::None) {
    throw ArgumentError(where() + ": expected " + wanted(*argument.type) + ", got " +
                        found(problem, number_text(number)));
  }
  bind_bytes(plan, argument, std::move(storage), argument.type_size, [&] { return number_text(number); });
}

void KernelSpec::bind_absent(Plan& plan, const ArgumentSpec& argument) const {
  // Apple's compiler may load from an argument before the branch that needs it (MLX's
  // GEMM reads its addmm_params even when use_out_source is false); on a GPU an unbound
  // slot reads harmlessly, so here it points at zeros of the argument's size.
  if (!argument.buffer_slot()) return;
  const int64_t bytes = std::max<int64_t>({argument.buffer_size, argument.type_size, 16});
  auto storage = allocate(size_t(bytes));
  plan.addresses[argument.position] = storage->data();
  plan.extents[argument.position] = bytes;
  plan.bindings[argument.position] = {ParameterBinding::Kind::Bytes, argument.binding, {}, false};
  plan.packed.push_back(std::move(storage));
}

void KernelSpec::bind_bytes(Plan& plan, const ArgumentSpec& argument, std::shared_ptr<std::vector<uint64_t>> storage,
                            int64_t bytes, c10::function_ref<std::string()> source) const {
  if (argument.buffer_size >= 0 && bytes < argument.buffer_size) {
    throw DispatchFailure(name_ + ": " + argument.describe() + ": expected " + std::to_string(argument.buffer_size) +
                          " bytes, got " + std::to_string(bytes) + " from " + source());
  }
  plan.addresses[argument.position] = storage->data();
  plan.extents[argument.position] = bytes;
  plan.bindings[argument.position] = {ParameterBinding::Kind::Bytes, argument.binding, {}, false};
  plan.packed.push_back(std::move(storage));
}

// --- constants ----------------------------------------------------------------------------

std::vector<ConstantValue> KernelSpec::check_constants(const std::vector<std::pair<size_t, Number>>& values) const {
  std::vector<ConstantValue> bound;
  std::vector<bool> seen(constants_.size(), false);
  for (const auto& [slot, value] : values) {
    const ConstantSpec& c = constants_.at(slot);
    if (seen[slot]) throw DispatchFailure(name_ + ": constants: " + c.name + " is given twice (by name and by index)");
    seen[slot] = true;
    if (c.type == nullptr || c.type->components != 1) {
      throw DispatchFailure(name_ + ": function constant " + c.name + " has type " + c.type_name +
                            ", which this backend cannot set");
    }
    uint8_t scratch[8] = {0};
    PackProblem problem = pack_number(*c.type, value, scratch);
    if (problem != PackProblem::None) {
      throw DispatchFailure(name_ + ": function constant " + c.name + " (" + c.type_name + ", index " +
                            std::to_string(c.index) + "): expected " +
                            (c.type->kind == ScalarKind::Bool    ? "a bool"
                             : c.type->kind == ScalarKind::Float ? "a number"
                                                                 : "an integer") +
                            ", got " + found(problem, number_text(value)));
    }
    ConstantValue cv{c.index, c.type->kind == ScalarKind::Float, 0, 0.0, c.type};
    std::memcpy(cv.bytes, scratch, sizeof(cv.bytes));
    if (cv.is_float) {
      cv.real = value.as_double();
    } else {
      cv.integer = value.kind == Number::Kind::UInt64 ? int64_t(value.big) : value.integer;
    }
    bound.push_back(cv);
  }
  std::string missing;
  for (size_t i = 0; i < constants_.size(); ++i) {
    if (!seen[i] && constants_[i].required) {
      missing += (missing.empty() ? "" : ", ") + constants_[i].name + " (" + constants_[i].type_name + ", index " +
                 std::to_string(constants_[i].index) + ")";
    }
  }
  if (!missing.empty()) {
    throw DispatchFailure(name_ + ": missing function constants: " + missing +
                          ". Pass them as constants={name: value, ...}");
  }
  std::sort(bound.begin(), bound.end(),
            [](const ConstantValue& a, const ConstantValue& b) { return a.index < b.index; });
  return bound;
}

// --- grid -----------------------------------------------------------------------------------

void KernelSpec::bind_grid(Plan& plan, c10::ArrayRef<int64_t> grid_extents,
                           c10::ArrayRef<int64_t> group_extents) const {
  int64_t grid[3] = {1, 1, 1}, group[3] = {std::min(grid_extents[0], max_threads_), 1, 1};
  std::copy(grid_extents.begin(), grid_extents.end(), grid);
  if (!group_extents.empty()) std::copy(group_extents.begin(), group_extents.end(), group);
  int64_t total = group[0] * group[1] * group[2];
  if (total > max_threads_ || group[0] > kMetalMaxGroupDim[0] || group[1] > kMetalMaxGroupDim[1] ||
      group[2] > kMetalMaxGroupDim[2]) {
    throw DispatchFailure(name_ + ": group_size: expected at most " + std::to_string(max_threads_) +
                          " threads per threadgroup (at most 1024 x 1024 x 64), got " + std::to_string(group[0]) +
                          " x " + std::to_string(group[1]) + " x " + std::to_string(group[2]));
  }
  uint64_t count = 1;
  for (int axis = 0; axis < 3; ++axis) {
    int64_t groups = (grid[axis] + group[axis] - 1) / group[axis];
    plan.dims[axis] = uint32_t(grid[axis]);
    plan.dims[3 + axis] = uint32_t(group[axis]);
    plan.dims[6 + axis] = uint32_t(groups);
    count *= uint64_t(groups);
  }
  if (count > std::numeric_limits<uint32_t>::max()) {
    throw DispatchFailure(name_ + ": threads / group_size: expected fewer than 2**32 threadgroups, got " +
                          std::to_string(count) + ". Use a larger group_size");
  }
  plan.group_count = count;
}

bool KernelSpec::guard_on(const ArgumentSpec& argument, const std::vector<ConstantValue>& constants) const {
  if (argument.guard.empty()) return true;
  for (const ConstantSpec& c : constants_) {
    if (c.name != argument.guard) continue;
    for (const ConstantValue& v : constants) {
      if (v.index == c.index) return v.integer != 0;
    }
    return false;  // an optional constant that was not set
  }
  for (const auto& [name, predicate] : predicates_) {
    if (name == argument.guard) return predicate.evaluate(constants) != 0;
  }
  return true;  // a derived guard whose expression reflection could not read
}

std::string KernelSpec::left_out_because(const ArgumentSpec& argument) const {
  const bool declared = std::any_of(constants_.begin(), constants_.end(),
                                    [&](const ConstantSpec& c) { return c.name == argument.guard; });
  return declared ? "function constant " + argument.guard + " is false"
                  : argument.guard + " (which the kernel derives from its function constants) is false";
}

void KernelSpec::refuse_unbindable(const std::vector<ConstantValue>& constants) const {
  for (const ArgumentSpec& argument : arguments_) {
    const bool bindable = argument.kind != ArgumentKind::Other;
    if (bindable || !guard_on(argument, constants)) continue;
    std::string because = argument.guard.empty() ? "" : " (present because " + argument.guard + " is true)";
    throw UnsupportedCall(name_ + ": cannot be called: " + argument.describe() + because + " is a " +
                          argument.kind_name +
                          ", which the binding plan does not bind yet. Run it on a Mac with MPS tensors" +
                          (argument.guard.empty() ? "" : ", or choose constants that leave it out"));
  }
}

void KernelSpec::refuse_empty(const Plan& plan, const std::vector<const ArgumentSpec*>& empty) const {
  const uint64_t threads = uint64_t(plan.dims[0]) * plan.dims[1] * plan.dims[2];
  if (threads > 0 && !empty.empty()) {
    throw DispatchFailure(name_ + ": " + empty.front()->describe() +
                          ": expected a tensor with elements, got an "
                          "empty one; the kernel uses this argument, and its " +
                          std::to_string(threads) +
                          " threads would read or write past the tensor. Pass a tensor with elements");
  }
}

void KernelSpec::finish(Plan& plan) const {
  auto commands = std::make_shared<CommandList>(command_list(plan, name_));
  cpu_addresses(*commands, plan.addresses);
  plan.commands = std::move(commands);
}

void KernelSpec::bind_threadgroup_memory(Plan& plan, const std::vector<std::pair<int, int64_t>>& sizes) const {
  std::vector<const ArgumentSpec*> wanted;
  for (const ArgumentSpec& argument : arguments_) {
    if (argument.kind == ArgumentKind::Threadgroup) wanted.push_back(&argument);
  }
  for (const auto& [binding, bytes] : sizes) {
    if (std::none_of(wanted.begin(), wanted.end(), [&](const ArgumentSpec* a) { return a->binding == binding; })) {
      std::string slots;
      for (const ArgumentSpec* a : wanted)
        slots += (slots.empty() ? "" : ", ") + std::to_string(a->binding) + " (" + a->name + ")";
      throw DispatchFailure(name_ + ": threadgroup_memory: no threadgroup argument at index " +
                            std::to_string(binding) + "; expected " +
                            (slots.empty() ? "none (the kernel takes no threadgroup memory)" : slots));
    }
  }
  int64_t total = static_threadgroup_bytes_;
  for (const ArgumentSpec* a : wanted) {
    auto given = std::find_if(sizes.begin(), sizes.end(), [&](const auto& size) { return size.first == a->binding; });
    if (given == sizes.end()) {
      throw DispatchFailure(name_ + ": " + a->describe() + " needs its size: pass threadgroup_memory={" +
                            std::to_string(a->binding) + ": nbytes}");
    }
    int64_t bytes = given->second;
    if (bytes <= 0 || bytes % 16) {
      throw DispatchFailure(name_ + ": threadgroup_memory[" + std::to_string(a->binding) + "] (" + a->name +
                            "): expected a positive multiple of 16 bytes, as Metal requires, got " +
                            std::to_string(bytes));
    }
    // What the kernel's own type says is there: a fixed array or struct (a reference), or
    // at least one element.
    const int64_t declared = std::max<int64_t>(a->buffer_size, a->type_size);
    if (bytes < declared) {
      throw DispatchFailure(name_ + ": threadgroup_memory[" + std::to_string(a->binding) + "] (" + a->name +
                            "): expected at least " + std::to_string(declared) + " bytes, the size of " +
                            a->describe() + " as the kernel declares it, got " + std::to_string(bytes));
    }
    total += bytes;
    plan.threadgroup_buffers.emplace_back(a->position, bytes);
    plan.bindings[size_t(a->position)] = {ParameterBinding::Kind::Threadgroup, a->binding, {}, true};
  }
  if (total > kMetalMaxThreadgroupBytes) {
    throw DispatchFailure(name_ + ": threadgroup memory: expected at most " +
                          std::to_string(kMetalMaxThreadgroupBytes) + " bytes per threadgroup (Apple GPUs), got " +
                          std::to_string(total) + " (" + std::to_string(static_threadgroup_bytes_) +
                          " declared by the kernel)");
  }
}

}  // namespace torch_metallib::dispatch

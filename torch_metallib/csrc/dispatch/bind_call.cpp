// The whole call: values assigned to arguments, constants, every argument bound, threadgroup
// memory, the grid, then the command list. One builder for kernel calls and operators.
#include <algorithm>
#include <limits>

#include "dispatch/binding_plan.h"
#include "dispatch/command_list.h"

namespace torch_metallib::dispatch {

const ArgumentSpec& KernelSpec::named_argument(const std::string& name, const std::string& context) const {
  for (const ArgumentSpec& a : arguments_) {
    if (a.name == name) return a;
  }
  std::string names;
  for (const ArgumentSpec& a : arguments_) names += (names.empty() ? "" : ", ") + a.name;
  throw ArgumentError(context + "no argument named '" + name + "'; expected one of: " + names);
}

c10::SmallVector<const CallValue*, 16> KernelSpec::assign(const CallArguments& call,
                                                          const std::vector<ConstantValue>& constants) const {
  c10::SmallVector<const CallValue*, 16> values(arguments_.size(), nullptr);
  if (call.origin == CallOrigin::Operator) {  // by IR parameter position
    for (size_t slot = 0; slot < arguments_.size(); ++slot) {
      const size_t position = size_t(arguments_[slot].position);
      if (position < call.positional.size()) values[slot] = &call.positional[position];
    }
    return values;
  }
  auto guard_on = [&](const ArgumentSpec& argument) { return this->guard_on(argument, constants); };
  c10::SmallVector<size_t, 16> active;  // slots that take positional values: present, and not threadgroup memory
  for (size_t slot = 0; slot < arguments_.size(); ++slot) {
    if (guard_on(arguments_[slot]) && arguments_[slot].kind != ArgumentKind::Threadgroup) active.push_back(slot);
  }
  if (call.positional.size() > active.size()) {
    std::string names, left_out;
    for (size_t slot : active) names += (names.empty() ? "" : ", ") + arguments_[slot].name;
    for (const ArgumentSpec& a : arguments_) {
      if (!guard_on(a)) left_out += "; " + a.name + " is left out because " + left_out_because(a);
    }
    throw ArgumentError(name_ + ": expected at most " + std::to_string(active.size()) + " arguments (" + names +
                        left_out + "), got " + std::to_string(call.positional.size()));
  }
  for (size_t i = 0; i < call.positional.size(); ++i) values[active[i]] = &call.positional[i];
  for (const auto& [name, value] : call.named) {
    const ArgumentSpec* found = &named_argument(name, name_ + ": ");
    if (found->kind == ArgumentKind::Threadgroup) {
      throw ArgumentError(name_ + ": " + found->describe() +
                          " is threadgroup memory, not a value; set its size with "
                          "threadgroup_memory={" +
                          std::to_string(found->binding) + ": nbytes}");
    }
    const size_t slot = size_t(found - arguments_.data());
    if (values[slot] != nullptr) {
      throw ArgumentError(name_ + ": " + found->describe() + " is given twice (by position and by name)");
    }
    values[slot] = &value;
  }
  return values;
}

Plan KernelSpec::bind(const CallArguments& call) const {
  const bool from_python = call.origin == CallOrigin::Python;
  Plan plan;
  plan.addresses.assign(size_t(parameter_count_), nullptr);
  plan.extents.assign(size_t(parameter_count_), 0);
  plan.bindings.assign(size_t(parameter_count_), {});
  plan.constants = check_constants(call.constants);
  refuse_unbindable(plan.constants);
  const auto values = assign(call, plan.constants);
  bool device_seen = false;
  int64_t default_threads = -1;
  std::vector<const ArgumentSpec*> empty;  // used arguments given a tensor without elements
  for (size_t slot = 0; slot < arguments_.size(); ++slot) {
    const ArgumentSpec& argument = arguments_[slot];
    if (argument.kind == ArgumentKind::Threadgroup) continue;  // see bind_threadgroup_memory
    const CallValue* value = values[slot];
    const bool present = value != nullptr && value->given();
    if (!guard_on(argument, plan.constants)) {
      if (present && from_python) {
        const bool declared = std::any_of(constants_.begin(), constants_.end(),
                                          [&](const ConstantSpec& c) { return c.name == argument.guard; });
        throw DispatchFailure(name_ + ": " + argument.describe() + " is left out because " +
                              left_out_because(argument) +
                              (declared ? "; set constants={'" + argument.guard + "': True} or drop it"
                                        : " with these constants; drop it or change the constants it derives from"));
      }
      bind_absent(plan, argument);
      continue;
    }
    if (!present) {
      if (argument.unused) {  // the kernel never reads it
        bind_absent(plan, argument);
        continue;
      }
      throw ArgumentError(name_ + ": missing " + argument.describe() +
                          (from_python ? "; pass it by position or as " + argument.name + "=..." : ""));
    }
    bind_value(plan, argument, *value, call.origin, device_seen);
    if (value->kind == CallValue::Kind::Tensor) {
      const int64_t numel = value->tensor.numel();
      if (default_threads < 0) default_threads = numel;
      if (numel == 0 && !argument.unused) empty.push_back(&argument);
    }
  }
  bind_threadgroup_memory(plan, call.threadgroup_memory);
  int64_t default_grid[1] = {default_threads};
  c10::ArrayRef<int64_t> grid = call.threads;
  if (grid.empty()) {
    if (default_threads < 1) {
      throw DispatchFailure(name_ + ": threads: no tensor argument to take the thread count from" +
                            std::string(default_threads == 0 ? " (the first tensor is empty)" : "") +
                            "; pass threads=N");
    }
    if (default_threads > int64_t(std::numeric_limits<uint32_t>::max())) {
      throw DispatchFailure(name_ + ": threads: the first tensor has " + std::to_string(default_threads) +
                            " elements, more than 2**32 - 1 threads; pass threads=(x, y, z)");
    }
    grid = default_grid;
  }
  if (grid.size() > 3 || call.group.size() > 3) {
    throw DispatchFailure(name_ + ": threads / group_size: expected 1-3 extents each, got " +
                          std::to_string(grid.size()) + " and " + std::to_string(call.group.size()));
  }
  for (int64_t extent : grid) {
    if (extent < 1 || extent > int64_t(std::numeric_limits<uint32_t>::max())) {
      throw DispatchFailure(name_ + ": threads: expected 1-3 positive extents below 2**32, got " +
                            std::to_string(extent));
    }
  }
  for (int64_t extent : call.group) {
    if (extent < 1) {
      throw DispatchFailure(name_ + ": group_size: expected positive extents, got " + std::to_string(extent));
    }
  }
  bind_grid(plan, grid, call.group);
  refuse_empty(plan, empty);
  allow_storage(plan, call.storage_bounds);
  finish(plan);
  return plan;
}

Plan KernelSpec::pipeline_plan(const std::vector<std::pair<size_t, Number>>& constants) const {
  Plan plan;
  plan.constants = check_constants(constants);
  plan.commands = std::make_shared<const CommandList>(command_list(plan, name_));
  return plan;
}

void KernelSpec::allow_storage(Plan& plan, const std::vector<std::string>& names) const {
  for (const std::string& name : names) {
    const ArgumentSpec& found = named_argument(name, name_ + ": storage_bounds: ");
    plan.storage_bounds.resize(plan.bindings.size(), false);
    plan.storage_bounds[size_t(found.position)] = true;
  }
}

}  // namespace torch_metallib::dispatch

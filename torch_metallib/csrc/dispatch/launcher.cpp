#include "dispatch/launcher.h"

#include <algorithm>

namespace torch_metallib::dispatch {

void Launchers::add(std::shared_ptr<Launcher> launcher) {
  entries_.insert(entries_.begin(), std::move(launcher));
  if (entries_.size() > kMaxLaunchers) {
    if (last_ == entries_.back().get()) last_ = nullptr;
    entries_.pop_back();
  }
}

const std::shared_ptr<Launcher>* Launchers::first_accepting(const Plan& plan) const {
  for (const auto& launcher : entries_) {
    if (launcher->current() && launcher->accepts(plan)) return &launcher;
  }
  return nullptr;
}

std::shared_ptr<Launcher> Launchers::find(const Plan& plan) {
  const std::shared_ptr<Launcher>* found = first_accepting(plan);
  if (found == nullptr) return nullptr;
  last_ = found->get();
  return *found;
}

void Launchers::clear() {
  entries_.clear();
  last_ = nullptr;
}

bool same_constants(const std::vector<ConstantValue>& a, const std::vector<ConstantValue>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].index != b[i].index || a[i].is_float != b[i].is_float || a[i].integer != b[i].integer ||
        (a[i].is_float && a[i].real != b[i].real))
      return false;
  }
  return true;
}

}  // namespace torch_metallib::dispatch

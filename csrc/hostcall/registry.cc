// Host callables by id, and the Python objects jaxbridge/_foreign/hostcall.py hands over.
#include "internal.h"

namespace jaxbridge::hostcall {

std::unordered_map<int64_t, std::shared_ptr<Entry>>& Registry() {
  static auto* registry = new std::unordered_map<int64_t, std::shared_ptr<Entry>>();
  return *registry;
}

std::shared_ptr<Entry> FindEntry(int64_t callback_id) {
  auto it = Registry().find(callback_id);
  return it == Registry().end() ? nullptr : it->second;
}

Hooks& TheHooks() {
  static auto* hooks = new Hooks();
  return *hooks;
}

}  // namespace jaxbridge::hostcall

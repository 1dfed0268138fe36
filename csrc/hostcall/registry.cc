// Host callables by id, and the Python objects jaxbridge/_foreign/hostcall.py hands over.
#include "internal.h"

namespace jaxbridge::hostcall {

std::unordered_map<int64_t, Entry>& Registry() {
  static auto* registry = new std::unordered_map<int64_t, Entry>();
  return *registry;
}

Hooks& TheHooks() {
  static auto* hooks = new Hooks();
  return *hooks;
}

}  // namespace jaxbridge::hostcall

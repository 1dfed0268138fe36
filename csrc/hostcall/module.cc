// The pybind11 module jaxbridge._hostcall: the FFI handlers' capsules and the registry,
// hooks, thread and shutdown controls that jaxbridge/_foreign/ uses (hostcall.py: callables
// and lowering; delivery.py: the hooks; threads.py: thread budgets; shutdown.py: exit).
#include <pybind11/stl.h>

#include <algorithm>

#include "internal.h"

namespace py = pybind11;
namespace jbh = jaxbridge::hostcall;

namespace {

template <typename T>
py::capsule EncapsulateFfiHandler(T* fn) {
  return py::capsule(reinterpret_cast<void*>(fn));
}

}  // namespace

PYBIND11_MODULE(_hostcall, m) {
  m.doc() = "jaxbridge native host-call trampoline (XLA FFI)";
  m.def("registrations", []() {
    py::dict cpu;
    cpu["jaxbridge_host_call"] = EncapsulateFfiHandler(JaxbridgeHostCallCpu);
    py::dict out;
    out["cpu"] = cpu;
#ifdef JAXBRIDGE_WITH_CUDA
    py::dict cuda;
    cuda["jaxbridge_host_call"] = EncapsulateFfiHandler(JaxbridgeHostCallCuda);
    out["CUDA"] = cuda;
#endif
    return out;
  }, "FFI handler capsules by platform: {platform: {target_name: capsule}}.");
  m.def("install_hooks", [](py::object delivery_class, py::object gc_collect,
                            py::object clear_frames, py::object release_deferred,
                            unsigned long main_thread) {
    jbh::Hooks& hooks = jbh::TheHooks();
    hooks.delivery_class = delivery_class.release().ptr();
    hooks.gc_collect = gc_collect.release().ptr();
    hooks.clear_frames = clear_frames.release().ptr();
    hooks.release_deferred = release_deferred.release().ptr();
    hooks.main_thread = main_thread;
  }, "Called once by jaxbridge._foreign.hostcall with the Python objects the handler needs.");
  m.def("register_callback", [](int64_t callback_id, py::handle fill, py::handle handler,
                                py::object direct) {
    auto entry = std::make_shared<jbh::Entry>();
    entry->fill = fill.ptr();  // borrowed
    entry->handler = handler.ptr();
    if (!direct.is_none()) {  // (fun, kind, finish[, n_in, live]): see CallDirect
      auto parts = direct.cast<py::tuple>();
      int kind = parts.size() >= 3 ? parts[1].cast<int>() : 0;
      bool ok = (parts.size() == 3 && (kind == jbh::kDirectReturns || kind == jbh::kDirectOut)) ||
                (parts.size() == 5 && (kind == jbh::kDirectAdjoint || kind == jbh::kDirectAdjointOut));
      if (!ok) {
        throw py::value_error(
            "register_callback: direct must be (fun, 1 or 2, finish) or "
            "(fun, 3 or 4, finish, n_in, live)");
      }
      entry->direct_fun = parts[0].ptr();
      entry->direct_kind = kind;
      entry->direct_finish = parts[2].ptr();
      if (kind == jbh::kDirectAdjoint || kind == jbh::kDirectAdjointOut) {
        entry->direct_n_in = parts[3].cast<Py_ssize_t>();
        entry->direct_live = parts[4].cast<std::vector<int>>();
        for (int i : entry->direct_live) {
          if (i < 0 || i >= entry->direct_n_in) throw py::value_error("register_callback: live");
        }
      }
    }
    jbh::Registry()[callback_id] = std::move(entry);
  }, py::arg("callback_id"), py::arg("fill"), py::arg("handler"),
     py::arg("direct") = py::none(),
     "Register `fill` under `callback_id`; `direct` = (fun, kind, finish[, n_in, live]) "
     "lets the handler call `fun` itself (kind 1: fun(*ins) returns the one result; kind "
     "2: fun(*ins, out=outs[0]) returns None; kind 3: a VJP rule, fun(ins[:n_in], "
     "ins[n_in], ins[n_in + 1]) returns n_in cotangents, those at `live` are the outputs; "
     "kind 4: the same rule called with out=, a tuple of the outputs at `live`, None "
     "elsewhere, returns None) "
     "and hand anything else to finish(value, outs). All are borrowed: `handler` must "
     "keep them alive.");
  m.def("unregister_callback", [](int64_t callback_id) {
    jbh::Registry().erase(callback_id);
    jbh::ForgetDeviceFill(callback_id);
  },
        py::arg("callback_id"));
  m.def("buffer_callback", &jbh::BufferCallbackEntry, py::arg("callback_id"),
        "The callable that jax.experimental.buffer_callback runs for host call "
        "`callback_id`: (exec_ctx, outputs, *inputs) -> None.");
  m.def("num_registered", []() { return jbh::Registry().size(); });
  m.def("copies_inputs", [](int64_t callback_id) {
    auto it = jbh::Registry().find(callback_id);
    return it != jbh::Registry().end() && it->second->copy;
  }, "Whether the callable gets copies (it kept a view once) instead of zero-copy views.");
  m.def("calls_started", [](int64_t callback_id) -> int64_t {
    auto it = jbh::Registry().find(callback_id);
    return it != jbh::Registry().end() ? it->second->started : -1;
  }, "How many calls of the callable have started (-1: not registered).");
  m.def("set_copies_inputs", [](int64_t callback_id, bool copy) {
    auto it = jbh::Registry().find(callback_id);
    if (it != jbh::Registry().end()) it->second->copy = copy;
  });
  m.def("take_pending", []() -> py::object {
    PyObject* exc = jbh::TakePending();
    if (exc == nullptr) return py::none();
    return py::reinterpret_steal<py::object>(exc);
  }, "The undelivered exception of this thread (used by the delivery class).");
  m.def("set_thread_policy", [](const std::string& policy, int limit,
                                const std::vector<std::pair<uintptr_t, uintptr_t>>& fns) {
    jbh::ThreadPolicy p = policy == "auto" ? jbh::ThreadPolicy::kAuto
                          : policy == "fixed" ? jbh::ThreadPolicy::kFixed
                          : jbh::ThreadPolicy::kLeave;
    return jbh::SetThreadPolicy(p, limit, fns);
  }, py::arg("policy"), py::arg("limit"), py::arg("functions"),
     "Thread budgets during host calls: 'auto', 'fixed' (at `limit`) or 'leave'; "
     "`functions` are the (get_num_threads, set_num_threads) addresses of each loaded BLAS "
     "library. False (nothing changed) while host calls run.");
  m.def("thread_budget", &jbh::CurrentThreadBudget,
        "The thread budget of the host call running on this thread (0: leave the "
        "libraries' own setting).");
  m.def("set_concurrency", [](int64_t callback_id, int calls) {
    auto it = jbh::Registry().find(callback_id);
    if (it != jbh::Registry().end()) {
      it->second->concurrency = std::max(it->second->concurrency, calls);
    }
  }, py::arg("callback_id"), py::arg("calls"),
     "A compiled program runs up to `calls` calls of `callback_id` at once.");
  m.def("thread_tuning", [](int64_t callback_id) -> py::object {
    auto it = jbh::Registry().find(callback_id);
    if (it == jbh::Registry().end()) return py::none();
    return it->second->tuner.State();
  }, py::arg("callback_id"), "The thread tuner's state of `callback_id` (tests).");
  jbh::DefineDeviceCall(m);
  m.def("begin_shutdown", &jbh::BeginShutdown, py::arg("timeout_seconds"),
        "atexit: refuse new host calls and wait for those in flight; returns how many "
        "are still running after the timeout.");
#ifdef JAXBRIDGE_WITH_CUDA
  m.attr("with_cuda") = true;
#else
  m.attr("with_cuda") = false;
#endif
  m.attr("__version__") = JAXBRIDGE_VERSION;
}

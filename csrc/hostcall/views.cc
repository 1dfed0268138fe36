// Zero-copy NumPy views of XLA's buffers, and what a call kept of them.
//
// Views never dangle silently. Zero-copy views are valid only during the call.
// Afterwards, reference counts tell whether the callable kept a view or a view derived
// from one. After a call that returned, reference cycles are collected first (not after
// one that raised: its traceback keeps them); what is still kept gets a private copy of
// its data where it can (a view handed to the callable) and the call fails with
// jaxbridge.errors.KeptViewError. A callable that kept something once gets copies
// (memory of its own) from then on.
//
// Every zero-copy view has `owner_` as its NumPy base: an empty array that owns its
// (empty) data, where NumPy stops collapsing base chains. A view derived from one of ours
// (slice, reshape, transpose) therefore also refers to `owner_`, not to our view, so
// after the call Py_REFCNT(view) > 1 means "kept directly" and Py_REFCNT(owner_) counts
// the derived views still alive. The views live only in the two tuples handed to the
// callable.
//
// Reuse: building two tuples and a NumPy array per buffer costs about as much as the
// rest of a call at small sizes. After a call that kept nothing, the views go back to
// their callable's registry entry, and the next call with the same shapes and dtypes
// (every call of one compiled program) only points them at the new buffers.
#include <cstring>
#include <thread>

#include "internal.h"

namespace jaxbridge::hostcall {
namespace {

void SetWritable(PyObject* a, bool writable) {
  auto& flags = py::detail::array_proxy(a)->flags;
  if (writable) {
    flags |= py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  } else {
    flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  }
}

py::array View(const py::tuple& views, size_t i) {
  return py::reinterpret_borrow<py::array>(PyTuple_GET_ITEM(views.ptr(), i));
}

void Point(const py::tuple& views, const Slots& slots) {
  for (size_t i = 0; i < slots.size(); ++i) {
    PyObject* view = PyTuple_GET_ITEM(views.ptr(), i);
    py::detail::array_proxy(view)->data = static_cast<char*>(slots[i].data);
    SetWritable(view, slots[i].writable);
  }
}

// Give a kept view a private copy of its data (NumPy code holding it keeps working).
void DetachOne(PyObject* view_ptr) {
  auto view = py::reinterpret_borrow<py::array>(view_ptr);
  auto* fields = py::detail::array_proxy(view.ptr());
  bool writable = fields->flags & py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  py::array copy(view.dtype(), std::vector<py::ssize_t>(view.shape(),
                                                        view.shape() + view.ndim()));
  if (view.nbytes()) std::memcpy(copy.mutable_data(), view.data(), view.nbytes());
  fields->data = static_cast<char*>(copy.mutable_data());
  PyObject* old_base = fields->base;
  fields->base = copy.release().ptr();
  Py_XDECREF(old_base);
  SetWritable(view.ptr(), writable);
}

// A fresh owner per set of views (reused sets keep theirs).
py::object Owner() {
  return py::array(py::reinterpret_borrow<py::dtype>(NumpyDtype(ffi::DataType::U8)),
                   std::vector<py::ssize_t>{0});
}

// JAX may hold a view a little past the call: a jitted function given one takes it
// without copying, and drops the reference only after that computation's last use of
// it, through a queue of references JAX releases later (with the GIL). A view held only
// that way is not kept by the callable: release JAX's queue and look again, for up to
// this long, before calling it kept.
constexpr auto kJaxReleaseWait = std::chrono::milliseconds(20);

CallViews::Kept WaitForJaxReleases(const CallViews& views, CallViews::Kept kept) {
  PyObject* release = TheHooks().release_deferred;
  if (release == nullptr || release == Py_None) return kept;
  auto deadline = Clock::now() + kJaxReleaseWait;
  while (kept.any()) {
    PyObject* r = PyObject_CallNoArgs(release);
    if (r == nullptr) PyErr_Clear();
    Py_XDECREF(r);
    kept = views.Check();
    if (!kept.any() || Clock::now() > deadline) break;
    Py_BEGIN_ALLOW_THREADS
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    Py_END_ALLOW_THREADS
  }
  return kept;
}

}  // namespace

PyObject* NumpyDtype(ffi::DataType type) {  // built once, under the GIL
  static std::array<PyObject*, 64>* table = [] {
    auto* t = new std::array<PyObject*, 64>();
    t->fill(nullptr);
    py::module_ np = py::module_::import("numpy");
    auto set = [&](ffi::DataType dt, py::object dtype) {
      (*t)[static_cast<size_t>(dt)] = np.attr("dtype")(dtype).release().ptr();
    };
    set(ffi::DataType::PRED, py::str("bool"));
    set(ffi::DataType::S8, py::str("int8"));
    set(ffi::DataType::S16, py::str("int16"));
    set(ffi::DataType::S32, py::str("int32"));
    set(ffi::DataType::S64, py::str("int64"));
    set(ffi::DataType::U8, py::str("uint8"));
    set(ffi::DataType::U16, py::str("uint16"));
    set(ffi::DataType::U32, py::str("uint32"));
    set(ffi::DataType::U64, py::str("uint64"));
    set(ffi::DataType::F16, py::str("float16"));
    set(ffi::DataType::F32, py::str("float32"));
    set(ffi::DataType::F64, py::str("float64"));
    set(ffi::DataType::C64, py::str("complex64"));
    set(ffi::DataType::C128, py::str("complex128"));
    try {
      set(ffi::DataType::BF16, py::module_::import("ml_dtypes").attr("bfloat16"));
    } catch (const py::error_already_set&) {
      PyErr_Clear();  // bfloat16 stays unsupported without ml_dtypes
    }
    return t;
  }();
  size_t index = static_cast<size_t>(type);
  return index < table->size() ? (*table)[index] : nullptr;
}

CallViews::CallViews(const Slots& ins, const Slots& outs, bool copy) : copy_(copy) {
  if (!copy_) owner_ = Owner();
  ins_ = Tuple(ins);
  outs_ = Tuple(outs);
}

bool CallViews::Rebind(const Slots& ins, const Slots& outs) {
  if (copy_ || !Fits(ins_, ins) || !Fits(outs_, outs)) return false;
  Point(ins_, ins);
  Point(outs_, outs);
  return true;
}

void CallViews::CopyOutputsBack(const Slots& outs) const {
  if (!copy_) return;
  for (size_t i = 0; i < outs.size(); ++i) {
    if (outs[i].bytes) std::memcpy(outs[i].data, View(outs_, i).data(), outs[i].bytes);
  }
}

CallViews::Kept CallViews::Check() const {
  Kept kept;
  if (copy_) return kept;
  Py_ssize_t based = 0;
  auto scan = [&](const py::tuple& views, std::vector<int>* out) {
    bool tuple_kept = Py_REFCNT(views.ptr()) > 1;  // the callable kept the tuple itself
    for (Py_ssize_t i = 0, n = PyTuple_GET_SIZE(views.ptr()); i < n; ++i) {
      PyObject* view = PyTuple_GET_ITEM(views.ptr(), i);
      if (py::detail::array_proxy(view)->base == owner_.ptr()) ++based;
      if (tuple_kept || Py_REFCNT(view) > 1) out->push_back(static_cast<int>(i));
    }
  };
  scan(ins_, &kept.ins);
  scan(outs_, &kept.outs);
  kept.derived = Py_REFCNT(owner_.ptr()) - 1 - based;  // minus ours
  return kept;
}

void CallViews::Detach(const Kept& kept) {
  for (int i : kept.ins) DetachOne(PyTuple_GET_ITEM(ins_.ptr(), i));
  for (int i : kept.outs) DetachOne(PyTuple_GET_ITEM(outs_.ptr(), i));
}

bool CallViews::Fits(const py::tuple& views, const Slots& slots) const {
  if (static_cast<size_t>(PyTuple_GET_SIZE(views.ptr())) != slots.size()) return false;
  for (size_t i = 0; i < slots.size(); ++i) {
    auto* fields = py::detail::array_proxy(PyTuple_GET_ITEM(views.ptr(), i));
    const Slot& s = slots[i];
    if (fields->base != owner_.ptr() || fields->descr != NumpyDtype(s.type) ||
        fields->nd != static_cast<int>(s.rank) ||
        !(fields->flags & py::detail::npy_api::NPY_ARRAY_C_CONTIGUOUS_)) {
      return false;
    }
    for (size_t d = 0; d < s.rank; ++d) {
      if (fields->dimensions[d] != s.dims[d]) return false;
    }
  }
  return true;
}

py::tuple CallViews::Tuple(const Slots& slots) {
  py::tuple t(slots.size());
  for (size_t i = 0; i < slots.size(); ++i) t[i] = Make(slots[i]);
  // Holds only arrays, which cannot form reference cycles: keep it out of the cyclic
  // collector, which otherwise runs every few hundred host calls.
  PyObject_GC_UnTrack(t.ptr());
  return t;
}

py::array CallViews::Make(const Slot& s) {
  PyObject* dtype = NumpyDtype(s.type);
  if (dtype == nullptr) {
    error_ = "jaxbridge host call: unsupported element type code " +
             std::to_string(static_cast<int>(s.type));
    return py::array();
  }
  auto descr = py::reinterpret_borrow<py::dtype>(dtype);
  py::array a;
  if (copy_) {
    a = py::array(descr, s.shape());
    if (s.bytes) std::memcpy(a.mutable_data(), s.data, s.bytes);
  } else {
    a = py::array(descr, s.shape(), s.data, owner_);
  }
  SetWritable(a.ptr(), s.writable);
  return a;
}

PyObject* ResolveKept(CallViews& views, Entry& entry, PyObject* exc) {
  CallViews::Kept kept = views.Check();
  if (!kept.any()) return exc;
  // A call that raised keeps its views through its traceback's frames, which the
  // exception we hold keeps alive: no collection frees them, and a full one costs
  // ~0.3 s in a process of a few million objects, once per failing call. So collect
  // only after a call that returned.
  if (exc == nullptr) {
    kept = WaitForJaxReleases(views, kept);
    if (!kept.any()) return nullptr;
    PyObject* collected = PyObject_CallNoArgs(TheHooks().gc_collect);
    if (collected == nullptr) PyErr_Clear();
    Py_XDECREF(collected);
    kept = views.Check();
    // It kept views (or made reference cycles holding them): copies from now on.
    entry.copy = true;
    PyObject* r = PyObject_CallMethod(entry.handler, "started_copying", nullptr);
    if (r == nullptr) PyErr_Clear();
    Py_XDECREF(r);
  }
  if (!kept.any()) return exc;
  views.Detach(kept);
  if (exc != nullptr) {
    // The callable raised and its traceback holds views. Detached ones are safe to
    // inspect; derived ones cannot be fixed, so the frames' locals are cleared.
    if (views.Check().derived > 0) {
      PyObject* tb = PyException_GetTraceback(exc);
      if (tb != nullptr) {
        PyObject* r = PyObject_CallOneArg(TheHooks().clear_frames, tb);
        if (r == nullptr) PyErr_Clear();
        Py_XDECREF(r);
        Py_DECREF(tb);
      }
    }
    return exc;
  }
  py::list ins, outs;
  for (int i : kept.ins) ins.append(i);
  for (int i : kept.outs) outs.append(i);
  PyObject* err = PyObject_CallMethod(entry.handler, "kept_view_error", "OOn", ins.ptr(),
                                      outs.ptr(), kept.derived);
  if (err == nullptr) err = FetchRaisedException();  // building it failed: report that
  return err;
}

}  // namespace jaxbridge::hostcall

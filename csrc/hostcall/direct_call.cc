// The direct call: the common host functions -- plain array arguments, one result, no
// keyword arguments -- called without their Python `fill` wrapper (one Python frame, a
// keyword dict and a NumPy assignment less per call; see runners.direct in
// jaxbridge/_foreign/runners.py).
#include "internal.h"

namespace jaxbridge::hostcall {

// The kinds of direct call:
//   kDirectReturns  value = fun(*ins); a C-contiguous ndarray of the output's dtype
//                   and shape is copied into the output here, anything else goes to
//                   finish(value, outs), which checks it and fills the output or raises;
//   kDirectOut      value = fun(*ins, out=outs[0]); None is done, anything else goes to
//                   finish(value, outs), which raises;
//   kDirectAdjoint  a VJP rule: value = fun(ins[:n_in], ins[n_in], ins[n_in + 1]), a
//                   tuple of n_in cotangents of which those at `live` are the outputs;
//                   exact ndarrays are copied here, anything else goes to finish;
//   kDirectAdjointOut  a VJP rule with out=True: fun(ins[:n_in], ins[n_in], ins[n_in + 1],
//                   out=target), target[live[j]] = outs[j] and None elsewhere; None
//                   is done, anything else goes to finish (which raises).

// Whether this call's operands and results fit the direct call of `entry`.
bool CanCallDirect(const Entry& entry, const Slots& ins, const Slots& outs) {
  switch (entry.direct_kind) {
    case kDirectReturns:
    case kDirectOut:
      return outs.size() == 1;
    case kDirectAdjoint:
    case kDirectAdjointOut:
      return static_cast<Py_ssize_t>(ins.size()) == entry.direct_n_in + 2 &&
             outs.size() == entry.direct_live.size();
    default:
      return false;
  }
}

namespace {

// ("out",), built once under the GIL, never freed. Interned, like the parameter names
// of compiled code, so that CPython matches the keyword by identity.
PyObject* OutKeyword() {
  static PyObject* names = [] {
    PyObject* out = PyUnicode_InternFromString("out");
    PyObject* tuple = PyTuple_Pack(1, out);
    Py_DECREF(out);
    return tuple;
  }();
  return names;
}

// Copy `value` into the output view `out` (of `bytes` bytes) if it is exactly what was
// declared.
bool TakeResult(PyObject* value, PyObject* out, size_t bytes) {
  if (Py_TYPE(value) != py::detail::npy_api::get().PyArray_Type_) return false;
  auto* got = py::detail::array_proxy(value);
  auto* want = py::detail::array_proxy(out);
  if (got->descr != want->descr || got->nd != want->nd ||
      !(got->flags & py::detail::npy_api::NPY_ARRAY_C_CONTIGUOUS_)) {
    return false;
  }
  for (int d = 0; d < want->nd; ++d) {
    if (got->dimensions[d] != want->dimensions[d]) return false;
  }
  // memmove: a function that returns its (aliased) input gives the output's own memory.
  if (bytes != 0 && got->data != want->data) std::memmove(want->data, got->data, bytes);
  return true;
}

}  // namespace

PyObject* CallDirect(const Entry& entry, const CallViews& views, const Slots& out_slots) {
  PyObject* fun = entry.direct_fun;
  PyObject* finish = entry.direct_finish;
  int kind = entry.direct_kind;
  PyObject* ins = views.ins().ptr();
  PyObject* outs = views.outs().ptr();
  Py_ssize_t n = PyTuple_GET_SIZE(ins);
  constexpr Py_ssize_t kStack = 8;
  PyObject* stack[kStack + 2];
  std::vector<PyObject*> heap;
  PyObject** args = stack;
  if (n > kStack) {
    heap.resize(static_cast<size_t>(n) + 2);
    args = heap.data();
  }
  args[0] = nullptr;  // PY_VECTORCALL_ARGUMENTS_OFFSET: the callee may use this slot
  PyObject* keywords = nullptr;
  PyObject* primals = nullptr;
  PyObject* target = nullptr;
  Py_ssize_t nargs = n;
  if (kind == kDirectAdjoint || kind == kDirectAdjointOut) {  // (primals, out, cotangent)
    primals = PyTuple_GetSlice(ins, 0, entry.direct_n_in);
    if (primals == nullptr) return nullptr;
    args[1] = primals;
    args[2] = PyTuple_GET_ITEM(ins, entry.direct_n_in);
    args[3] = PyTuple_GET_ITEM(ins, entry.direct_n_in + 1);
    nargs = 3;
    if (kind == kDirectAdjointOut) {  // out=: one entry per input, None where not needed
      target = PyTuple_New(entry.direct_n_in);
      if (target == nullptr) {
        Py_DECREF(primals);
        return nullptr;
      }
      std::vector<PyObject*> items(static_cast<size_t>(entry.direct_n_in), Py_None);
      for (size_t j = 0; j < entry.direct_live.size(); ++j) {
        items[static_cast<size_t>(entry.direct_live[j])] = PyTuple_GET_ITEM(outs, j);
      }
      for (Py_ssize_t i = 0; i < entry.direct_n_in; ++i) {
        Py_INCREF(items[i]);
        PyTuple_SET_ITEM(target, i, items[i]);
      }
      args[4] = target;
      keywords = OutKeyword();
    }
  } else {
    for (Py_ssize_t i = 0; i < n; ++i) args[i + 1] = PyTuple_GET_ITEM(ins, i);
    if (kind == kDirectOut) {
      args[n + 1] = PyTuple_GET_ITEM(outs, 0);
      keywords = OutKeyword();
    }
  }
  Py_INCREF(fun);  // the callable may drop its registration while it runs
  Py_INCREF(finish);
  PyObject* value = PyObject_Vectorcall(
      fun, args + 1, static_cast<size_t>(nargs) | PY_VECTORCALL_ARGUMENTS_OFFSET, keywords);
  Py_XDECREF(primals);  // before the kept-view check, like the value below
  Py_XDECREF(target);
  PyObject* result = value;
  if (value != nullptr) {
    bool done;
    if (kind == kDirectOut || kind == kDirectAdjointOut) {
      done = value == Py_None;
    } else if (kind == kDirectReturns) {
      done = TakeResult(value, PyTuple_GET_ITEM(outs, 0), out_slots[0].bytes);
    } else {
      done = PyTuple_CheckExact(value) && PyTuple_GET_SIZE(value) == entry.direct_n_in;
      for (size_t j = 0; done && j < entry.direct_live.size(); ++j) {
        done = TakeResult(PyTuple_GET_ITEM(value, entry.direct_live[j]),
                          PyTuple_GET_ITEM(outs, j), out_slots[j].bytes);
      }  // a partial copy is harmless: finish writes every output
    }
    if (done) {
      Py_INCREF(Py_None);
      result = Py_None;
    } else {
      PyObject* pair[2] = {value, outs};
      result = PyObject_Vectorcall(finish, pair, 2, nullptr);
    }
    Py_DECREF(value);  // before the kept-view check: a returned view is not kept
  }
  Py_DECREF(finish);
  Py_DECREF(fun);
  return result;
}

}  // namespace jaxbridge::hostcall

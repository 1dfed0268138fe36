// AddressSanitizer/UBSan driver for the guarded call (csrc/builtin/guard.cc) and the
// handlers of a kernel with residuals (examples/rms_norm.cc), without XLA: call frames
// are built here as XLA builds them (attributes sorted by name), over exact-size heap
// buffers, and a stand-in of the FFI API creates the errors. Built and run by
// benchmarks/asan_kernels.sh with guard.cc, rms_norm.cc and tests/native/kernel_checks.cc.
// Checks: guarded RMS norm (forward, forward with residuals, the aliased vjp) equals
// the unguarded handlers; writes past the end and before the start (forward, vjp,
// jvp) are reported, and a handler relying on aliasing sees its operand; a bad layout,
// a missing target and an unknown handler are errors, never an out-of-bounds access.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "guard.h"

struct XLA_FFI_Error {
  std::string message;
};

extern "C" {
XLA_FFI_Error* JaxbridgeGuardedCpu(XLA_FFI_CallFrame* frame);
XLA_FFI_Error* RmsNorm(XLA_FFI_CallFrame* frame);
XLA_FFI_Error* RmsNormWithResiduals(XLA_FFI_CallFrame* frame);
XLA_FFI_Error* RmsNormDerivative(XLA_FFI_CallFrame* frame);
XLA_FFI_Error* ScaleFwd(XLA_FFI_CallFrame* frame);
XLA_FFI_Error* ScaleAdj(XLA_FFI_CallFrame* frame);
XLA_FFI_Error* ScaleTan(XLA_FFI_CallFrame* frame);
XLA_FFI_Error* DoubleInPlace(XLA_FFI_CallFrame* frame);
}

namespace g = jaxbridge::builtin::guard;

namespace {

// ---------------------------------------------------------------- the FFI API stand-in
XLA_FFI_Error* ErrorCreate(XLA_FFI_Error_Create_Args* args) {
  return new XLA_FFI_Error{args->message};
}
void ErrorGetMessage(XLA_FFI_Error_GetMessage_Args* args) {
  args->message = args->error->message.c_str();
}
void ErrorDestroy(XLA_FFI_Error_Destroy_Args* args) { delete args->error; }

XLA_FFI_Api MakeApi() {
  XLA_FFI_Api api;
  std::memset(&api, 0, sizeof(api));
  api.struct_size = XLA_FFI_Api_STRUCT_SIZE;
  api.api_version = {XLA_FFI_Api_Version_STRUCT_SIZE, nullptr, XLA_FFI_API_MAJOR,
                     XLA_FFI_API_MINOR};
  api.XLA_FFI_Error_Create = ErrorCreate;
  api.XLA_FFI_Error_GetMessage = ErrorGetMessage;
  api.XLA_FFI_Error_Destroy = ErrorDestroy;
  return api;
}
const XLA_FFI_Api kApi = MakeApi();

int failures = 0;
void Expect(bool ok, const std::string& what) {
  if (!ok) {
    ++failures;
    std::printf("FAIL %s\n", what.c_str());
  }
}

// ---------------------------------------------------------------- building call frames
// Everything a frame points to, owned (each buffer an exact-size heap allocation).
struct Frame {
  std::vector<std::unique_ptr<unsigned char[]>> memory;
  std::vector<std::vector<int64_t>> dims;
  std::vector<std::unique_ptr<XLA_FFI_Buffer>> buffers;
  std::vector<XLA_FFI_ArgType> arg_types;
  std::vector<XLA_FFI_RetType> ret_types;
  std::vector<void*> args, rets;
  std::vector<XLA_FFI_AttrType> attr_types;
  std::vector<std::unique_ptr<XLA_FFI_ByteSpan>> spans;
  std::vector<XLA_FFI_ByteSpan*> names;
  std::vector<void*> attrs;
  std::vector<std::string> strings;  // reserved: spans point into them
  std::vector<std::unique_ptr<XLA_FFI_Scalar>> scalars;
  std::vector<std::unique_ptr<XLA_FFI_Array>> arrays;
  std::vector<std::vector<int64_t>> numbers;
  XLA_FFI_CallFrame frame;

  Frame() { strings.reserve(64); }

  XLA_FFI_Buffer* Buffer(XLA_FFI_DataType dtype, std::vector<int64_t> shape, size_t width) {
    size_t n = 1;
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    memory.emplace_back(new unsigned char[n * width > 0 ? n * width : 1]());
    dims.push_back(std::move(shape));
    buffers.emplace_back(new XLA_FFI_Buffer{XLA_FFI_Buffer_STRUCT_SIZE, nullptr, dtype,
                                            memory.back().get(),
                                            static_cast<int64_t>(dims.back().size()),
                                            dims.back().data()});
    return buffers.back().get();
  }
  double* Arg(std::vector<int64_t> shape, double fill) {
    XLA_FFI_Buffer* b = Buffer(XLA_FFI_DataType_F64, std::move(shape), 8);
    arg_types.push_back(XLA_FFI_ArgType_BUFFER);
    args.push_back(b);
    double* p = static_cast<double*>(b->data);
    for (int64_t i = 0; i < Elements(b); ++i) p[i] = fill + 0.25 * static_cast<double>(i % 7);
    return p;
  }
  double* Ret(std::vector<int64_t> shape) {
    XLA_FFI_Buffer* b = Buffer(XLA_FFI_DataType_F64, std::move(shape), 8);
    ret_types.push_back(XLA_FFI_RetType_BUFFER);
    rets.push_back(b);
    return static_cast<double*>(b->data);
  }
  static int64_t Elements(const XLA_FFI_Buffer* b) {
    int64_t n = 1;
    for (int64_t d = 0; d < b->rank; ++d) n *= b->dims[d];
    return n;
  }
  XLA_FFI_ByteSpan* Span(const std::string& text) {
    strings.push_back(text);
    spans.emplace_back(new XLA_FFI_ByteSpan{strings.back().data(), strings.back().size()});
    return spans.back().get();
  }
  // Attributes must be added in name order (XLA sorts them).
  void Name(const std::string& name, XLA_FFI_AttrType type, void* value) {
    names.push_back(Span(name));
    attr_types.push_back(type);
    attrs.push_back(value);
  }
  void String(const std::string& name, const std::string& value) {
    Name(name, XLA_FFI_AttrType_STRING, Span(value));
  }
  void Int(const std::string& name, int64_t value) {
    numbers.push_back({value});
    scalars.emplace_back(new XLA_FFI_Scalar{XLA_FFI_DataType_S64, numbers.back().data()});
    Name(name, XLA_FFI_AttrType_SCALAR, scalars.back().get());
  }
  void Float(const std::string& name, float value) {
    numbers.push_back({0});
    std::memcpy(numbers.back().data(), &value, sizeof(value));
    scalars.emplace_back(new XLA_FFI_Scalar{XLA_FFI_DataType_F32, numbers.back().data()});
    Name(name, XLA_FFI_AttrType_SCALAR, scalars.back().get());
  }
  void Layout(std::vector<int64_t> layout) {
    numbers.push_back(std::move(layout));
    arrays.emplace_back(new XLA_FFI_Array{XLA_FFI_DataType_S64, numbers.back().size(),
                                          numbers.back().data()});
    Name("jaxbridge_guard_layout", XLA_FFI_AttrType_ARRAY, arrays.back().get());
  }
  XLA_FFI_CallFrame* Get() {
    std::memset(&frame, 0, sizeof(frame));
    frame.struct_size = XLA_FFI_CallFrame_STRUCT_SIZE;
    frame.api = &kApi;
    frame.stage = XLA_FFI_ExecutionStage_EXECUTE;
    frame.args = {XLA_FFI_Args_STRUCT_SIZE, nullptr, static_cast<int64_t>(args.size()),
                  arg_types.data(), args.data()};
    frame.rets = {XLA_FFI_Rets_STRUCT_SIZE, nullptr, static_cast<int64_t>(rets.size()),
                  ret_types.data(), rets.data()};
    frame.attrs = {XLA_FFI_Attrs_STRUCT_SIZE, nullptr, static_cast<int64_t>(attrs.size()),
                   attr_types.data(), names.data(), attrs.data()};
    return &frame;
  }
};

constexpr int64_t kFront = 256;  // bytes, as jaxbridge/_kernel/guard.py
constexpr int64_t kFrontElems = kFront / 8;

// A guarded call's jaxbridge_guard_* attributes for float64 outputs of `shapes`, each
// with `back` guard bytes, added in name order among the kernel's own (`before` adds
// those sorting before "jaxbridge_", `after` those after).
template <typename Before, typename After>
void Guard(Frame& f, const std::string& target, const std::vector<std::vector<int64_t>>& shapes,
           int64_t back, std::vector<int64_t> aliases, Before before, After after) {
  before(f);
  f.String("jaxbridge_guard_context", "kernel 'test', target '" + target + "'");
  std::vector<int64_t> layout = {static_cast<int64_t>(shapes.size()), kFront};
  std::string names;
  for (const auto& shape : shapes) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    layout.insert(layout.end(), {n * 8, back, static_cast<int64_t>(shape.size())});
    layout.insert(layout.end(), shape.begin(), shape.end());
    names += (names.empty() ? "out" : "\nout") + std::to_string(layout.size());
  }
  layout.push_back(static_cast<int64_t>(aliases.size() / 2));
  layout.insert(layout.end(), aliases.begin(), aliases.end());
  f.Layout(layout);
  f.String("jaxbridge_guard_outputs", names);
  f.String("jaxbridge_guard_target", target);
  after(f);
}

std::string Run(XLA_FFI_CallFrame* frame, XLA_FFI_Error* (*handler)(XLA_FFI_CallFrame*)) {
  XLA_FFI_Error* error = handler(frame);
  if (error == nullptr) return "";
  std::string message = error->message;
  delete error;
  return message;
}

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// ---------------------------------------------------------------- RMS norm, guarded or not
// Runs `handler` on operands of `shapes` (filled alike) and results of `results`, first
// unguarded, then through the guarded call (aliases: operand, result pairs), and
// compares every result.
void SameGuarded(const char* what, XLA_FFI_Error* (*handler)(XLA_FFI_CallFrame*),
                 const char* target, const std::vector<std::vector<int64_t>>& shapes,
                 const std::vector<std::vector<int64_t>>& results, std::vector<int64_t> aliases) {
  const int64_t back = 256;
  auto eps = [](Frame& f) { f.Float("eps", 1e-5f); };
  Frame plain, guarded;
  for (size_t i = 0; i < shapes.size(); ++i) {
    plain.Arg(shapes[i], -0.5 + static_cast<double>(i));
    guarded.Arg(shapes[i], -0.5 + static_cast<double>(i));
  }
  for (size_t a = 0; a + 1 < aliases.size(); a += 2) {  // XLA's aliasing, unguarded
    plain.rets.push_back(plain.args[aliases[a]]);
    plain.ret_types.push_back(XLA_FFI_RetType_BUFFER);
  }
  std::vector<double*> want, got;
  std::vector<int64_t> sizes;
  for (const auto& shape : results) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    sizes.push_back(n);
    if (aliases.empty()) want.push_back(plain.Ret(shape));
    got.push_back(guarded.Ret({kFrontElems + n + back / 8}));
  }
  if (!aliases.empty()) want.push_back(static_cast<double*>(
      static_cast<XLA_FFI_Buffer*>(plain.args[aliases[0]])->data));
  eps(plain);
  Guard(guarded, target, results, back, aliases, eps, [](Frame&) {});
  std::string message = Run(plain.Get(), handler);
  Expect(message.empty(), std::string(what) + " unguarded: " + message);
  message = Run(guarded.Get(), JaxbridgeGuardedCpu);
  Expect(message.empty(), std::string(what) + " guarded: " + message);
  for (size_t r = 0; r < results.size(); ++r) {
    for (int64_t i = 0; i < sizes[r]; ++i) {
      Expect(got[r][kFrontElems + i] == want[r][i], std::string(what) + ": a value differs");
    }
  }
}

void RmsNormGuardedEqualsPlain() {
  const int64_t rows = 3, n = 5;
  SameGuarded("rms_norm", RmsNorm, "rms_forward", {{rows, n}}, {{rows, n}}, {});
  SameGuarded("rms_norm with residuals", RmsNormWithResiduals, "rms_with_residuals",
              {{rows, n}}, {{rows, n}, {rows}}, {});
  // the adjoint (x, r, ct) -> ct_x, aliased to ct (operand 2) as the guide declares it
  SameGuarded("rms_norm adjoint", RmsNormDerivative, "rms_derivative",
              {{rows, n}, {rows}, {rows, n}}, {{rows, n}}, {2, 0});
}

// ---------------------------------------------------------------- bad handlers, reported
void ScaleWritesOutside(const char* role, XLA_FFI_Error* (*handler)(XLA_FFI_CallFrame*),
                        int64_t extra, int64_t before) {
  const int64_t n = 10, back = 256;
  Frame f;
  f.Arg({n}, 1.0);
  if (std::strcmp(role, "forward") != 0) {
    f.Arg({n}, 2.0);
    f.Arg({n}, 3.0);
  }
  f.Ret({kFrontElems + n + back / 8});
  Guard(f, std::string("scale_") + role, {{n}}, back, {},
        [&](Frame& f) {
          f.Int("before", before);
          f.Int("extra", extra);
        },
        [&](Frame& f) { f.String("role", role); });
  const std::string message = Run(f.Get(), JaxbridgeGuardedCpu);
  if (extra == 0 && before == 0) {
    Expect(message.empty(), std::string(role) + " in bounds: " + message);
    return;
  }
  const std::string how = extra ? "up to " + std::to_string(8 * extra) + " bytes past its end"
                                : "up to " + std::to_string(8 * before) + " bytes before its start";
  Expect(Contains(message, "wrote outside output 'out") && Contains(message, how) &&
             Contains(message, std::string("target 'scale_") + role + "'"),
         std::string(role) + ": " + message);
}

void AliasedOperandIsCopied() {
  const int64_t n = 6, back = 256;
  Frame f;
  f.Arg({n}, 1.0);
  double* ct = f.Arg({n}, 2.0);
  double* gx = f.Ret({kFrontElems + n + back / 8});
  Guard(f, "double_in_place", {{n}}, back, {1, 0},
        [](Frame& f) {
          f.Int("before", 0);
          f.Int("extra", 0);
        },
        [](Frame& f) { f.String("role", ""); });
  const std::string message = Run(f.Get(), JaxbridgeGuardedCpu);
  Expect(message.empty(), "aliased: " + message);
  for (int64_t i = 0; i < n; ++i) Expect(gx[kFrontElems + i] == 2 * ct[i], "aliased value");
}

// ---------------------------------------------------------------- refused, in bounds
// A guarded call of one float64[4] operand and a result buffer of `elements`, refused
// with a message containing `expected`.
void Refused(const char* what, int64_t elements, const char* target,
             std::vector<int64_t> aliases, const char* expected) {
  Frame f;
  f.Arg({4}, 1.0);
  f.Ret({elements});
  auto none = [](Frame&) {};
  Guard(f, target, {{4}}, 256, std::move(aliases), none, none);
  Expect(Contains(Run(f.Get(), JaxbridgeGuardedCpu), expected), what);
}

void BadCallsAreErrors() {
  const int64_t right = kFrontElems + 4 + 32;
  Refused("layout mismatch", 8, "scale_forward", {}, "does not match its layout");
  Refused("bad alias", right, "scale_forward", {5, 0}, "does not match its operand");
  Refused("unknown target", right, "not_registered", {}, "registered through jaxbridge");
  Frame f;  // a truncated layout attribute
  f.Arg({4}, 1.0);
  f.Ret({right});
  f.String("jaxbridge_guard_context", "kernel 'test'");
  f.Layout({1, kFront, 32, 256});
  f.String("jaxbridge_guard_target", "scale_forward");
  Expect(Contains(Run(f.Get(), JaxbridgeGuardedCpu), "jaxbridge_guard_layout"),
         "truncated layout");
}

}  // namespace

int main() {
  g::Register(g::Platform::kCpu, "rms_with_residuals", RmsNormWithResiduals);
  g::Register(g::Platform::kCpu, "rms_forward", RmsNorm);
  g::Register(g::Platform::kCpu, "rms_derivative", RmsNormDerivative);
  g::Register(g::Platform::kCpu, "scale_forward", ScaleFwd);
  g::Register(g::Platform::kCpu, "scale_vjp", ScaleAdj);
  g::Register(g::Platform::kCpu, "scale_jvp", ScaleTan);
  g::Register(g::Platform::kCpu, "double_in_place", DoubleInPlace);
  RmsNormGuardedEqualsPlain();
  const struct {
    const char* role;
    XLA_FFI_Error* (*handler)(XLA_FFI_CallFrame*);
  } roles[] = {{"forward", ScaleFwd}, {"vjp", ScaleAdj}, {"jvp", ScaleTan}};
  for (const auto& r : roles) {
    ScaleWritesOutside(r.role, r.handler, 0, 0);
    ScaleWritesOutside(r.role, r.handler, 3, 0);
    ScaleWritesOutside(r.role, r.handler, 32, 0);  // the whole back guard
    ScaleWritesOutside(r.role, r.handler, 0, 2);
  }
  AliasedOperandIsCopied();
  BadCallsAreErrors();
  std::printf("guarded call: %s (%d failures)\n", failures ? "FAILED" : "OK", failures);
  return failures ? 1 : 0;
}

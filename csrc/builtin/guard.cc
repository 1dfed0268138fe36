// Guarded outputs (guard.h): the handler table, the guarded call, and its CPU handler.
#include "guard.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace jaxbridge::builtin::guard {
namespace {

// ---------------------------------------------------------------- the handler table
std::mutex table_mutex;
std::map<std::pair<int, std::string>, XLA_FFI_Handler*, std::less<>>& Table() {
  static auto* table = new std::map<std::pair<int, std::string>, XLA_FFI_Handler*,
                                    std::less<>>();  // never destroyed: used at exit
  return *table;
}

// ---------------------------------------------------------------- the layout
struct Output {
  std::string_view name;
  int64_t bytes = 0;  // the output's own size
  int64_t back = 0;   // guard bytes after it
  std::vector<int64_t> dims;
};

struct Layout {
  std::string_view target, context;
  int64_t front = 0;  // guard bytes before each output
  std::vector<Output> outputs;
  std::vector<std::pair<int64_t, int64_t>> aliases;  // (operand, output)
};

std::string_view Name(const XLA_FFI_Attrs& attrs, int64_t i) {
  return std::string_view(attrs.names[i]->ptr, attrs.names[i]->len);
}

// Reads jaxbridge_guard_layout into `layout`; "" or what is wrong with it.
std::string ReadNumbers(const XLA_FFI_Array* array, Layout* layout) {
  if (array->dtype != XLA_FFI_DataType_S64) return "jaxbridge_guard_layout is not int64";
  const auto* v = static_cast<const int64_t*>(array->data);
  const size_t size = array->size;
  size_t at = 0;
  auto next = [&](int64_t* out) {
    if (at >= size) return false;
    *out = v[at++];
    return true;
  };
  int64_t n_out = 0, n_alias = 0;
  if (!next(&n_out) || !next(&layout->front) || n_out < 0 || layout->front < 0) {
    return "jaxbridge_guard_layout: bad header";
  }
  for (int64_t i = 0; i < n_out; ++i) {
    Output o;
    int64_t rank = 0;
    if (!next(&o.bytes) || !next(&o.back) || !next(&rank) || rank < 0 || o.bytes < 0 ||
        o.back < 0) {
      return "jaxbridge_guard_layout: bad output entry";
    }
    o.dims.resize(static_cast<size_t>(rank));
    for (auto& d : o.dims) {
      if (!next(&d) || d < 0) return "jaxbridge_guard_layout: bad dimension";
    }
    layout->outputs.push_back(std::move(o));
  }
  if (!next(&n_alias) || n_alias < 0) return "jaxbridge_guard_layout: bad alias count";
  for (int64_t i = 0; i < n_alias; ++i) {
    std::pair<int64_t, int64_t> a;
    if (!next(&a.first) || !next(&a.second)) return "jaxbridge_guard_layout: bad alias";
    layout->aliases.push_back(a);
  }
  return at == size ? "" : "jaxbridge_guard_layout: trailing numbers";
}

// Reads the jaxbridge_guard_* attributes; the others go to `kept` (in their order,
// which is XLA's sorted order, the one the handler's binding decodes).
std::string ReadLayout(const XLA_FFI_Attrs& attrs, Layout* layout, std::vector<int64_t>* kept) {
  std::string_view names;
  bool have_numbers = false;
  for (int64_t i = 0; i < attrs.size; ++i) {
    const std::string_view name = Name(attrs, i);
    if (name.substr(0, kAttrPrefix.size()) != kAttrPrefix) {
      kept->push_back(i);
      continue;
    }
    const auto type = attrs.types[i];
    if (type == XLA_FFI_AttrType_STRING) {
      const auto* s = static_cast<const XLA_FFI_ByteSpan*>(attrs.attrs[i]);
      const std::string_view text(s->ptr, s->len);
      if (name == "jaxbridge_guard_target") layout->target = text;
      if (name == "jaxbridge_guard_context") layout->context = text;
      if (name == "jaxbridge_guard_outputs") names = text;
    } else if (type == XLA_FFI_AttrType_ARRAY && name == "jaxbridge_guard_layout") {
      std::string bad = ReadNumbers(static_cast<const XLA_FFI_Array*>(attrs.attrs[i]), layout);
      if (!bad.empty()) return bad;
      have_numbers = true;
    }
  }
  if (layout->target.empty() || !have_numbers) return "missing jaxbridge_guard_* attributes";
  for (auto& o : layout->outputs) {  // one name per line
    const size_t end = names.find('\n');
    o.name = names.substr(0, end);
    names = end == std::string_view::npos ? std::string_view() : names.substr(end + 1);
  }
  return "";
}

// ---------------------------------------------------------------- buffers
int64_t ByteWidth(XLA_FFI_DataType t) {
  switch (t) {
    case XLA_FFI_DataType_PRED: case XLA_FFI_DataType_S8: case XLA_FFI_DataType_U8:
    case XLA_FFI_DataType_F8E5M2: case XLA_FFI_DataType_F8E3M4: case XLA_FFI_DataType_F8E4M3:
    case XLA_FFI_DataType_F8E4M3FN: case XLA_FFI_DataType_F8E4M3B11FNUZ:
    case XLA_FFI_DataType_F8E5M2FNUZ: case XLA_FFI_DataType_F8E4M3FNUZ:
    case XLA_FFI_DataType_F8E8M0FNU:
      return 1;
    case XLA_FFI_DataType_S16: case XLA_FFI_DataType_U16: case XLA_FFI_DataType_F16:
    case XLA_FFI_DataType_BF16:
      return 2;
    case XLA_FFI_DataType_S32: case XLA_FFI_DataType_U32: case XLA_FFI_DataType_F32:
      return 4;
    case XLA_FFI_DataType_S64: case XLA_FFI_DataType_U64: case XLA_FFI_DataType_F64:
    case XLA_FFI_DataType_C64:
      return 8;
    case XLA_FFI_DataType_C128:
      return 16;
    default:
      return 0;  // sub-byte types and tokens: not guarded
  }
}

int64_t BufferBytes(const XLA_FFI_Buffer* b) {
  int64_t n = ByteWidth(b->dtype);
  for (int64_t d = 0; d < b->rank; ++d) n *= b->dims[d];
  return n;
}

int64_t Elements(const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

// The larger buffers XLA allocated, checked against the layout.
std::string CheckResults(const XLA_FFI_CallFrame* frame, const Layout& layout) {
  if (frame->rets.size != static_cast<int64_t>(layout.outputs.size())) {
    return "the guarded call has " + std::to_string(frame->rets.size) + " results, its layout " +
           std::to_string(layout.outputs.size());
  }
  for (size_t i = 0; i < layout.outputs.size(); ++i) {
    const Output& o = layout.outputs[i];
    if (frame->rets.types[i] != XLA_FFI_RetType_BUFFER) return "a result is not a buffer";
    const auto* big = static_cast<const XLA_FFI_Buffer*>(frame->rets.rets[i]);
    const int64_t width = ByteWidth(big->dtype);
    if (width == 0 || big->rank != 1 || Elements(o.dims) * width != o.bytes ||
        BufferBytes(big) != layout.front + o.bytes + o.back || layout.front % width != 0) {
      return "result " + std::to_string(i) + " does not match its layout";
    }
  }
  for (const auto& [operand, output] : layout.aliases) {
    if (operand < 0 || operand >= frame->args.size || output < 0 ||
        output >= static_cast<int64_t>(layout.outputs.size()) ||
        frame->args.types[operand] != XLA_FFI_ArgType_BUFFER ||
        BufferBytes(static_cast<const XLA_FFI_Buffer*>(frame->args.args[operand])) !=
            layout.outputs[output].bytes) {
      return "alias " + std::to_string(operand) + " -> " + std::to_string(output) +
             " does not match its operand";
    }
  }
  return "";
}

unsigned char* Base(const XLA_FFI_CallFrame* frame, size_t i) {
  return static_cast<unsigned char*>(static_cast<XLA_FFI_Buffer*>(frame->rets.rets[i])->data);
}

// Before the handler: canaries in every guard, aliased operands in their outputs.
std::string Prepare(const XLA_FFI_CallFrame* frame, const Layout& layout, Memory& memory) {
  for (size_t i = 0; i < layout.outputs.size(); ++i) {
    unsigned char* base = Base(frame, i);
    const Output& o = layout.outputs[i];
    std::string bad = memory.Fill(base, static_cast<size_t>(layout.front));
    if (bad.empty()) bad = memory.Fill(base + layout.front + o.bytes, static_cast<size_t>(o.back));
    if (!bad.empty()) return bad;
  }
  for (const auto& [operand, output] : layout.aliases) {
    const auto* src = static_cast<const XLA_FFI_Buffer*>(frame->args.args[operand]);
    std::string bad = memory.Copy(Base(frame, output) + layout.front, src->data,
                                  static_cast<size_t>(layout.outputs[output].bytes));
    if (!bad.empty()) return bad;
  }
  return "";
}

// ---------------------------------------------------------------- after the call
std::string Shape(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t d = 0; d < dims.size(); ++d) s += (d ? ", " : "") + std::to_string(dims[d]);
  return s + "]";
}

// How far outside output `o` the handler wrote ("" when it did not).
std::string Overrun(const Output& o, const unsigned char* front, int64_t front_bytes,
                    const unsigned char* back) {
  int64_t before = 0, after = 0;
  for (int64_t b = 0; b < front_bytes; ++b) {
    if (front[b] != kCanary) {
      before = front_bytes - b;
      break;
    }
  }
  for (int64_t b = o.back - 1; b >= 0; --b) {
    if (back[b] != kCanary) {
      after = b + 1;
      break;
    }
  }
  if (before == 0 && after == 0) return "";
  std::string where;
  if (after) where = "up to " + std::to_string(after) + " bytes past its end";
  if (before) where += (after ? " and " : "") + std::string("up to ") +
                       std::to_string(before) + " bytes before its start";
  return "wrote outside output '" + std::string(o.name) + "' (shape " + Shape(o.dims) + ", " +
         std::to_string(o.bytes) + " bytes): " + where;
}

// Reads the guards back; "" when none changed, else the message.
std::string Verify(const XLA_FFI_CallFrame* frame, const Layout& layout, Memory& memory,
                   std::string* failure) {
  std::vector<std::vector<unsigned char>> guards;
  for (size_t i = 0; i < layout.outputs.size(); ++i) {
    const Output& o = layout.outputs[i];
    guards.emplace_back(static_cast<size_t>(layout.front + o.back));
    unsigned char* host = guards.back().data();
    const unsigned char* base = Base(frame, i);
    std::string bad = memory.Fetch(host, base, static_cast<size_t>(layout.front));
    if (bad.empty()) {
      bad = memory.Fetch(host + layout.front, base + layout.front + o.bytes,
                         static_cast<size_t>(o.back));
    }
    if (!bad.empty()) return bad;
  }
  std::string bad = memory.Wait();
  if (!bad.empty()) return bad;
  for (size_t i = 0; i < layout.outputs.size(); ++i) {
    const unsigned char* g = guards[i].data();
    std::string over = Overrun(layout.outputs[i], g, layout.front, g + layout.front);
    if (!over.empty()) *failure += (failure->empty() ? "" : "; ") + over;
  }
  return "";
}

// The FFI C API renamed its error-message getter in API version 0.5 (jaxlib 0.12):
// XLA_FFI_Error_GetMessage became XLA_FFI_Error_GetDetails. Which one the headers
// have is found at compile time, so one source builds against both.
template <typename Api, typename = void>
struct HasGetMessage : std::false_type {};
template <typename Api>
struct HasGetMessage<Api, std::void_t<decltype(&Api::XLA_FFI_Error_GetMessage)>>
    : std::true_type {};

template <typename F>
struct ArgsOf;
template <typename R, typename A>
struct ArgsOf<R (*)(A*)> {
  using type = A;
};

template <typename Api>
std::string ReadMessage(const Api* api, XLA_FFI_Error* error) {
  auto read = [&](auto getter) -> std::string {
    using Args = typename ArgsOf<decltype(getter)>::type;
    Args get{};
    get.struct_size = sizeof(Args);  // at least the size the API checks for
    get.error = error;
    getter(&get);
    return get.message ? get.message : "";
  };
  if constexpr (HasGetMessage<Api>::value) {
    return read(api->XLA_FFI_Error_GetMessage);
  } else {
    return read(api->XLA_FFI_Error_GetDetails);
  }
}

std::string TakeMessage(const XLA_FFI_Api* api, XLA_FFI_Error* error) {
  std::string message = ReadMessage(api, error);
  XLA_FFI_Error_Destroy_Args destroy{XLA_FFI_Error_Destroy_Args_STRUCT_SIZE, nullptr, error};
  api->XLA_FFI_Error_Destroy(&destroy);
  return message;
}

}  // namespace

void Register(Platform platform, std::string target, XLA_FFI_Handler* handler) {
  std::lock_guard<std::mutex> lock(table_mutex);
  Table()[{static_cast<int>(platform), std::move(target)}] = handler;
}

XLA_FFI_Handler* Find(Platform platform, std::string_view target) {
  std::lock_guard<std::mutex> lock(table_mutex);
  auto it = Table().find(std::make_pair(static_cast<int>(platform), std::string(target)));
  return it == Table().end() ? nullptr : it->second;
}

XLA_FFI_Error* MakeError(const XLA_FFI_Api* api, const std::string& message,
                         bool invalid_argument) {
  XLA_FFI_Error_Create_Args args{
      XLA_FFI_Error_Create_Args_STRUCT_SIZE, nullptr, message.c_str(),
      invalid_argument ? XLA_FFI_Error_Code_INVALID_ARGUMENT : XLA_FFI_Error_Code_INTERNAL};
  return api->XLA_FFI_Error_Create(&args);
}

bool AnswerMetadataQuery(XLA_FFI_CallFrame* frame) {
  auto* ext = frame->extension_start;  // XLA_FFI_InternalExtension from API version 0.5
  if (ext == nullptr || ext->type != XLA_FFI_Extension_Metadata) return false;
  XLA_FFI_Metadata* metadata = reinterpret_cast<XLA_FFI_Metadata_Extension*>(ext)->metadata;
  metadata->api_version = XLA_FFI_Api_Version{XLA_FFI_Api_Version_STRUCT_SIZE, nullptr,
                                              XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR};
  metadata->traits = 0;  // not command-buffer compatible: it waits for the handler
  return true;
}

XLA_FFI_Error* Call(XLA_FFI_CallFrame* frame, Platform platform, Memory& memory) {
  const XLA_FFI_Api* api = frame->api;
  Layout layout;
  std::vector<int64_t> kept;
  std::string bad = ReadLayout(frame->attrs, &layout, &kept);
  if (bad.empty()) bad = CheckResults(frame, layout);
  if (!bad.empty()) return MakeError(api, "jaxbridge guarded call: " + bad, true);
  XLA_FFI_Handler* handler = Find(platform, layout.target);
  if (handler == nullptr) {
    return MakeError(api, std::string(layout.context) + ": guard_outputs=True needs the "
                     "target registered through jaxbridge in this process, and it is not", true);
  }
  bad = Prepare(frame, layout, memory);
  if (!bad.empty()) return MakeError(api, std::string(layout.context) + ": " + bad);

  // The handler's frame: the outputs at their place, the kernel's own attributes.
  std::vector<XLA_FFI_Buffer> outputs(layout.outputs.size());
  std::vector<void*> rets(layout.outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    const auto* big = static_cast<const XLA_FFI_Buffer*>(frame->rets.rets[i]);
    Output& o = layout.outputs[i];
    outputs[i] = XLA_FFI_Buffer{XLA_FFI_Buffer_STRUCT_SIZE, nullptr, big->dtype,
                                Base(frame, i) + layout.front,
                                static_cast<int64_t>(o.dims.size()), o.dims.data()};
    rets[i] = &outputs[i];
  }
  std::vector<XLA_FFI_AttrType> types;
  std::vector<XLA_FFI_ByteSpan*> names;
  std::vector<void*> values;
  for (int64_t i : kept) {
    types.push_back(frame->attrs.types[i]);
    names.push_back(frame->attrs.names[i]);
    values.push_back(frame->attrs.attrs[i]);
  }
  XLA_FFI_CallFrame inner = *frame;
  // What we copied: a handler built against newer headers than this file must not
  // read past it (it refuses a frame smaller than it expects).
  inner.struct_size = std::min(frame->struct_size, sizeof(XLA_FFI_CallFrame));
  inner.rets.rets = rets.data();
  inner.attrs.size = static_cast<int64_t>(kept.size());
  inner.attrs.types = types.data();
  inner.attrs.names = names.data();
  inner.attrs.attrs = values.data();
  inner.future = nullptr;
  XLA_FFI_Error* error = handler(&inner);
  if (inner.future != nullptr) {  // asynchronous: its writes are not done yet, so the
    frame->future = inner.future;  // guards cannot be read; XLA waits for the future
    return error;
  }
  std::string failure;
  bad = Verify(frame, layout, memory, &failure);
  if (failure.empty() && bad.empty()) return error;
  std::string message = std::string(layout.context) + ": " + (bad.empty() ? failure : bad);
  if (!failure.empty()) {
    message += ". The handler writes more than the declared result: compare the kernel's "
               "result= (and residuals=) with what the handler writes (guard_outputs=True "
               "watches " + std::to_string(layout.front) + " bytes before each output and at "
               "least as many after it as the largest operand or output has)";
  }
  if (error != nullptr) message += "; the handler also returned: " + TakeMessage(api, error);
  return MakeError(api, message);
}

namespace {
class CpuMemory final : public Memory {
 public:
  std::string Fill(void* device, size_t bytes) override {
    std::memset(device, kCanary, bytes);
    return "";
  }
  std::string Copy(void* dst, const void* src, size_t bytes) override {
    if (dst != src) std::memmove(dst, src, bytes);
    return "";
  }
  std::string Fetch(unsigned char* host, const void* device, size_t bytes) override {
    std::memcpy(host, device, bytes);
    return "";
  }
  std::string Wait() override { return ""; }
};
}  // namespace

}  // namespace jaxbridge::builtin::guard

extern "C" XLA_FFI_Error* JaxbridgeGuardedCpu(XLA_FFI_CallFrame* frame) {
  namespace g = ::jaxbridge::builtin::guard;
  if (g::AnswerMetadataQuery(frame)) return nullptr;
  g::CpuMemory memory;
  return g::Call(frame, g::Platform::kCpu, memory);
}

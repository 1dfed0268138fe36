// Guarded outputs: the checked call of a kernel's FFI handler (jaxbridge.kernel(...,
// guard_outputs=True), on in jaxbridge.testing.check_rules).
//
// The program calls the target "jaxbridge_guarded" instead of the kernel's own. Each
// of its results is a flat buffer of the output's dtype, larger than the output:
//
//     [ front guard | the output (its declared size) | back guard ]
//
// The guarded call fills both guards with kCanary, copies each aliased operand into
// its output (what XLA's aliasing would have left there), calls the kernel's handler
// with a call frame whose results are the outputs alone (their declared shapes, at
// their place inside the larger buffers) and whose attributes are the kernel's own,
// then reads the guards back. A changed guard byte is an error naming the kernel, the
// target and the output, with how far outside the output the write reached; the
// program slices the outputs out of the larger buffers. A write further out than the
// guards goes unseen (the Python side sizes the back guard to at least the output and
// every operand, the usual size of a write meant for another shape).
//
// Everything the call needs arrives as attributes named jaxbridge_guard_*, which the
// kernel's handler never sees:
//   jaxbridge_guard_target   the kernel's FFI target (looked up in the table below)
//   jaxbridge_guard_context  "jaxbridge kernel 'name', <role> target 'target'"
//   jaxbridge_guard_outputs  the outputs' names, one per line
//   jaxbridge_guard_layout   int64 [n_out, front bytes,
//                                   per output: bytes, back bytes, rank, dims...,
//                                   n_aliases, per alias: operand, output]
#ifndef JAXBRIDGE_BUILTIN_GUARD_H_
#define JAXBRIDGE_BUILTIN_GUARD_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "xla/ffi/api/c_api.h"

namespace jaxbridge::builtin::guard {

enum class Platform { kCpu, kCuda };

// The byte every guard is filled with.
inline constexpr unsigned char kCanary = 0xA5;
// The prefix of the guarded call's own attributes (stripped before the handler runs).
inline constexpr std::string_view kAttrPrefix = "jaxbridge_guard_";

// The handlers jaxbridge registered with XLA, by platform and target name: the guarded
// call finds the kernel's handler here (registered from jaxbridge._kernel.registry).
void Register(Platform platform, std::string target, XLA_FFI_Handler* handler);
XLA_FFI_Handler* Find(Platform platform, std::string_view target);

// How the guarded call reaches its platform's memory. Each method returns "" or what
// went wrong.
class Memory {
 public:
  virtual ~Memory() = default;
  virtual std::string Fill(void* device, size_t bytes) = 0;  // with kCanary
  virtual std::string Copy(void* device_dst, const void* device_src, size_t bytes) = 0;
  // Copies to the host once the handler's work is done (after Wait()).
  virtual std::string Fetch(unsigned char* host, const void* device, size_t bytes) = 0;
  virtual std::string Wait() = 0;
};

// True (and the metadata filled in) when XLA asks the handler for its metadata.
bool AnswerMetadataQuery(XLA_FFI_CallFrame* frame);

// The guarded call described above, on `platform`'s memory.
XLA_FFI_Error* Call(XLA_FFI_CallFrame* frame, Platform platform, Memory& memory);

// An FFI error with `message` (code INTERNAL, or INVALID_ARGUMENT for a bad layout).
XLA_FFI_Error* MakeError(const XLA_FFI_Api* api, const std::string& message,
                         bool invalid_argument = false);

}  // namespace jaxbridge::builtin::guard

#endif  // JAXBRIDGE_BUILTIN_GUARD_H_

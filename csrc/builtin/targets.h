// The one table of jaxbridge's built-in FFI targets. Everything that names a target --
// handler declarations, the registrations handed to Python, the names in error
// messages, jaxbridge/ops.py (via _builtin.targets()) -- expands this list.
//
//   X(op, role, Symbol, "target name")
// Handler symbols are Jaxbridge<Symbol>Cpu and Jaxbridge<Symbol>Cuda.
#ifndef JAXBRIDGE_BUILTIN_TARGETS_H_
#define JAXBRIDGE_BUILTIN_TARGETS_H_

#define JAXBRIDGE_BUILTIN_TARGETS(X)                                                     \
  X(softplus, forward, SoftplusFwd, "jaxbridge_softplus_fwd")                            \
  X(softplus, vjp, SoftplusAdj, "jaxbridge_softplus_adj")                            \
  X(softplus, jvp, SoftplusTan, "jaxbridge_softplus_tan")                            \
  X(tridiagonal_solve, forward, TridiagFwd, "jaxbridge_tridiagonal_solve_fwd")           \
  X(tridiagonal_solve, vjp, TridiagAdj, "jaxbridge_tridiagonal_solve_adj")           \
  X(tridiagonal_solve, jvp, TridiagTan, "jaxbridge_tridiagonal_solve_tan")           \
  X(rbf_kernel, forward, RbfFwd, "jaxbridge_rbf_kernel_fwd")                             \
  X(rbf_kernel, vjp, RbfAdj, "jaxbridge_rbf_kernel_adj")                             \
  X(rbf_kernel, jvp, RbfTan, "jaxbridge_rbf_kernel_tan")

namespace jaxbridge::builtin::target {
// target::SoftplusFwd == "jaxbridge_softplus_fwd", for error messages.
#define JAXBRIDGE_TARGET_NAME(op, role, Symbol, name) inline constexpr char Symbol[] = name;
JAXBRIDGE_BUILTIN_TARGETS(JAXBRIDGE_TARGET_NAME)
#undef JAXBRIDGE_TARGET_NAME
}  // namespace jaxbridge::builtin::target

#endif  // JAXBRIDGE_BUILTIN_TARGETS_H_

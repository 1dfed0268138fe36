"""Mutation testing of `jaxbridge.testing.check_rules` (issue 27): a checker is only
worth what it catches.

For every kind of derivative rule (NumPy VJP, NumPy JVP, linear transpose, C++ kernel
adjoint, C++ kernel tangent, `custom_gradient`) the same function,

    f(x, y) = M x + sin(x) * y        (linear kind: f(x, y) = M x + d * x + y)

gets a correct rule and one mutant per bug below. Every mutant must fail
`check_rules` with a hint that names the bug; the correct rules must pass on a
well-conditioned M with moderate inputs and on an ill-conditioned M (entries from 1e-6
to 1e3) with inputs spanning five orders of magnitude. `test_mutation_score` prints the
table and requires 100%.

The C++ mutants are one source file, compiled once per session (cached), with one
handler per mutant; their math is the C++ twin of `_adjoint` / `_tangent` below.
"""

import functools
import os
import shutil

import numpy as np
import pytest

import jaxbridge as jb
from jaxbridge.testing import CheckOptions, RuleCheckError, check_rules

#: Each mutant, and words the hint of at least one failing check must contain.
MUTANTS = {
    "sign": "sign flipped",                # the whole rule negated
    "scale": "constant factor ~1.01",      # the whole rule times 1.01
    "transposed": "transposed",            # M where M^T belongs (or the reverse)
    "swapped": "arguments swapped",        # the results for x and y exchanged
    "dropped": "dropped term",             # the cos(x) y term left out
    "float32": "wrong dtype",              # a float32 result for float64
    "in_place": "input was overwritten",   # the rule writes into an input it was lent
    "ignores": "ignore this input",        # no derivative with respect to y
    "other_operator": "another operator",  # the transpose of N instead of M
}
KINDS = ("numpy_vjp", "numpy_jvp", "linear_transpose", "kernel_vjp", "kernel_jvp",
         "custom_gradient")
KERNEL_KINDS = ("kernel_vjp", "kernel_jvp")
HAVE_CXX = shutil.which(os.environ.get("CXX", "c++")) is not None
# The C++ mutants are compiled for the CPU only: on JAX's CPU device even where a GPU is
# JAX's default.
pytestmark = pytest.mark.cpu

# The matrices of the C++ source (kM[0], kM[1], kM[2]).
M_WELL = np.array([[2.0, -1.0, 0.5], [0.3, 1.0, -2.0], [1.5, 0.2, 0.7]])
M_ILL = np.array([[1e3, 1e3, 1.0], [1e3, 1e3 + 1e-3, 1e-6], [1.0, 1e-6, 1e-3]])
M_OTHER = np.array([[0.4, 1.1, -0.6], [-1.3, 0.8, 0.9], [0.1, -0.7, 2.2]])
D = np.array([0.7, -1.9, 1.2])  # the diagonal term of the linear kind

INPUTS = {  # condition -> (M, x, y)
    "well": (M_WELL, np.array([0.3, -1.2, 0.8]), np.array([1.5, -0.4, 2.0])),
    "ill": (M_ILL, np.array([1e-3, -25.0, 3.0]), np.array([1e-4, 7.0, -300.0])),
}
#: Mutants are checked by the derivative checks (and the input check): fast, and the
#: hints come from them. Correct rules get every check.
MUTANT_OPTIONS = CheckOptions(n_directions=2, checks=(
    "cotangent_shapes", "tangent_shapes", "vjp_fd", "jvp_fd", "vjp_jacobian", "jvp_jacobian",
    "jvp_vjp_consistency", "inputs_unchanged", "derivatives_checked"))
CORRECT_OPTIONS = CheckOptions(n_directions=2)


# ------------------------------------------------------------------ NumPy rules
def _adjoint(mutant, M, x, y, ct):
    """(cotangent of x, of y) of f(x, y) = M x + sin(x) y, as `mutant` computes it."""
    op = M_OTHER if mutant == "other_operator" else M
    gx = (op if mutant == "transposed" else op.T) @ ct
    if mutant != "dropped":
        gx = gx + np.cos(x) * y * ct
    gy = None if mutant == "ignores" else np.sin(x) * ct
    if mutant == "swapped":
        gx, gy = gy, gx
    k = {"sign": -1.0, "scale": 1.01}.get(mutant, 1.0)
    gx, gy = k * gx, None if gy is None else k * gy
    if mutant == "float32":
        gx = gx.astype(np.float32)
    if mutant == "in_place":
        x[0] += 1.0  # a view of XLA's buffer: read-only
    return gx, gy


def _tangent(mutant, M, x, y, tx, ty):
    tx = np.zeros_like(x) if tx is None else tx
    ty = np.zeros_like(y) if ty is None else ty
    if mutant == "swapped":
        tx, ty = ty, tx
    op = M_OTHER if mutant == "other_operator" else M
    t = (op.T if mutant == "transposed" else op) @ tx
    if mutant != "dropped":
        t = t + np.cos(x) * y * tx
    if mutant != "ignores":
        t = t + np.sin(x) * ty
    t = {"sign": -1.0, "scale": 1.01}.get(mutant, 1.0) * t
    if mutant == "float32":
        t = t.astype(np.float32)
    if mutant == "in_place":
        x[0] += 1.0
    return t


def _transpose(mutant, M, ct):
    """(cotangent of x, of y) of the linear f(x, y) = M x + D x + y."""
    op = M_OTHER if mutant == "other_operator" else M
    gx = (op if mutant == "transposed" else op.T) @ ct
    if mutant != "dropped":
        gx = gx + D * ct
    gy = None if mutant == "ignores" else ct.copy()
    if mutant == "swapped":
        gx, gy = gy, gx
    k = {"sign": -1.0, "scale": 1.01}.get(mutant, 1.0)
    gx, gy = k * gx, None if gy is None else k * gy
    if mutant == "float32":
        gx = gx.astype(np.float32)
    if mutant == "in_place":
        ct[0] = 0.0
    return gx, gy


def _numpy(kind, mutant, M):
    if kind == "linear_transpose":
        @jb.foreign(lambda x, y: x, linear=True)
        def f(x, y):
            return M @ x + D * x + y

        f.deftranspose(lambda ct: _transpose(mutant, M, ct))
        return f
    if kind == "custom_gradient":
        @jb.custom_gradient(lambda x, y: x)
        def f(x, y):
            return M @ x + np.sin(x) * y, lambda ct: _adjoint(mutant, M, x, y, ct)
        return f

    @jb.foreign(lambda x, y: x)
    def f(x, y):
        return M @ x + np.sin(x) * y

    if kind == "numpy_vjp":
        f.defvjp(lambda p, out, ct: _adjoint(mutant, M, *p, ct))
    else:
        f.defjvp(lambda p, out, t: _tangent(mutant, M, *p, *t))
    return f


# ------------------------------------------------------------------ C++ kernels
KERNEL_SOURCE = r"""
// f(x, y) = M x + sin(x) * y   (x, y, f: float64[3]; pass_outputs=False)
// adjoint(x, y, ct) -> (gx, gy) = (M^T ct + cos(x) y ct, sin(x) ct)
// tangent(x, y, tx, ty) -> M tx + cos(x) y tx + sin(x) ty
#include <cmath>
#include "xla/ffi/api/ffi.h"
namespace ffi = xla::ffi;
using B = ffi::Buffer<ffi::F64>;
using R = ffi::ResultBuffer<ffi::F64>;
using R32 = ffi::ResultBuffer<ffi::F32>;

// Mutant ids (the test's MUTANTS table uses the same order).
enum { kCorrect, kSign, kScale, kTransposed, kSwapped, kDropped, kFloat32, kInPlace,
       kIgnores, kOtherOperator };
// Matrices: 0 well conditioned, 1 ill conditioned (entries from 1e-6 to 1e3), 2 another
// operator (the "transpose of the wrong operator" mutant).
static const double kM[3][3][3] = {
    {{2.0, -1.0, 0.5}, {0.3, 1.0, -2.0}, {1.5, 0.2, 0.7}},
    {{1e3, 1e3, 1.0}, {1e3, 1e3 + 1e-3, 1e-6}, {1.0, 1e-6, 1e-3}},
    {{0.4, 1.1, -0.6}, {-1.3, 0.8, 0.9}, {0.1, -0.7, 2.2}}};

static ffi::Error CheckN(size_t n) {
  return n == 3 ? ffi::Error::Success() : ffi::Error::InvalidArgument("mutants: size 3 only");
}

template <int Mat>
ffi::Error Fwd(B x, B y, R f) {
  if (auto e = CheckN(x.element_count()); e.failure()) return e;
  const double* X = x.typed_data(); const double* Y = y.typed_data();
  for (int i = 0; i < 3; ++i) {
    double s = std::sin(X[i]) * Y[i];
    for (int j = 0; j < 3; ++j) s += kM[Mat][i][j] * X[j];
    f->typed_data()[i] = s;
  }
  return ffi::Error::Success();
}

template <int K, int Mat>
void AdjointMath(const double* X, const double* Y, const double* C, double* gx, double* gy) {
  const int op = K == kOtherOperator ? 2 : Mat;
  for (int i = 0; i < 3; ++i) {
    double mt = 0;  // (M^T ct)_i, or (M ct)_i for the transposed mutant
    for (int j = 0; j < 3; ++j) mt += (K == kTransposed ? kM[op][i][j] : kM[op][j][i]) * C[j];
    double gxi = mt + (K == kDropped ? 0.0 : std::cos(X[i]) * Y[i] * C[i]);
    double gyi = K == kIgnores ? 0.0 : std::sin(X[i]) * C[i];
    if (K == kSwapped) std::swap(gxi, gyi);
    const double k = K == kSign ? -1.0 : K == kScale ? 1.01 : 1.0;
    gx[i] = k * gxi;
    gy[i] = k * gyi;
  }
}

template <int K, int Mat>
ffi::Error Adj(B x, B y, B ct, R gx, R gy) {
  if (auto e = CheckN(x.element_count()); e.failure()) return e;
  AdjointMath<K, Mat>(x.typed_data(), y.typed_data(), ct.typed_data(), gx->typed_data(),
                      gy->typed_data());
  if (K == kInPlace) const_cast<double*>(x.typed_data())[0] += 1.0;  // writes a lent input
  return ffi::Error::Success();
}

ffi::Error AdjF32(B x, B y, B ct, R32 gx, R gy) {  // the first cotangent as float32
  double g[3];
  AdjointMath<kCorrect, 0>(x.typed_data(), y.typed_data(), ct.typed_data(), g,
                           gy->typed_data());
  for (int i = 0; i < 3; ++i) gx->typed_data()[i] = static_cast<float>(g[i]);
  return ffi::Error::Success();
}

template <int K, int Mat>
void TangentMath(const double* X, const double* Y, const double* TX, const double* TY,
                 double* t) {
  const int op = K == kOtherOperator ? 2 : Mat;
  const double* tx = K == kSwapped ? TY : TX;
  const double* ty = K == kSwapped ? TX : TY;
  for (int i = 0; i < 3; ++i) {
    double s = (K == kDropped ? 0.0 : std::cos(X[i]) * Y[i] * tx[i]);
    if (K != kIgnores) s += std::sin(X[i]) * ty[i];
    for (int j = 0; j < 3; ++j) s += (K == kTransposed ? kM[op][j][i] : kM[op][i][j]) * tx[j];
    t[i] = (K == kSign ? -1.0 : K == kScale ? 1.01 : 1.0) * s;
  }
}

template <int K, int Mat>
ffi::Error Tan(B x, B y, B tx, B ty, R t) {
  if (auto e = CheckN(x.element_count()); e.failure()) return e;
  TangentMath<K, Mat>(x.typed_data(), y.typed_data(), tx.typed_data(), ty.typed_data(),
                      t->typed_data());
  if (K == kInPlace) const_cast<double*>(x.typed_data())[0] += 1.0;
  return ffi::Error::Success();
}

ffi::Error TanF32(B x, B y, B tx, B ty, R32 t) {
  double v[3];
  TangentMath<kCorrect, 0>(x.typed_data(), y.typed_data(), tx.typed_data(), ty.typed_data(), v);
  for (int i = 0; i < 3; ++i) t->typed_data()[i] = static_cast<float>(v[i]);
  return ffi::Error::Success();
}
"""


def _handlers() -> str:
    """The FFI symbols: forward (two matrices), and the adjoint and tangent of every
    mutant, written out (the loader reads the names from the source)."""
    fwd = "ffi::Ffi::Bind().Arg<B>().Arg<B>().Ret<B>()"
    adj = "ffi::Ffi::Bind().Arg<B>().Arg<B>().Arg<B>().Ret<{}>().Ret<B>()"
    tan = "ffi::Ffi::Bind().Arg<B>().Arg<B>().Arg<B>().Arg<B>().Ret<{}>()"
    f32 = "ffi::Buffer<ffi::F32>"
    lines = [f"XLA_FFI_DEFINE_HANDLER_SYMBOL(Forward_{c}, (Fwd<{m}>), {fwd});"
             for c, m in (("well", 0), ("ill", 1))]
    # "in_place" -> kInPlace (the C++ enum); float32 has its own handlers (a float32 result)
    ids = {m: "k" + "".join(w.title() for w in m.split("_")) for m in ("correct", *MUTANTS)}
    ids["float32"] = None
    for role, bind, impl in (("Adjoint", adj, "Adj"), ("Tangent", tan, "Tan")):
        for mutant, cid in ids.items():
            if cid is None:
                lines.append(f"XLA_FFI_DEFINE_HANDLER_SYMBOL({role}_float32, {impl}F32, "
                             f"{bind.format(f32)});")
                continue
            lines.append(f"XLA_FFI_DEFINE_HANDLER_SYMBOL({role}_{mutant}, ({impl}<{cid}, 0>), "
                         f"{bind.format('B')});")
        lines.append(f"XLA_FFI_DEFINE_HANDLER_SYMBOL({role}_correct_ill, ({impl}<kCorrect, 1>), "
                     f"{bind.format('B')});")
    return "\n".join(lines)


@pytest.fixture(scope="module")
def mutant_lib(tmp_path_factory):
    if not HAVE_CXX:
        pytest.skip("no C++ compiler")
    old = os.environ.get("JAXBRIDGE_CACHE_DIR")
    os.environ["JAXBRIDGE_CACHE_DIR"] = str(tmp_path_factory.mktemp("mutcache") / "cache")
    try:
        yield jb.cpp.load("checker_mutants", source=KERNEL_SOURCE + _handlers())
    finally:
        if old is None:
            os.environ.pop("JAXBRIDGE_CACHE_DIR", None)
        else:
            os.environ["JAXBRIDGE_CACHE_DIR"] = old


_KERNELS: dict = {}


def _kernel(lib, kind, mutant, condition):
    key = (kind, mutant, condition)
    if key not in _KERNELS:
        rule = ("Adjoint_" if kind == "kernel_vjp" else "Tangent_") + mutant + (
            "_ill" if condition == "ill" else "")
        role = "vjp" if kind == "kernel_vjp" else "jvp"
        _KERNELS[key] = lib.kernel(
            forward=f"Forward_{condition}", **{role: rule}, name=f"{rule}_{condition}",
            result=lambda x, y: x, arg_names=("x", "y"), dtypes=["float64"],
            pass_outputs=False)
    return _KERNELS[key]


def _function(lib, kind, mutant, condition="well"):
    if kind in KERNEL_KINDS:
        return _kernel(lib, kind, mutant, condition)
    return _numpy(kind, mutant, INPUTS[condition][0])


# ------------------------------------------------------------------ the table
@functools.cache
def _outcome(lib, kind, mutant):
    """(caught with the right hint?, the failing rows' hints) for one mutant."""
    _, x, y = INPUTS["well"]
    f = _function(lib, kind, mutant)
    try:
        check_rules(f, x.copy(), y.copy(), check_options=MUTANT_OPTIONS)
    except RuleCheckError as err:
        hints = tuple(sorted({r.hint for r in err.report.failures}))
        return any(MUTANTS[mutant] in h for h in hints), hints
    return False, ("(passed the checker)",)


def _lib_for(kind, request):
    return request.getfixturevalue("mutant_lib") if kind in KERNEL_KINDS else None


@pytest.mark.parametrize("condition", ["well", "ill"])
@pytest.mark.parametrize("kind", KINDS)
def test_correct_rules_pass_with_no_false_alarm(kind, condition, request):
    _, x, y = INPUTS[condition]
    f = _function(_lib_for(kind, request), kind, "correct", condition)
    report = check_rules(f, x.copy(), y.copy(), check_options=CORRECT_OPTIONS)
    ran = [r.name for r in report.results if r.status == "pass"]
    mode = "jvp" if kind in ("numpy_jvp", "kernel_jvp") else "vjp"
    assert f"{mode}_fd" in ran and f"{mode}_jacobian" in ran, report
    assert "fail" not in {r.status for r in report.by_name("derivatives_checked")}


@pytest.mark.parametrize("kind", KINDS)
def test_every_mutant_is_caught_with_a_hint_naming_it(kind, request):
    lib = _lib_for(kind, request)
    missed = {m: _outcome(lib, kind, m)[1] for m in MUTANTS if not _outcome(lib, kind, m)[0]}
    assert not missed, f"{kind}: mutants not caught with their hint: {missed}"


def test_mutation_score(request):
    """Print the table (rule kind x mutant) and require 100%."""
    kinds = [k for k in KINDS if HAVE_CXX or k not in KERNEL_KINDS]
    cells = {(k, m): _outcome(_lib_for(k, request), k, m)[0] for k in kinds for m in MUTANTS}
    width = max(map(len, MUTANTS))
    lines = ["rule kind".ljust(18) + "  ".join(m.rjust(width) for m in MUTANTS)]
    for k in kinds:
        lines.append(k.ljust(18) + "  ".join(("caught" if cells[k, m] else "MISSED").rjust(width)
                                             for m in MUTANTS))
    score = sum(cells.values()) / len(cells)
    lines.append(f"mutation score: {sum(cells.values())}/{len(cells)} = {100 * score:.0f}%")
    print("\n".join(lines))
    assert score == 1.0, "\n".join(lines)

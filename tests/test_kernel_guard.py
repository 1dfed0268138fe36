"""Guarded outputs (jaxbridge.kernel(..., guard_outputs=True), Kernel.guarded(), on in
check_rules): a handler that writes outside an output, in the forward, the adjoint or
the tangent, past the end or before the start, is reported by kernel, target and output,
and the process lives on; correct kernels give the same values guarded as not, under
jit, grad, jvp, vmap and scan, aliases included.

A write outside an output corrupts XLA's heap without the guard, so the checks that a
bad kernel is reported run in a subprocess with a time limit (a crash fails the test
instead of the run)."""

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbridge as jb
from jaxbridge import ops
from jaxbridge._kernel import guard
from jaxbridge.errors import KernelError
from jaxbridge.testing import check_rules

ROOT = Path(__file__).resolve().parents[1]
CHECKS_CC = ROOT / "tests" / "native" / "kernel_checks.cc"
RMS_NORM_CC = ROOT / "examples" / "rms_norm.cc"
TIMEOUT_S = 240

pytestmark = [pytest.mark.skipif(shutil.which(os.environ.get("CXX", "c++")) is None,
                                 reason="no C++ compiler"), pytest.mark.cpu]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    path = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("JAXBRIDGE_CACHE_DIR", str(path))
        yield path


@pytest.fixture(scope="module")
def lib(cache):
    return jb.cpp.load("kernel_checks", sources=[CHECKS_CC])


def scale_kernel(lib, name, **options):
    return lib.kernel("ScaleFwd", vjp="ScaleAdj", jvp="ScaleTan", name=name,
                      result=lambda x, **_: x, attrs={"extra": 0, "before": 0, "role": ""},
                      dtypes=["float64"], arg_names=("x",), **options)


# ------------------------------------------------------------------ right kernels, same values
@pytest.mark.parametrize("how", ["eager", "jit", "grad", "jvp", "vmap", "vmap_loop", "scan"])
def test_a_correct_kernel_gives_the_same_values_guarded(lib, how):
    plain = scale_kernel(lib, f"scale_{how}", vmap="loop" if how == "vmap_loop" else
                         "vectorized")
    guarded = plain.guarded()
    assert guarded.guard_outputs and not plain.guard_outputs
    x = jnp.linspace(-1.0, 1.0, 6).reshape(2, 3)
    run = {
        "eager": lambda k: k(x),
        "jit": lambda k: jax.jit(k)(x),
        "grad": lambda k: jax.grad(lambda x: jnp.sum(k(x) ** 2))(x),
        "jvp": lambda k: jax.jvp(k, (x,), (x,)),
        "vmap": lambda k: jax.vmap(k)(x),
        "vmap_loop": lambda k: jax.vmap(jax.grad(lambda x: jnp.sum(k(x) ** 2)))(x),
        "scan": lambda k: jax.lax.scan(lambda c, _: (k(c), None), x, None, length=3)[0],
    }[how]
    for got, want in zip(jax.tree_util.tree_leaves(run(guarded)),
                         jax.tree_util.tree_leaves(run(plain))):
        np.testing.assert_array_equal(got, want)


def test_the_guarded_program_calls_the_guarded_target(lib):
    k = scale_kernel(lib, "scale_hlo").guarded()
    x = jnp.ones(3)
    text = jax.jit(jax.grad(lambda x: jnp.sum(k(x) ** 2))).lower(x).as_text()
    assert guard.TARGET in text
    assert k.target("forward", "cpu") in text and k.target("vjp", "cpu") in text
    exported = jax.export.export(jax.jit(k), platforms=["cpu"],
                                 disabled_checks=k.export_checks())(x)
    np.testing.assert_array_equal(jax.export.deserialize(exported.serialize()).call(x), 2 * x)


def test_aliased_results_start_from_their_operand(lib):
    """An adjoint correct only in place (it reads its result buffer): guarded, its
    result starts as a copy of the aliased operand, as XLA's aliasing would leave it."""
    k = lib.kernel("ScaleFwd", vjp="DoubleInPlace", name="double_in_place",
                   result=lambda x, **_: x, attrs={"extra": 0, "before": 0, "role": ""},
                   dtypes=["float64"], pass_outputs=False, aliases={"vjp": {1: 0}})
    x, ct = jnp.arange(4.0), jnp.linspace(1.0, 2.0, 4)
    for f in (k, k.guarded()):
        np.testing.assert_array_equal(jax.vjp(f, x)[1](ct)[0], 2 * ct)


def test_residual_kernels_guarded(cache):
    lib = jb.cpp.load("rms_norm", sources=[RMS_NORM_CC])
    plain = lib.kernel("RmsNorm", vjp="RmsNormDerivative", jvp="RmsNormDerivative",
                       forward_with_residuals="RmsNormWithResiduals", name="rms_guarded",
                       result=lambda x, **_: x, attrs={"eps": 1e-5}, pass_outputs=False,
                       residuals=lambda x, **_: jax.ShapeDtypeStruct(x.shape[:-1], x.dtype),
                       aliases={"vjp": {2: 0}})
    x = jnp.asarray(np.random.default_rng(0).normal(size=(4, 6)))
    for how in (lambda k: jax.value_and_grad(lambda x: jnp.sum(k(x) ** 3))(x),
                lambda k: jax.jvp(k, (x,), (x * x,))):
        for got, want in zip(how(plain.guarded()), how(plain)):
            np.testing.assert_array_equal(got, want)


def test_kernels_traced_while_guarding_are_guarded():
    """What check_rules does: the built-in ops (functions over kernels) too."""
    x = jnp.linspace(-3.0, 3.0, 7)

    def f(x):
        return jax.grad(lambda x: ops.softplus(x, beta=2.0).sum())(x)

    jitted = jax.jit(f)
    want = jitted(x)  # compiled before: traced again inside the block
    with guard.guarding():
        text = jitted.lower(x).as_text()
        got = jitted(x)
    assert guard.TARGET in text and "jaxbridge_softplus_adj" in text
    assert guard.TARGET not in jitted.lower(x).as_text()  # and not reused after it
    np.testing.assert_array_equal(got, want)


# ------------------------------------------------------------------ refusals at trace time
def test_a_target_registered_elsewhere_cannot_be_guarded():
    capsule = ops._builtin_ext.registrations()["cpu"]["jaxbridge_softplus_fwd"]
    jax.ffi.register_ffi_target("tests_guard.softplus_elsewhere", capsule, platform="cpu")
    k = jb.kernel("tests_guard.softplus_elsewhere", result=lambda x, **_: x,
                  attrs={"beta": 1.0}, name="sp_elsewhere", guard_outputs=True)
    with pytest.raises(KernelError, match=r"kernel 'sp_elsewhere', forward target "
                                          r"'tests_guard.softplus_elsewhere': guard_outputs="
                                          r"True runs the handler that jaxbridge registered"):
        k(jnp.ones(3))


def test_check_rules_leaves_a_kernel_it_cannot_guard_as_it_is():
    """A kernel over a target registered outside jaxbridge: check_rules checks it
    unguarded (as before guarded outputs existed) rather than failing every check."""
    capsule = ops._builtin_ext.registrations()["cpu"]["jaxbridge_softplus_fwd"]
    adjoint = ops._builtin_ext.registrations()["cpu"]["jaxbridge_softplus_adj"]
    jax.ffi.register_ffi_target("tests_guard.sp_fwd_elsewhere", capsule, platform="cpu")
    jax.ffi.register_ffi_target("tests_guard.sp_adj_elsewhere", adjoint, platform="cpu")
    k = jb.kernel("tests_guard.sp_fwd_elsewhere", "tests_guard.sp_adj_elsewhere",
                  result=lambda x, **_: x, attrs={"beta": 1.0}, name="sp_unguardable",
                  pass_outputs=False)
    x = jnp.linspace(-2.0, 2.0, 5)
    with guard.guarding():
        assert guard.TARGET not in jax.jit(k).lower(x).as_text()
    assert check_rules(k, x).passed


def test_reserved_attribute_names(lib):
    with pytest.raises(KernelError, match=r"attrs\['jaxbridge_guard_target'\]: the prefix "
                                          r"'jaxbridge_' is reserved"):
        jb.kernel("tests_guard.any", result=lambda x, **_: x,
                  attrs={"jaxbridge_guard_target": ""})
    k = jb.kernel("tests_guard.any", result=lambda x, **_: x, name="sp_reserved")
    with pytest.raises(KernelError, match=r"attribute 'jaxbridge_x': the prefix"):
        k(jnp.ones(3), jaxbridge_x=1.0)


# ------------------------------------------------------------------ bad kernels, reported
def run_python(code: str, cache: Path) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter (x64 on, the test cache), with a time limit."""
    env = {**os.environ, "JAXBRIDGE_CACHE_DIR": str(cache), "JAX_ENABLE_X64": "1",
           "JAX_PLATFORMS": "cpu"}
    try:
        return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                              capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"did not finish in {TIMEOUT_S} s:\n{exc.stdout}\n{exc.stderr}")


CALL = {"forward": "k(x, **bad)",
        "vjp": "jax.grad(lambda x: jnp.sum(k(x, **bad)))(x)",
        "jvp": "jax.jvp(lambda x: k(x, **bad), (x,), (x,))[1]"}
OUTPUT = {"forward": "result", "vjp": "cotangent of argument 'x'",
          "jvp": "tangent of result"}
CASES = [(role, where) for role in CALL for where in ("past", "before")]


def bad_attrs(role: str, where: str) -> dict:
    return {"role": role, "extra": 3} if where == "past" else {"role": role, "before": 2}


# Every bad case in one interpreter (one start, one load of the libraries); each prints
# its message between markers, and the interpreter says it is alive at the end.
BAD_KERNELS = f"""
import jax, jax.numpy as jnp, numpy as np
import jaxbridge as jb
from jaxbridge.testing import RuleCheckError, check_rules
lib = jb.cpp.load("kernel_checks", sources=[{str(CHECKS_CC)!r}])
scale = dict(vjp="ScaleAdj", jvp="ScaleTan", name="scale", result=lambda x, **_: x,
             attrs={{"extra": 0, "before": 0, "role": ""}}, dtypes=["float64"],
             arg_names=("x",))
k = lib.kernel("ScaleFwd", guard_outputs=True, **scale)
x = jnp.linspace(-1.0, 1.0, 10)
for role, where, bad, call in {[(r, w, bad_attrs(r, w), CALL[r]) for r, w in CASES]!r}:
    print(f"<<{{role}} {{where}}>>")
    try:
        jax.block_until_ready(eval(call))
    except jax.errors.JaxRuntimeError as err:
        print(err)
print("<<check_rules>>")  # unguarded itself: check_rules guards it
try:
    check_rules(lib.kernel("ScaleFwd", **scale), x, extra=2, role="forward")
except RuleCheckError as err:
    print(err)
print("<<too small>>")  # the issue's case: x's shape written into a smaller result
rms = jb.cpp.load("rms_norm", sources=[{str(RMS_NORM_CC)!r}])
half = lambda x, **_: jax.ShapeDtypeStruct((x.shape[0] // 2, x.shape[1]), x.dtype)
small = rms.kernel("RmsNorm", name="rms_small", result=half, attrs={{"eps": 1e-5}})
try:
    small.guarded()(jnp.ones((64, 64), jnp.float32)).block_until_ready()
except jax.errors.JaxRuntimeError as err:
    print(err)
print("<<ALIVE>>")
"""


@pytest.fixture(scope="module")
def reports(cache) -> dict:
    """{case: what it printed} from one subprocess running every bad case."""
    proc = run_python(BAD_KERNELS, cache)
    assert proc.returncode == 0 and "<<ALIVE>>" in proc.stdout, proc.stdout + proc.stderr
    parts = proc.stdout.split("<<")[1:]
    return dict(part.split(">>", 1) for part in parts)


@pytest.mark.parametrize("role, where", CASES)
def test_a_write_outside_an_output_is_reported(reports, role, where):
    out = reports[f"{role} {where}"]
    target = f"cpp.kernel_checks.scale_{role}"
    assert f"jaxbridge kernel 'scale', {role} target '{target}'" in out
    how = "up to 24 bytes past its end" if where == "past" else \
        "up to 16 bytes before its start"
    assert f"wrote outside output '{OUTPUT[role]}' (shape [10], 80 bytes): {how}" in out


def test_check_rules_reports_the_write_without_crashing(reports):
    """The checker guards every kernel it traces: a forward that writes 2 elements too
    many is an error of the first check, naming the output; the run ends normally."""
    out = reports["check_rules"]
    assert "ERROR output_shapes" in out
    assert "wrote outside output 'result' (shape [10], 80 bytes): up to 16 bytes past its " \
           "end" in out


def test_a_result_declared_too_small_is_reported(reports):
    """The issue's case: the handler writes x's shape into a result declared smaller."""
    assert "wrote outside output 'result' (shape [32, 64], 8192 bytes): up to 8192 bytes " \
           "past its end" in reports["too small"]


def test_guards_are_sized_to_the_largest_operand():
    small, big = jax.ShapeDtypeStruct((2,), np.float32), jax.ShapeDtypeStruct((1000,), np.float64)
    assert guard.back_bytes(small, ()) == guard.MIN_BACK_BYTES
    assert guard.back_bytes(small, (big,)) == 8192  # 8000 rounded up to 256
    assert guard.back_bytes(big, (small,)) == 8192

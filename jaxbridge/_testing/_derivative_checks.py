"""The checks of `check_rules` that test derivative rules themselves: declared vs
actual shapes, integer inputs, each rule against finite differences (along random
directions, and as full Jacobians), the two rules against each other, symbolic zeros,
second order, and that each mode the function has was checked at all.

Each check is a function of the `Run` (`_run`); `_checker` holds the table of checks.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import _diagnose
from ._fd import ridders
from ._flat import inexact, is_complex
from ._report import FORWARD_CHECKS, REVERSE_CHECKS
from ._run import Run, wide


def _pair(a: Any, b: Any) -> float:
    """JAX's (bilinear) pairing of tangents and cotangents: Re(sum(a * b))."""
    return float(np.real(np.sum(wide(a) * wide(b))))


def _abs_pair(a: Any, b: Any) -> float:
    return float(np.sum(np.abs(wide(a)) * np.abs(wide(b))))


def _dtype_name(dtype: Any) -> str:
    dtype = np.dtype(dtype)
    return "float0" if dtype == jax.dtypes.float0 else dtype.name


def _square_transposed(c: np.ndarray) -> np.ndarray | None:
    """A square matrix cotangent, transposed (what a rule that transposed it gave)."""
    return c.T if c.ndim == 2 and c.shape[0] == c.shape[1] and c.shape[0] > 1 else None


# ------------------------------------------------------------ declared vs actual
def check_output_shapes(r: Run) -> None:
    call = r.call
    args = jax.tree_util.tree_unflatten(call.treedef, call.leaves)
    declared = jax.eval_shape(lambda *a: call.f(*a, **call.static), *args)
    d_tree: Any  # a PyTreeDef, which mypy cannot resolve (jaxlib ships no stubs)
    d_leaves, d_tree = jax.tree_util.tree_flatten(declared)
    if d_tree != call.out_tree:
        r.add("output_shapes", "fail", hint="wrong structure",
              note=f"declared {d_tree}, the eager call returned {call.out_tree}")
        return
    for d, a, label in zip(d_leaves, call.outs, call.out_labels):
        dd, ad = (tuple(d.shape), np.dtype(d.dtype)), (tuple(a.shape), np.dtype(a.dtype))
        if dd == ad:
            r.add("output_shapes", "pass", output=label, note=f"{ad[1].name}{list(ad[0])}")
        else:
            r.add("output_shapes", "fail", output=label,
                  hint="wrong shape" if dd[0] != ad[0] else "wrong dtype",
                  note=f"declared {dd[1].name}{list(dd[0])}, got {ad[1].name}{list(ad[0])}")


def _expect(r: Run, name: str, got: Any, like: Any, label: str, out: str | None = None,
            arg: str | None = None, integer_ok: bool = True) -> None:
    want_dtype = np.dtype(like.dtype) if inexact(like.dtype) else np.dtype(jax.dtypes.float0)
    gd, gs = np.dtype(got.dtype), tuple(np.shape(got))
    ok_dtype = gd == want_dtype or (not inexact(like.dtype) and integer_ok
                                    and not np.any(np.asarray(got)))
    if gs == tuple(like.shape) and ok_dtype:
        r.add(name, "pass", arg, out, note=f"{_dtype_name(gd)}{list(gs)}")
    else:
        r.add(name, "fail", arg, out,
              hint="wrong shape" if gs != tuple(like.shape) else "wrong dtype",
              note=f"{label}: expected {_dtype_name(want_dtype)}{list(like.shape)}, "
                   f"got {_dtype_name(gd)}{list(gs)}")


def _all_cts(r: Run) -> tuple[Any, Any]:
    """jax.vjp over every dynamic input (integers included) with random cotangents."""
    call = r.call
    cts = [r.randn(o) if inexact(o.dtype) else np.zeros(o.shape, jax.dtypes.float0)
           for o in call.outs]
    _, pull = jax.vjp(lambda *d: call.call_dyn(d), *call.dyn)
    return pull(cts)


def check_cotangent_shapes(r: Run) -> None:
    call, p = r.call, r.plan
    if not p.rev and call.diff:
        return r.skip("cotangent_shapes", p.rev_reason)
    if not call.diff:
        return r.skip("cotangent_shapes", "no floating-point inputs")
    got = _all_cts(r)
    for g, x, label in zip(got, call.dyn, call.labels):
        _expect(r, "cotangent_shapes", g, x, "cotangent", arg=label)


def check_tangent_shapes(r: Run) -> None:
    call = r.call
    if not r.need_diff("tangent_shapes", "fwd"):
        return
    tans = [r.randn(x) if inexact(x.dtype) else np.zeros(x.shape, jax.dtypes.float0)
            for x in call.dyn]
    _, out_t = jax.jvp(lambda *d: call.call_dyn(d), tuple(call.dyn), tuple(tans))
    for g, o, label in zip(out_t, call.outs, call.out_labels):
        _expect(r, "tangent_shapes", g, o, "output tangent", out=label)


def check_integer_inputs(r: Run) -> None:
    call, p = r.call, r.plan
    if not call.ints:
        return r.skip("integer_inputs", "no integer or boolean inputs")
    if p.rev:
        got = _all_cts(r)
        for i in call.ints:
            _expect(r, "integer_inputs", got[i], call.dyn[i], "cotangent",
                    arg=call.labels[i])
    if p.fwd and call.diff:
        tans = [r.randn(x) if inexact(x.dtype) else np.zeros(x.shape, jax.dtypes.float0)
                for x in call.dyn]
        jax.jvp(lambda *d: call.call_dyn(d), tuple(call.dyn), tuple(tans))
        r.add("integer_inputs", "pass", note="jvp with float0 integer tangents ran")


# ------------------------------------------------------------ finite differences
def check_vjp_fd(r: Run) -> None:
    call, p = r.call, r.plan
    if not r.need_diff("vjp_fd", "rev"):
        return
    dirs, cts, fds = r.directions(), r.cotangents(), r.fd_dirs
    for o in range(len(call.dout)):
        rule_cts = []
        for k in range(len(dirs)):
            try:
                rule_cts.append(call.jitted["vjp_out"](o, p.work, cts[k][o]))
            except Exception as exc:  # noqa: BLE001
                r.add("vjp_fd", "error", "*", call.olabel(o), hint=_diagnose.hint(exc),
                      note=_diagnose.note(exc))
                break
        else:
            for j in range(len(call.diff)):
                rule, ref, tol, scale, trans = [], [], [], [], []
                for k in range(len(dirs)):
                    c = np.asarray(rule_cts[k][j])
                    fd = fds[k][j]
                    if c.shape != dirs[k][j].shape:
                        r.add("vjp_fd", "fail", call.jlabel(j), call.olabel(o),
                              hint="wrong shape", note=f"cotangent shape "
                              f"{list(c.shape)}, input shape {list(dirs[k][j].shape)}")
                        break
                    ct = cts[k][o]
                    rule.append(_pair(c, dirs[k][j]))
                    ref.append(_pair(ct, fd.value[o]))
                    s = _abs_pair(ct, fd.value[o]) + _abs_pair(c, dirs[k][j])
                    scale.append(s)
                    tol.append(float(p.fd_tol(np.asarray(s), _abs_pair(ct, fd.error[o])))
                               + p.nondet * float(np.sum(np.abs(dirs[k][j]))))
                    ct_t = _square_transposed(c)
                    trans.append(None if ct_t is None else _pair(ct_t, dirs[k][j]))
                else:
                    r.compare("vjp_fd", call.jlabel(j), call.olabel(o), rule, ref, tol,
                              scale, note="<vjp(ct), t> vs <ct, fd(t)>",
                              transposed=None if trans[0] is None else trans)


def check_jvp_fd(r: Run) -> None:
    call, p = r.call, r.plan
    if not r.need_diff("jvp_fd", "fwd"):
        return
    dirs, fds = r.directions(), r.fd_dirs
    for j in range(len(call.diff)):
        try:
            tans = [call.jitted["jvp_leaf"](j, p.work, dirs[k][j]) for k in range(len(dirs))]
        except Exception as exc:  # noqa: BLE001
            r.add("jvp_fd", "error", call.jlabel(j), "*", hint=_diagnose.hint(exc),
                  note=_diagnose.note(exc))
            continue
        for o in range(len(call.dout)):
            rule = np.stack([np.asarray(tans[k][o]) for k in range(len(dirs))])
            ref = np.stack([fds[k][j].value[o] for k in range(len(dirs))])
            if rule.shape != ref.shape:
                r.add("jvp_fd", "fail", call.jlabel(j), call.olabel(o),
                      hint="wrong shape", note=f"tangent shape {list(rule.shape[1:])}, "
                      f"output shape {list(ref.shape[1:])}")
                continue
            err = np.stack([fds[k][j].error[o] for k in range(len(dirs))])
            scale = max(float(np.max(np.abs(ref), initial=0.0)), 1e-300)
            r.compare("jvp_fd", call.jlabel(j), call.olabel(o), rule, ref,
                      p.fd_tol(ref, err), scale, note="jvp(t) vs fd(t)")


def _small(r: Run, name: str) -> bool:
    call, p = r.call, r.plan
    n_in = sum(int(np.size(p.work[i])) for i in call.diff)
    n_out = sum(int(np.size(o)) for o in r.outs_work)
    if n_in > p.opts.jacobian_max_size or n_out > 4 * p.opts.jacobian_max_size:
        r.skip(name, f"inputs too large for a full Jacobian ({n_in} elements > "
                     f"jacobian_max_size={p.opts.jacobian_max_size})")
        return False
    if any(is_complex(p.work[i].dtype) for i in call.diff) or \
            any(is_complex(o.dtype) for o in r.outs_work):
        r.skip(name, "complex values: checked along random directions only")
        return False
    return True


def _compare_jac(r: Run, name: str, j: int, o: int, rule: np.ndarray) -> None:
    call, p = r.call, r.plan
    ref, err = r.fd_jacobian[j][0][o], r.fd_jacobian[j][1][o]
    x = p.work[call.diff[j]]
    trans = None
    if np.ndim(x) == 2 and x.shape[0] == x.shape[1] and x.shape[0] > 1:
        n = x.shape[0]
        perm = np.arange(n * n).reshape(n, n).T.ravel()
        trans = rule[:, perm]
    scale = max(float(np.max(np.abs(ref), initial=0.0)), 1e-300)
    swapped = [(call.jlabel(k), r.fd_jacobian[k][0][o],
                p.jac_tol(r.fd_jacobian[k][0][o], r.fd_jacobian[k][1][o]))
               for k in range(len(call.diff))
               if k != j and np.shape(p.work[call.diff[k]]) == np.shape(x)]
    r.compare(name, call.jlabel(j), call.olabel(o), rule, ref, p.jac_tol(ref, err),
              scale, note=f"Jacobian {list(ref.shape)} vs finite differences",
              transposed=trans, swapped=swapped, entries=True)


def check_vjp_jacobian(r: Run) -> None:
    call, p = r.call, r.plan
    if not r.need_diff("vjp_jacobian", "rev") or not _small(r, "vjp_jacobian"):
        return
    for o in range(len(call.dout)):
        out = r.outs_work[o]
        rows = []
        for e in range(int(np.size(out))):
            ct = np.zeros(np.size(out), out.dtype)
            ct[e] = 1
            rows.append([np.asarray(c) for c in call.jitted["vjp_out"](
                o, p.work, ct.reshape(np.shape(out)))])
        for j in range(len(call.diff)):
            size = int(np.size(p.work[call.diff[j]]))
            if any(np.size(r[j]) != size for r in rows):
                r.add("vjp_jacobian", "fail", call.jlabel(j), call.olabel(o),
                      hint="wrong shape")
                continue
            rule = np.stack([r[j].ravel() for r in rows]) if rows else np.zeros((0, size))
            _compare_jac(r, "vjp_jacobian", j, o, rule)


def check_jvp_jacobian(r: Run) -> None:
    call, p = r.call, r.plan
    if not r.need_diff("jvp_jacobian", "fwd") or not _small(r, "jvp_jacobian"):
        return
    for j, i in enumerate(call.diff):
        x = p.work[i]
        cols = []
        for e in range(int(np.size(x))):
            t = np.zeros(np.size(x), x.dtype)
            t[e] = 1
            cols.append([np.asarray(v).ravel() for v in call.jitted["jvp_leaf"](
                j, p.work, t.reshape(np.shape(x)))])
        for o in range(len(call.dout)):
            size = int(np.size(r.outs_work[o]))
            rule = np.stack([c[o] for c in cols], axis=1) if cols else np.zeros((size, 0))
            _compare_jac(r, "jvp_jacobian", j, o, rule)


# ------------------------------------------------------------ consistency, zeros, order
def check_consistency(r: Run) -> None:
    call, p = r.call, r.plan
    if not r.need_diff("jvp_vjp_consistency", "both"):
        return
    dirs, cts = r.directions(), r.cotangents()
    vjps = [[call.jitted["vjp_out"](o, p.work, cts[k][o]) for o in range(len(call.dout))]
            for k in range(len(dirs))]
    jvps = [[call.jitted["jvp_leaf"](j, p.work, dirs[k][j]) for j in range(len(call.diff))]
            for k in range(len(dirs))]
    for j in range(len(call.diff)):
        for o in range(len(call.dout)):
            lhs, rhs, tol, scale = [], [], [], []
            for k in range(len(dirs)):
                jt, vc, t, ct = jvps[k][j][o], vjps[k][o][j], dirs[k][j], cts[k][o]
                lhs.append(_pair(vc, t))
                rhs.append(_pair(ct, jt))
                s = _abs_pair(vc, t) + _abs_pair(ct, jt)
                scale.append(s)
                tol.append(p.xatol + p.xrtol * s + p.nondet * float(
                    np.sum(np.abs(t)) + np.sum(np.abs(ct))))
            r.compare("jvp_vjp_consistency", call.jlabel(j), call.olabel(o), lhs, rhs,
                      tol, scale, note="<vjp(ct), t> vs <ct, jvp(t)>")


def check_symbolic_zeros(r: Run) -> None:
    call, p = r.call, r.plan
    name = "symbolic_zeros"
    if not call.diff or not call.dout:
        return r.skip(name, "no floating-point inputs" if not call.diff
                      else "no floating-point outputs")
    if not (p.fwd or p.rev):
        return r.skip(name, p.fwd_reason)
    J = call.jitted
    zero_tol = p.xatol + p.nondet
    if p.fwd:
        for j in range(len(call.diff)):
            t = r.directions()[0][j]
            r.guarded(name, functools.partial(J["jvp_leaf"], j, p.work, t),
                      call.jlabel(j), "*", note="jvp with a tangent on this input only",
                      record_pass=True)
        z = [np.zeros_like(np.asarray(p.work[i])) for i in call.diff]
        outs = J["jvp_all"](p.work, z)
        for o, v in enumerate(outs):
            r.compare(name, "*", call.olabel(o), v, np.zeros_like(np.asarray(v)),
                      zero_tol, 1.0, note="jvp with all-zero tangents must be zero")
    if p.rev:
        for o in range(len(call.dout)):
            ct = r.cotangents()[0][o]
            r.guarded(name, functools.partial(J["vjp_out"], o, p.work, ct), "*",
                      call.olabel(o), note="vjp with a cotangent on this output only",
                      record_pass=True)
        z = [np.zeros_like(np.asarray(v)) for v in r.outs_work]
        cts = J["vjp_all"](p.work, z)
        for j, c in enumerate(cts):
            r.compare(name, call.jlabel(j), "*", c, np.zeros_like(np.asarray(c)),
                      zero_tol, 1.0, note="vjp with all-zero cotangents must be zero")


def check_second_order(r: Run) -> None:
    call, p = r.call, r.plan
    name = "second_order"
    enabled = p.opts.second_order
    if enabled is None:
        enabled = p.auto_second
    if not enabled:
        return r.skip(name, "not enabled (pass CheckOptions(second_order=True); automatic "
                      "for functions whose derivatives() say they have second derivatives)")
    if not r.need_diff(name, "rev"):
        return
    if any(is_complex(p.work[i].dtype) for i in call.diff) or \
            any(is_complex(o.dtype) for o in r.outs_work):
        return r.skip(name, "complex values are not supported by the Hessian check")
    weights = [r.randn(o) for o in r.outs_work]

    def s(d: list) -> Any:
        outs = call.diffout(call.merge(d, p.work))
        return sum(jnp.sum(w * o) for w, o in zip(weights, outs))

    grad = jax.jit(jax.grad(s))
    x = [p.work[i] for i in call.diff]

    def fwd_over_rev(x, t):
        return jax.jvp(jax.grad(s), (x,), (t,))[1]

    def rev_over_rev(x, t):
        return jax.grad(lambda y: sum(jnp.sum(a * b) for a, b in zip(jax.grad(s)(y), t)))(x)

    how, hvp = "jax.jvp(jax.grad(...)) (forward-over-reverse)", jax.jit(fwd_over_rev)
    try:
        hvp(x, r.directions()[0])
    except Exception:  # noqa: BLE001 - try reverse-over-reverse instead
        how, hvp = "jax.grad(jax.grad(...)) (reverse-over-reverse)", jax.jit(rev_over_rev)
    gots, refs, errs = [], [], []
    for t in r.directions():
        gots.append([np.asarray(v) for v in hvp(x, t)])

        def grad_at(h: float, t: list = t) -> list:
            return grad([(xi + h * ti).astype(xi.dtype) for xi, ti in zip(x, t)])

        d = ridders(grad_at, p.h0, p.eps_mach, p.nondet)
        refs.append(d.value)
        errs.append(d.error)
    for j in range(len(call.diff)):
        got = np.stack([g[j] for g in gots])
        ref = np.stack([one[j] for one in refs])
        err = np.stack([e[j] for e in errs])
        scale = max(float(np.max(np.abs(ref), initial=0.0)), 1e-300)
        r.compare(name, call.jlabel(j), "sum(w*out)", got, ref, p.fd_tol(ref, err),
                  scale, note=f"Hessian-vector products via {how} vs fd of the gradient")


# ------------------------------------------------------------ coverage
def check_derivatives_checked(r: Run) -> None:
    """Each mode the function has was checked against a reference by at least one
    enabled check: a rule that no check ran cannot pass."""
    call, p = r.call, r.plan
    name = "derivatives_checked"
    if not call.diff or not call.dout:
        return r.skip(name, "no floating-point inputs" if not call.diff
                      else "no floating-point outputs")
    ran = {row.name for row in r.results if row.status != "skip"}
    d = p.derivatives
    for mode, how, checks in (("forward", d.forward, FORWARD_CHECKS),
                              ("reverse", d.reverse, REVERSE_CHECKS)):
        enabled = [c for c in checks if p.opts.enabled(c)]
        if how is None:
            r.add(name, "skip", note=f"{mode} mode: the function has none")
        elif not enabled:
            r.add(name, "skip", note=f"{mode} mode ({how}): no {mode}-mode check "
                                     f"selected")
        elif ran & set(enabled):
            r.add(name, "pass", note=f"{mode} mode ({how}) checked by "
                  + ", ".join(c for c in enabled if c in ran))
        else:
            why = "; ".join(f"{row.name}: {row.note}" for row in r.results
                            if row.name in enabled and row.status == "skip")
            r.add(name, "fail", hint=f"{mode} mode never checked",
                  note=f"the function has {mode} mode ({how}), but every {mode}-mode "
                       f"check was skipped ({why})")

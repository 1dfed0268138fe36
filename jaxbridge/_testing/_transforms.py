"""The checks of `check_rules` that involve no finite differences: the function and
its rules under ``jax.jit``, ``jax.vmap`` (of the whole call, and of the rules over a
batch of cotangents or tangents alone, as ``jacrev``/``jacfwd`` use them), repeated
calls (determinism, no recompilation), a ``jax.export`` round trip, and that no call
wrote into its inputs.

Each ``check_*`` function takes the `_checker._Checker` of the run, whose set-up it
uses (``dyn``, ``diff``, ``dout``, ``jitted``, the tolerances, ``compare``/``guarded``).
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from ._fd import direction, element_scales

if TYPE_CHECKING:
    from ._checker import _Checker as Checker

#: The `jax.monitoring` event JAX records once per XLA compilation.
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_compiles = threading.local()
_listener_lock = threading.Lock()
_listening = False


def _on_duration(event: str, duration_secs: float, **kwargs: str | int) -> None:
    box = getattr(_compiles, "box", None)
    if box is not None and event == COMPILE_EVENT:
        box[0] += 1


@contextlib.contextmanager
def count_compiles() -> Iterator[list[int]]:
    """Count the XLA compilations of the calling thread inside the block (``box[0]``).

    Example:
        >>> with count_compiles() as box:
        ...     _ = jax.jit(lambda x: x * 3.0 + 1.0)(np.arange(5.0))
        >>> box[0]
        1
    """
    global _listening
    with _listener_lock:
        if not _listening:
            jax.monitoring.register_event_duration_secs_listener(_on_duration)
            _listening = True
    outer = getattr(_compiles, "box", None)
    box = [0]
    _compiles.box = box
    try:
        yield box
    finally:
        _compiles.box = outer
        if outer is not None:
            outer[0] += box[0]


#: Custom-call targets that call back into this Python process: a program with one of
#: these cannot be exported. (jaxbridge's host-call trampoline, JAX's callbacks.)
_HOST_TARGET = re.compile(r"^jaxbridge_host_call|callback", re.IGNORECASE)
_CUSTOM_CALL = re.compile(r'custom_call\s*@(?:"([^"]+)"|([\w.$-]+))')


def custom_call_targets(hlo_text: str) -> list[str]:
    """The custom-call targets a StableHLO module's text calls.

    Example:
        >>> custom_call_targets('%0 = stablehlo.custom_call @cpp.cube.cube_forward(%a)')
        ['cpp.cube.cube_forward']
    """
    return sorted({a or b for a, b in _CUSTOM_CALL.findall(hlo_text)})


def _close(c: Checker, name: str, arg: str | None, output: str | None, got: Any, want: Any,
           note: str) -> None:
    """Compare with the exact tolerances of the original dtypes (plus nondet_tol)."""
    got, want = np.asarray(got), np.asarray(want)
    if got.dtype == jax.dtypes.float0:
        return
    wide = want.astype(np.result_type(want.dtype, np.float64))
    scale = max(float(np.max(np.abs(wide), initial=0.0)), 1e-300)
    c.compare(name, arg, output, got, want,
              c.xatol0 + c.xrtol0 * scale + c.nondet, scale, note=note)


def _close_all(c: Checker, name: str, got: list, want: list, labels: list[str],
               arg: str | None, note: str, per_arg: bool = False) -> None:
    for k, (a, b) in enumerate(zip(got, want)):
        _close(c, name, labels[k] if per_arg else arg, None if per_arg else labels[k],
               a, b, note)


# ------------------------------------------------------------ jit
def check_jit(c: Checker) -> None:
    name = "jit"
    jitted = jax.jit(lambda d: c.call_dyn(d))(c.dyn)
    _close_all(c, name, jitted, c.outs, c.out_labels, None, "values: jit vs eager")
    if not c.diff or not c.dout:
        return
    if c.rev:
        cts = [c.randn(c.outs[o]) for o in c.dout]
        _close_all(c, name, jax.jit(c.vjp_all)(c.dyn, cts),
                   c.vjp_all(c.dyn, cts), c._jlabels(), None,
                   "vjp: jit vs eager", per_arg=True)
    if c.fwd:
        tans = [c.randn(c.dyn[i]) for i in c.diff]
        _close_all(c, name, jax.jit(c.jvp_all)(c.dyn, tans),
                   c.jvp_all(c.dyn, tans), c._olabels(), None,
                   "jvp: jit vs eager")


# ------------------------------------------------------------ vmap
def _perturbed(c: Checker, x: Any, size: float) -> np.ndarray:
    """`x` with each element moved by up to `size` times its magnitude (integer and
    boolean arrays are returned unchanged)."""
    xn = np.asarray(x)
    if not jnp.issubdtype(xn.dtype, jnp.inexact):
        return xn
    return (xn + size * direction(c.rng, element_scales(xn), xn.dtype)).astype(xn.dtype)


def _batch(c: Checker, which: set[int]) -> list[Any]:
    """The dynamic inputs with a leading axis: `batch_size` perturbed copies of the
    leaves of positional arguments in `which` (others are unbatched)."""
    out = []
    B = c.opts.batch_size
    for i, x in enumerate(c.dyn):
        if c.arg_of[i] not in which:
            out.append(x)
            continue
        xn = np.asarray(x)
        copies = [xn] + [_perturbed(c, x, 0.05) for _ in range(B - 1)]
        out.append(jnp.asarray(np.stack(copies).astype(xn.dtype)))
    return out


def _rule_batch(c: Checker, kind: str, dyn: list, axes: list | None, batched_seeds: bool
                ) -> tuple[list, list[np.ndarray], list[str]]:
    """The vjp (`kind` "vjp") or jvp ("jvp") under vmap vs a loop of single calls:
    inputs `dyn` mapped along `axes` (None: not mapped), with `batch_size` random
    cotangents/tangents (`batched_seeds`) or one shared. Returns (vmapped results,
    the loop's results stacked, a label per result)."""
    B = c.opts.batch_size
    if kind == "vjp":
        likes, labels = [c.outs[o] for o in c.dout], c._jlabels()
    else:
        likes, labels = [c.dyn[i] for i in c.diff], c._olabels()
    seeds = [np.stack([c.randn(x) for _ in range(B)]) if batched_seeds else c.randn(x)
             for x in likes]
    fun = c.vjp_all if kind == "vjp" else c.jvp_all
    got = jax.jit(jax.vmap(fun, in_axes=(axes, 0 if batched_seeds else None)))(dyn, seeds)

    def pick(k: int) -> tuple[list, list]:
        d = dyn if axes is None else [x[k] if a == 0 else x for x, a in zip(dyn, axes)]
        return d, [s[k] for s in seeds] if batched_seeds else seeds

    rows = [c.jitted[f"{kind}_all"](*pick(k)) for k in range(B)]
    want = [np.stack([np.asarray(r[m]) for r in rows]) for m in range(len(labels))]
    return got, want, labels


def check_vmap(c: Checker) -> None:
    name = "vmap"
    if not c.dyn:
        return c.skip(name, "no array inputs")
    B = c.opts.batch_size
    groups = [({a}, c.arg_names[a]) for a in range(c.n_args)
              if any(c.arg_of[i] == a for i in range(len(c.dyn)))]
    if len(groups) > 1:
        groups.append((set(range(c.n_args)), "*"))
    for which, label in groups:
        bdyn = _batch(c, which)
        axes = [0 if c.arg_of[i] in which else None for i in range(len(c.dyn))]
        every = label == "*"

        def vals(bdyn: list = bdyn, axes: list = axes, label: str = label) -> None:
            got = jax.jit(jax.vmap(c.call_dyn, in_axes=(axes,)))(bdyn)
            rows = [c.jitted["f"]([d[k] if a == 0 else d for d, a in zip(bdyn, axes)])
                    for k in range(B)]
            want = [np.stack([np.asarray(r[m]) for r in rows]) for m in range(len(got))]
            _close_all(c, name, got, want, c.out_labels, label,
                       f"values: vmap over {label} vs a loop")

        c.guarded(name, vals, label, None, note="vmap of the function")
        if not c.diff or not c.dout:
            continue

        if c.rev:
            def grads(bdyn: list = bdyn, axes: list = axes, label: str = label,
                      every: bool = every) -> None:
                got, want, labels = _rule_batch(c, "vjp", bdyn, axes, every)
                for j in range(len(got)):
                    _close(c, name, label, None, got[j], want[j],
                           f"vjp: cotangent of {labels[j]}, vmap over {label} vs a loop")
            c.guarded(name, grads, label, None, note="vmap of the vjp")

        if c.fwd:
            def tangents(bdyn: list = bdyn, axes: list = axes, label: str = label,
                         every: bool = every) -> None:
                got, want, labels = _rule_batch(c, "jvp", bdyn, axes, every)
                _close_all(c, name, got, want, labels, label,
                           f"jvp: vmap over {label} vs a loop")
            c.guarded(name, tangents, label, None, note="vmap of the jvp")


def check_batched_grad(c: Checker) -> None:
    """The rules under vmap over cotangents (tangents) alone, at fixed primals: how
    ``jax.jacrev`` (``jax.jacfwd``) and batched Hessian code call them."""
    name = "batched_grad"
    if not c._need_diff(name, "any"):
        return
    B = c.opts.batch_size
    if c.rev:
        def pull() -> None:
            got, want, labels = _rule_batch(c, "vjp", c.dyn, None, True)
            _close_all(c, name, got, want, labels, None,
                       f"vjp: vmap over {B} cotangents vs a loop", per_arg=True)
        c.guarded(name, pull, "*", None, note="vmap of the vjp over cotangents")
    if c.fwd:
        def push() -> None:
            got, want, labels = _rule_batch(c, "jvp", c.dyn, None, True)
            _close_all(c, name, got, want, labels, "*",
                       f"jvp: vmap over {B} tangents vs a loop")
        c.guarded(name, push, "*", None, note="vmap of the jvp over tangents")


# ------------------------------------------------------------ repeated calls
def _calls(c: Checker) -> list[tuple[str, Callable[[list], Any]]]:
    """(what, call at given dynamic inputs) for the forward and each available rule."""
    calls: list[tuple[str, Callable[[list], Any]]] = [("values", c.jitted["f"])]
    if c.diff and c.dout:
        if c.rev:
            cts = [c.randn(c.outs[o]) for o in c.dout]
            calls.append(("vjp", lambda d: c.jitted["vjp_all"](d, cts)))
        if c.fwd:
            tans = [c.randn(c.dyn[i]) for i in c.diff]
            calls.append(("jvp", lambda d: c.jitted["jvp_all"](d, tans)))
    return calls


def check_deterministic(c: Checker) -> None:
    """Each call twice with identical inputs: the results may differ by at most
    ``nondet_tol`` (default 0: exactly equal), as torch.autograd.gradcheck checks."""
    name = "deterministic"
    tol = c.nondet
    for what, call in _calls(c):
        first = [np.asarray(v) for v in jax.tree_util.tree_leaves(call(c.dyn))]
        again = [np.asarray(v) for v in jax.tree_util.tree_leaves(call(c.dyn))]
        diffs = [float(np.max(np.abs(a.astype(np.result_type(a.dtype, np.float64))
                                     - b.astype(np.result_type(b.dtype, np.float64))),
                              initial=0.0))
                 for a, b in zip(first, again) if a.dtype != jax.dtypes.float0]
        worst = max(diffs, default=0.0)
        ok = worst <= tol or (np.isnan(worst) and all(
            np.array_equal(a, b, equal_nan=True) for a, b in zip(first, again)))
        c.add(name, "pass" if ok else "fail", None, None, abs_err=worst, rel_err=None,
              tol=tol, hint="" if ok else (
                  "nondeterministic: the same call gave different results (if "
                  "intended, set CheckOptions(nondet_tol=...))"),
              note=f"{what}: the same call twice")


def check_no_retrace(c: Checker) -> None:
    """A second eager call (function, vjp, jvp) with new values of the same shapes
    and dtypes must not compile anything: a recompilation per call means a static
    parameter that changes between calls (e.g. hashed by identity)."""
    name = "no_retrace"
    with count_compiles() as canary:
        jax.jit(lambda x: x * 3.0 + 1.0)(np.arange(3.0))
    if canary[0] == 0:
        return c.skip(name, f"this JAX reports no {COMPILE_EVENT!r} events")
    other = [jnp.asarray(_perturbed(c, x, 0.01)) for x in c.dyn]
    counts = {}
    for round_, dyn in (("first", c.dyn), ("second", other)):
        for what, call in _eager_calls(c, dyn):
            with count_compiles() as box:
                call()
            if round_ == "second":
                counts[what] = box[0]
    bad = {k: v for k, v in counts.items() if v}
    if not bad:
        c.add(name, "pass", None, None,
              note=f"second eager {', '.join(counts)} with equal shapes: nothing compiled")
    else:
        c.add(name, "fail", None, None,
              hint="recompiles on every call (a static parameter hashed by identity, or "
                   "a jax.jit created per call?)",
              note="second eager call with equal shapes compiled " + ", ".join(
                  f"{what}: {n} program{'s' * (n > 1)}" for what, n in bad.items()))


def _eager_calls(c: Checker, dyn: list) -> list[tuple[str, Callable[[], Any]]]:
    calls: list[tuple[str, Callable[[], Any]]] = [("call", lambda: c.call_dyn(dyn))]
    if c.diff and c.dout:
        if c.rev:
            cts = [np.ones(c.outs[o].shape, c.outs[o].dtype) for o in c.dout]
            calls.append(("vjp", lambda: c.vjp_all(dyn, cts)))
        if c.fwd:
            tans = [np.ones(c.dyn[i].shape, c.dyn[i].dtype) for i in c.diff]
            calls.append(("jvp", lambda: c.jvp_all(dyn, tans)))
    return calls


# ------------------------------------------------------------ export
def check_export(c: Checker) -> None:
    """``jax.export`` round trip: serialize the jitted call (with its VJP), load it
    back, and compare values and gradients with the original."""
    name = "export"
    if c.foreign and c.opts.export is None:
        return c.skip(name, "not enabled: calls back into Python (host functions "
                            "cannot be exported)")
    differentiable = c.rev and bool(c.diff) and bool(c.dout)
    text = jax.jit(c.call_dyn).lower(c.dyn).as_text()
    if differentiable:  # the serialized VJP calls the adjoint kernels too
        cts = [c.randn(c.outs[o]) for o in c.dout]
        text += jax.jit(c.vjp_all).lower(c.dyn, cts).as_text()
    targets = custom_call_targets(text)
    hosts = [t for t in targets if _HOST_TARGET.search(t)]
    enabled = c.opts.export
    if enabled is None:
        enabled = bool(targets) and not hosts
    if not enabled:
        why = ("calls back into Python (host functions cannot be exported)" if hosts
               else "no FFI kernel in the program")
        return c.skip(name, f"not enabled: {why} (force with CheckOptions(export=True))")
    checks = [jax.export.DisabledSafetyCheck.custom_call(t) for t in targets]
    exported = jax.export.export(jax.jit(c.call_dyn), disabled_checks=checks)(c.dyn)
    blob = exported.serialize(vjp_order=1 if differentiable else 0)
    back = jax.export.deserialize(blob)
    _close_all(c, name, back.call(c.dyn), c.outs, c.out_labels, None,
               "values: deserialized vs original")
    if differentiable:
        def vjp_of(call: Callable[[list], Any]) -> list[Any]:
            def g(d):
                outs = call(c._merge(d, c.dyn))
                return [outs[o] for o in c.dout]
            _, pull = jax.vjp(g, [c.dyn[i] for i in c.diff])
            return pull(cts)[0]

        _close_all(c, name, vjp_of(back.call), vjp_of(c.call_dyn), c._jlabels(),
                   None, "vjp: deserialized vs original", per_arg=True)


# ------------------------------------------------------------ inputs
def check_inputs_unchanged(c: Checker) -> None:
    """After every other check, each input still holds what it held before: no
    kernel or host function wrote into a buffer it was only lent."""
    name = "inputs_unchanged"
    if not c.dyn:
        return c.skip(name, "no array inputs")
    for x, before, label in zip(c.dyn, c.snapshot, c.labels):
        now = np.asarray(x)
        same = np.array_equal(now, before, equal_nan=jnp.issubdtype(now.dtype, jnp.inexact))
        c.add(name, "pass" if same else "fail", label, None,
              hint="" if same else "an input was overwritten (a kernel writing into an "
                                   "operand without declaring it in aliases=?)",
              note="input after every call vs before")

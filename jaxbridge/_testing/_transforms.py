"""The checks of `check_rules` that involve no finite differences: the function and
its rules under ``jax.jit``, ``jax.vmap`` (of the whole call, and of the rules over a
batch of cotangents or tangents alone, as ``jacrev``/``jacfwd`` use them), repeated
calls (determinism, no recompilation), a ``jax.export`` round trip, and that no call
wrote into its inputs.

Each ``check_*`` function takes the `_run.Run` of the run: its plan (the flat call
``r.call``: ``dyn``, ``diff``, ``dout``, ``jitted``; the tolerances ``r.plan``) and its
recording (``compare``, ``guarded``, ``skip``).
"""

from __future__ import annotations

import contextlib
import importlib
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._fd import direction, element_scales
from ._run import Run

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


def _close(r: Run, name: str, arg: str | None, output: str | None, got: Any, want: Any,
           note: str) -> None:
    """Compare with the exact tolerances of the original dtypes (plus nondet_tol)."""
    got, want = np.asarray(got), np.asarray(want)
    if got.dtype == jax.dtypes.float0:
        return
    wide = want.astype(np.result_type(want.dtype, np.float64))
    scale = max(float(np.max(np.abs(wide), initial=0.0)), 1e-300)
    r.compare(name, arg, output, got, want,
              r.plan.xatol0 + r.plan.xrtol0 * scale + r.plan.nondet, scale, note=note)


def _close_all(r: Run, name: str, got: Sequence[Any], want: Sequence[Any], labels: Sequence[str],
               arg: str | None, note: str, per_arg: bool = False) -> None:
    for k, (a, b) in enumerate(zip(got, want)):
        _close(r, name, labels[k] if per_arg else arg, None if per_arg else labels[k],
               a, b, note)


# ------------------------------------------------------------ jit
def check_jit(r: Run) -> None:
    name = "jit"
    jitted = jax.jit(lambda d: r.call.call_dyn(d))(r.call.dyn)
    _close_all(r, name, jitted, r.call.outs, r.call.out_labels, None, "values: jit vs eager")
    if not r.call.diff or not r.call.dout:
        return
    if r.plan.rev:
        cts = [r.randn(r.call.outs[o]) for o in r.call.dout]
        _close_all(r, name, jax.jit(r.call.vjp_all)(r.call.dyn, cts),
                   r.call.vjp_all(r.call.dyn, cts), r.call.jlabels(), None,
                   "vjp: jit vs eager", per_arg=True)
    if r.plan.fwd:
        tans = [r.randn(r.call.dyn[i]) for i in r.call.diff]
        _close_all(r, name, jax.jit(r.call.jvp_all)(r.call.dyn, tans),
                   r.call.jvp_all(r.call.dyn, tans), r.call.olabels(), None,
                   "jvp: jit vs eager")


# ------------------------------------------------------------ differentiated values
def check_primal_values(r: Run) -> None:
    """The outputs of a differentiated call (``jax.vjp``'s and ``jax.jvp``'s primal
    outputs) are the plain call's: a kernel's forward that also returns residuals, or
    a ``custom_vjp``'s fwd, must compute what the function itself does."""
    name = "primal_values"
    if not r.need_diff(name, "any"):
        return
    dyn, diff = r.call.dyn, r.call.diff

    def outputs(d: Sequence[Any]) -> list[Any]:
        return r.call.call_dyn(r.call.merge(d, dyn))

    primals = [dyn[i] for i in diff]
    if r.plan.rev:
        got, _ = jax.vjp(outputs, primals)
        _close_all(r, name, got, r.call.outs, r.call.out_labels, None,
                   "values: jax.vjp's outputs vs the call")
    if r.plan.fwd:
        got, _ = jax.jvp(outputs, (primals,), ([r.randn(x) for x in primals],))
        _close_all(r, name, got, r.call.outs, r.call.out_labels, None,
                   "values: jax.jvp's outputs vs the call")


# ------------------------------------------------------------ vmap
def _perturbed(r: Run, x: Any, size: float) -> np.ndarray:
    """`x` with each element moved by up to `size` times its magnitude (integer and
    boolean arrays are returned unchanged)."""
    xn = np.asarray(x)
    if not jnp.issubdtype(xn.dtype, jnp.inexact):
        return xn
    return (xn + size * direction(r.rng, element_scales(xn), xn.dtype)).astype(xn.dtype)


def _batch(r: Run, which: set[int]) -> list[Any]:
    """The dynamic inputs with a leading axis: `batch_size` perturbed copies of the
    leaves of positional arguments in `which` (others are unbatched)."""
    out = []
    B = r.plan.opts.batch_size
    for i, x in enumerate(r.call.dyn):
        if r.call.arg_of[i] not in which:
            out.append(x)
            continue
        xn = np.asarray(x)
        copies = [xn] + [_perturbed(r, x, 0.05) for _ in range(B - 1)]
        out.append(jnp.asarray(np.stack(copies).astype(xn.dtype)))
    return out


def _rule_batch(r: Run, kind: str, dyn: list, axes: list | None, batched_seeds: bool
                ) -> tuple[list, list[np.ndarray], list[str]]:
    """The vjp (`kind` "vjp") or jvp ("jvp") under vmap vs a loop of single calls:
    inputs `dyn` mapped along `axes` (None: not mapped), with `batch_size` random
    cotangents/tangents (`batched_seeds`) or one shared. Returns (vmapped results,
    the loop's results stacked, a label per result)."""
    B = r.plan.opts.batch_size
    if kind == "vjp":
        likes, labels = [r.call.outs[o] for o in r.call.dout], r.call.jlabels()
    else:
        likes, labels = [r.call.dyn[i] for i in r.call.diff], r.call.olabels()
    seeds = [np.stack([r.randn(x) for _ in range(B)]) if batched_seeds else r.randn(x)
             for x in likes]
    fun = r.call.vjp_all if kind == "vjp" else r.call.jvp_all
    got = jax.jit(jax.vmap(fun, in_axes=(axes, 0 if batched_seeds else None)))(dyn, seeds)

    def pick(k: int) -> tuple[list, list]:
        d = dyn if axes is None else [x[k] if a == 0 else x for x, a in zip(dyn, axes)]
        return d, [s[k] for s in seeds] if batched_seeds else seeds

    rows = [r.call.jitted[f"{kind}_all"](*pick(k)) for k in range(B)]
    want = [np.stack([np.asarray(r[m]) for r in rows]) for m in range(len(labels))]
    return got, want, labels


def check_vmap(r: Run) -> None:
    name = "vmap"
    if not r.call.dyn:
        return r.skip(name, "no array inputs")
    B = r.plan.opts.batch_size
    groups = [({a}, r.call.arg_names[a]) for a in range(r.call.n_args)
              if any(r.call.arg_of[i] == a for i in range(len(r.call.dyn)))]
    if len(groups) > 1:
        groups.append((set(range(r.call.n_args)), "*"))
    for which, label in groups:
        bdyn = _batch(r, which)
        axes = [0 if r.call.arg_of[i] in which else None for i in range(len(r.call.dyn))]
        every = label == "*"

        def vals(bdyn: list = bdyn, axes: list = axes, label: str = label) -> None:
            got = jax.jit(jax.vmap(r.call.call_dyn, in_axes=(axes,)))(bdyn)
            rows = [r.call.jitted["f"]([d[k] if a == 0 else d for d, a in zip(bdyn, axes)])
                    for k in range(B)]
            want = [np.stack([np.asarray(r[m]) for r in rows]) for m in range(len(got))]
            _close_all(r, name, got, want, r.call.out_labels, label,
                       f"values: vmap over {label} vs a loop")

        r.guarded(name, vals, label, None, note="vmap of the function")
        if not r.call.diff or not r.call.dout:
            continue

        if r.plan.rev:
            def grads(bdyn: list = bdyn, axes: list = axes, label: str = label,
                      every: bool = every) -> None:
                got, want, labels = _rule_batch(r, "vjp", bdyn, axes, every)
                for j in range(len(got)):
                    _close(r, name, label, None, got[j], want[j],
                           f"vjp: cotangent of {labels[j]}, vmap over {label} vs a loop")
            r.guarded(name, grads, label, None, note="vmap of the vjp")

        if r.plan.fwd:
            def tangents(bdyn: list = bdyn, axes: list = axes, label: str = label,
                         every: bool = every) -> None:
                got, want, labels = _rule_batch(r, "jvp", bdyn, axes, every)
                _close_all(r, name, got, want, labels, label,
                           f"jvp: vmap over {label} vs a loop")
            r.guarded(name, tangents, label, None, note="vmap of the jvp")


def check_batched_grad(r: Run) -> None:
    """The rules under vmap over cotangents (tangents) alone, at fixed primals: how
    ``jax.jacrev`` (``jax.jacfwd``) and batched Hessian code call them."""
    name = "batched_grad"
    if not r.need_diff(name, "any"):
        return
    B = r.plan.opts.batch_size
    if r.plan.rev:
        def pull() -> None:
            got, want, labels = _rule_batch(r, "vjp", r.call.dyn, None, True)
            _close_all(r, name, got, want, labels, None,
                       f"vjp: vmap over {B} cotangents vs a loop", per_arg=True)
        r.guarded(name, pull, "*", None, note="vmap of the vjp over cotangents")
    if r.plan.fwd:
        def push() -> None:
            got, want, labels = _rule_batch(r, "jvp", r.call.dyn, None, True)
            _close_all(r, name, got, want, labels, "*",
                       f"jvp: vmap over {B} tangents vs a loop")
        r.guarded(name, push, "*", None, note="vmap of the jvp over tangents")


# ------------------------------------------------------------ repeated calls
def _calls(r: Run) -> list[tuple[str, Callable[[list], Any]]]:
    """(what, call at given dynamic inputs) for the forward and each available rule."""
    calls: list[tuple[str, Callable[[list], Any]]] = [("values", r.call.jitted["f"])]
    if r.call.diff and r.call.dout:
        if r.plan.rev:
            cts = [r.randn(r.call.outs[o]) for o in r.call.dout]
            calls.append(("vjp", lambda d: r.call.jitted["vjp_all"](d, cts)))
        if r.plan.fwd:
            tans = [r.randn(r.call.dyn[i]) for i in r.call.diff]
            calls.append(("jvp", lambda d: r.call.jitted["jvp_all"](d, tans)))
    return calls


def check_deterministic(r: Run) -> None:
    """Each call twice with identical inputs: the results may differ by at most
    ``nondet_tol`` (default 0: exactly equal), as torch.autograd.gradcheck checks."""
    name = "deterministic"
    tol = r.plan.nondet
    for what, call in _calls(r):
        first = [np.asarray(v) for v in jax.tree_util.tree_leaves(call(r.call.dyn))]
        again = [np.asarray(v) for v in jax.tree_util.tree_leaves(call(r.call.dyn))]
        diffs = [float(np.max(np.abs(a.astype(np.result_type(a.dtype, np.float64))
                                     - b.astype(np.result_type(b.dtype, np.float64))),
                              initial=0.0))
                 for a, b in zip(first, again) if a.dtype != jax.dtypes.float0]
        worst = max(diffs, default=0.0)
        ok = worst <= tol or (np.isnan(worst) and all(
            np.array_equal(a, b, equal_nan=True) for a, b in zip(first, again)))
        r.add(name, "pass" if ok else "fail", None, None, abs_err=worst, rel_err=None,
              tol=tol, hint="" if ok else (
                  "nondeterministic: the same call gave different results (if "
                  "intended, set CheckOptions(nondet_tol=...))"),
              note=f"{what}: the same call twice")


def check_no_retrace(r: Run) -> None:
    """A second eager call (function, vjp, jvp) with new values of the same shapes
    and dtypes must not compile anything: a recompilation per call means a static
    parameter that changes between calls (e.g. hashed by identity)."""
    name = "no_retrace"
    with count_compiles() as canary:
        jax.jit(lambda x: x * 3.0 + 1.0)(np.arange(3.0))
    if canary[0] == 0:
        return r.skip(name, f"this JAX reports no {COMPILE_EVENT!r} events")
    other = [jnp.asarray(_perturbed(r, x, 0.01)) for x in r.call.dyn]
    counts = {}
    for round_, dyn in (("first", r.call.dyn), ("second", other)):
        for what, call in _eager_calls(r, dyn):
            with count_compiles() as box:
                call()
            if round_ == "second":
                counts[what] = box[0]
    bad = {k: v for k, v in counts.items() if v}
    if not bad:
        r.add(name, "pass", None, None,
              note=f"second eager {', '.join(counts)} with equal shapes: nothing compiled")
    else:
        r.add(name, "fail", None, None,
              hint="recompiles on every call (a static parameter hashed by identity, or "
                   "a jax.jit created per call?)",
              note="second eager call with equal shapes compiled " + ", ".join(
                  f"{what}: {n} program{'s' * (n > 1)}" for what, n in bad.items()))


def _eager_calls(r: Run, dyn: list) -> list[tuple[str, Callable[[], Any]]]:
    calls: list[tuple[str, Callable[[], Any]]] = [("call", lambda: r.call.call_dyn(dyn))]
    if r.call.diff and r.call.dout:
        if r.plan.rev:
            cts = [np.ones(r.call.outs[o].shape, r.call.outs[o].dtype) for o in r.call.dout]
            calls.append(("vjp", lambda: r.call.vjp_all(dyn, cts)))
        if r.plan.fwd:
            tans = [np.ones(r.call.dyn[i].shape, r.call.dyn[i].dtype) for i in r.call.diff]
            calls.append(("jvp", lambda: r.call.jvp_all(dyn, tans)))
    return calls


# ------------------------------------------------------------ export
def check_export(r: Run) -> None:
    """``jax.export`` round trip: serialize the jitted call (with its VJP), load it
    back, and compare values and gradients with the original."""
    name = "export"
    if r.plan.foreign and r.plan.opts.export is None:
        return r.skip(name, "not enabled: calls back into Python (host functions "
                            "cannot be exported)")
    differentiable = r.plan.rev and bool(r.call.diff) and bool(r.call.dout)
    text = jax.jit(r.call.call_dyn).lower(r.call.dyn).as_text()
    if differentiable:  # the serialized VJP calls the VJP kernels too
        cts = [r.randn(r.call.outs[o]) for o in r.call.dout]
        text += jax.jit(r.call.vjp_all).lower(r.call.dyn, cts).as_text()
    targets = custom_call_targets(text)
    hosts = [t for t in targets if _HOST_TARGET.search(t)]
    enabled = r.plan.opts.export
    if enabled is None:
        enabled = bool(targets) and not hosts
    if not enabled:
        why = ("calls back into Python (host functions cannot be exported)" if hosts
               else "no FFI kernel in the program")
        return r.skip(name, f"not enabled: {why} (force with CheckOptions(export=True))")
    try:  # a dependency of jaxbridge's, for this; in case it is gone
        importlib.import_module("flatbuffers")
    except ImportError:
        return r.skip(name, "not run: jax.export's serialization needs the flatbuffers "
                            "package, which is not installed (pip install flatbuffers)")
    checks = [jax.export.DisabledSafetyCheck.custom_call(t) for t in targets]
    # For the platform the call runs on: jax.export's default is the default backend,
    # which is the GPU on a GPU machine even for arrays on the CPU (a CPU-only kernel).
    on_cpu = bool(r.call.dyn) and all(
        d.platform == "cpu" for d in jax.device_put(r.call.dyn[0]).devices())
    exported = jax.export.export(jax.jit(r.call.call_dyn), disabled_checks=checks,
                                 platforms=("cpu",) if on_cpu else None)(r.call.dyn)
    blob = exported.serialize(vjp_order=1 if differentiable else 0)
    back = jax.export.deserialize(blob)
    _close_all(r, name, back.call(r.call.dyn), r.call.outs, r.call.out_labels, None,
               "values: deserialized vs original")
    if differentiable:
        def vjp_of(call: Callable[[list], Any]) -> list[Any]:
            def g(d):
                outs = call(r.call.merge(d, r.call.dyn))
                return [outs[o] for o in r.call.dout]
            _, pull = jax.vjp(g, [r.call.dyn[i] for i in r.call.diff])
            return pull(cts)[0]

        _close_all(r, name, vjp_of(back.call), vjp_of(r.call.call_dyn), r.call.jlabels(),
                   None, "vjp: deserialized vs original", per_arg=True)


# ------------------------------------------------------------ inputs
def check_inputs_unchanged(r: Run) -> None:
    """After every other check, each input still holds what it held before: no
    kernel or host function wrote into a buffer it was only lent."""
    name = "inputs_unchanged"
    if not r.call.dyn:
        return r.skip(name, "no array inputs")
    for x, before, label in zip(r.call.dyn, r.call.snapshot, r.call.labels):
        now = np.asarray(x)
        same = np.array_equal(now, before, equal_nan=jnp.issubdtype(now.dtype, jnp.inexact))
        r.add(name, "pass" if same else "fail", label, None,
              hint="" if same else "an input was overwritten (a kernel writing into an "
                                   "operand without declaring it in aliases=?)",
              note="input after every call vs before")

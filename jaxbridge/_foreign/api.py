"""`jaxbridge.foreign`: a NumPy/SciPy function becomes a differentiable JAX function."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, Literal, TypeVar, overload

import jax
import numpy as np

from .._core.arrays import as_struct, is_array_leaf
from .._core.capabilities import Derivatives
from .._core.checks import check_alias_types, check_aliases_arg, check_batch_dims, is_differentiable
from .._core.jaxapi import aval_of
from .._core.pair import VMAP_CHOICES, make_pair
from .definition import CallInputs, CallOutputs, Definition, Rule
from .hostcall import BACKENDS, ON_MESH
from .signature import CallSignature

__all__ = ["ForeignFunction", "foreign", "custom_gradient", "foreign_pair"]

RULE_KINDS = ("numpy", "jax")
F = TypeVar("F", bound=Callable[..., Any])

foreign_pair = make_pair("foreign_call")


def callable_name(fun: Any) -> str:
    """A readable name for any callable: functions, partials, callable instances."""
    name = getattr(fun, "__name__", None)
    if isinstance(name, str):
        return name
    if isinstance(fun, functools.partial):
        return f"partial({callable_name(fun.func)})"
    return type(fun).__name__


class ForeignFunction:
    """A host (NumPy/SciPy) function callable from JAX, made by :func:`foreign`.

    Call it like the wrapped function, with JAX or NumPy arrays (pytrees of them) as
    positional arguments and static keyword arguments; it works under `jit`, `vmap`,
    `grad`, `jvp`, `lax.scan` and the rest, as far as its rules allow. Register rules
    with the decorators `defvjp` (VJP rule), `defjvp` (JVP rule) and, for functions
    declared ``linear=True``, `deftranspose`. Registering a rule makes a new immutable
    snapshot (`definition`): calls traced before keep the rules they were traced with.

    Attributes:
      fun: the wrapped callable.
      result: the declared result (a pytree of ``ShapeDtypeStruct`` or a function).
      vmap: ``"loop"`` or ``"vectorized"``.
      backend: ``"auto"``, ``"native"`` or ``"pure_callback"``.
      vjp_rule: the registered VJP rule (or None).
      jvp_rule: the registered JVP rule (or None).
      transpose_rule: the registered transpose rule (or None).

    Example:
        >>> import jax, jax.numpy as jnp, numpy as np, jaxbridge as jb
        >>> f = jb.foreign(lambda x: x)(np.tanh)
        >>> f
        <jaxbridge.foreign 'tanh': vjp=-, jvp=-, vmap=loop>
        >>> _ = f.defvjp(lambda primals, y, ct: (ct * (1 - y * y),))
        >>> print(f"{float(jax.grad(f)(jnp.float32(0.5))):.4f}")
        0.7864
    """

    def __init__(self, fun: Callable[..., Any], result: Any, *, residuals: Any = None,
                 vmap: Literal["loop", "vectorized"] = "loop",
                 backend: Literal["auto", "native", "pure_callback"] = "auto",
                 batch_dims: int = 0, on_mesh: Literal["error", "replicate"] = "error",
                 out: bool = False, linear: bool = False,
                 cast: bool = False, aliases: dict | None = None):
        where = "jaxbridge.foreign"
        if not callable(fun):
            raise TypeError(f"{where}: expected a function to wrap, got {fun!r}")
        _check_choice(where, "vmap", vmap, VMAP_CHOICES)
        _check_choice(where, "backend", backend, BACKENDS)
        _check_choice(where, "on_mesh", on_mesh, ON_MESH)
        if not isinstance(batch_dims, int) or isinstance(batch_dims, bool) or batch_dims < 0:
            raise ValueError(f"{where}: batch_dims must be an int >= 0, got {batch_dims!r}")
        for flag, value in (("out", out), ("linear", linear), ("cast", cast)):
            if not isinstance(value, bool):
                raise TypeError(f"{where}: {flag} must be True or False, got {value!r}")
        if linear and residuals is not None:
            raise ValueError(f"{where}: a linear function has no residuals (its derivatives "
                             f"do not depend on its inputs); drop residuals= or linear=True")
        try:
            functools.update_wrapper(self, fun)
        except AttributeError:  # pragma: no cover - exotic callables
            pass
        self.__name__ = callable_name(fun)
        self.__qualname__ = getattr(fun, "__qualname__", self.__name__)
        self._definition = Definition(
            fun=fun, name=self.__name__, result=result, residuals=residuals, vmap=vmap,
            backend=backend, batch_dims=batch_dims, on_mesh=on_mesh, out=out,
            linear=linear, cast=cast, aliases=_forward_aliases(self.__name__, aliases))

    # ---- what it is
    @property
    def definition(self) -> Definition:
        """The current immutable snapshot (function, rules and options)."""
        return self._definition

    fun = property(lambda self: self._definition.fun)
    result = property(lambda self: self._definition.result)
    vmap = property(lambda self: self._definition.vmap)
    backend = property(lambda self: self._definition.backend)
    vjp_rule = property(lambda self: self._definition.vjp)
    jvp_rule = property(lambda self: self._definition.jvp)
    transpose_rule = property(lambda self: self._definition.transpose)

    def derivatives(self) -> Derivatives:
        """Which derivatives this function has and what computes them (asked by
        `jaxbridge.testing.check_rules`, which plans its checks from the answer).

        Example:
            >>> import numpy as np, jaxbridge as jb
            >>> f = jb.foreign(lambda x: x)(np.sin)
            >>> _ = f.defvjp(lambda primals, y, ct: (np.cos(primals[0]) * ct,))
            >>> f.derivatives().how
            'forward mode: none; reverse mode: defvjp rule (numpy); second order: no'
        """
        d = self._definition

        def words(rule: Rule, name: str) -> str:
            return getattr(rule.fun, "derivative_name", None) or f"{name} rule ({rule.kind})"

        if d.linear:
            if d.transpose is None:
                return Derivatives(forward="the function itself (linear=True)",
                                   missing=f"define @{self.__name__}.deftranspose for "
                                           f"reverse mode")
            return Derivatives(forward="the function itself (linear=True)",
                               reverse=words(d.transpose, "deftranspose"), second_order=True)
        forward = None if d.jvp is None else words(d.jvp, "defjvp")
        reverse = None if d.vjp is None else words(d.vjp, "defvjp")
        if reverse is None and d.jvp is not None and d.jvp.kind == "jax":
            reverse = "JAX transposes the defjvp rule (kind='jax')"
        rules = [r for r in (d.vjp, d.jvp) if r is not None]
        missing = "; ".join(
            [f"define @{self.__name__}.defjvp for forward mode"] * (forward is None)
            + [f"define @{self.__name__}.defvjp (or a defjvp rule with kind='jax') for "
               f"reverse mode"] * (reverse is None))
        return Derivatives(forward=forward, reverse=reverse, missing=missing,
                           second_order=bool(rules) and all(r.kind == "jax" for r in rules))

    def __repr__(self) -> str:
        d = self._definition

        def show(rule: Rule | None) -> str:
            return "-" if rule is None else rule.kind

        rules = (f"transpose={show(d.transpose)}, linear" if d.linear
                 else f"vjp={show(d.vjp)}, jvp={show(d.jvp)}")
        return f"<jaxbridge.foreign {self.__name__!r}: {rules}, vmap={d.vmap}>"

    def __reduce__(self) -> Any:
        module = getattr(self, "__module__", None)
        qualname = self.__qualname__
        import sys
        found: Any = sys.modules.get(module) if module else None
        for part in qualname.split(".") if found is not None else ():
            found = getattr(found, part, None)
        if found is not self:
            raise TypeError(
                f"jaxbridge: foreign function {self.__name__!r} cannot be pickled: like a "
                f"Python function, a foreign function is pickled by reference (module and "
                f"name), so it must be defined at module level under its own name "
                f"({module}.{qualname} is not this object). Define it at module level, or "
                f"send the inputs and rebuild the function where it is needed.")
        return qualname

    # ---- rules
    def _set_rule(self, which: str, rule: Callable | None, kind: str, out: bool,
                  wanted: bool = False) -> Any:
        where = f"jaxbridge: {self.__name__}.def{which}"
        _check_choice(where, "kind", kind, RULE_KINDS)
        if wanted is not True and wanted is not False:
            raise TypeError(f"{where}: wanted must be True or False, got {wanted!r}")
        if wanted and out:
            raise ValueError(f"{where}: wanted=True with out=True: `out=` already holds None "
                             f"where a cotangent is not used")
        if out and kind == "jax":
            raise ValueError(f"{where}: out=True (write results in place) is for host rules; "
                             f"a kind='jax' rule returns its results")
        if which in ("vjp", "jvp") and self._definition.linear:
            raise TypeError(f"{where}: {self.__name__!r} is declared linear=True: its JVP "
                            f"is the function itself; give its transpose with "
                            f"@{self.__name__}.deftranspose")
        if which == "transpose" and not self._definition.linear:
            raise TypeError(f"{where}: a transpose rule is for functions declared "
                            f"jb.foreign(..., linear=True); use defvjp for this one")

        def register(fun: F) -> F:
            if not callable(fun):
                raise TypeError(f"{where} expects a function, got {fun!r}")
            # A new snapshot: calls traced before keep the rules they were traced with.
            new = Rule(fun, kind, out=out, wanted=wanted)
            d = self._definition
            self._definition = (dataclasses.replace(d, vjp=new) if which == "vjp" else
                                dataclasses.replace(d, jvp=new) if which == "jvp" else
                                dataclasses.replace(d, transpose=new))
            return fun

        return register if rule is None else register(rule)

    @overload
    def defvjp(self, rule: F, *, kind: Literal["numpy", "jax"] = "numpy",
               out: bool = False, wanted: bool = False) -> F: ...
    @overload
    def defvjp(self, rule: None = None, *, kind: Literal["numpy", "jax"] = "numpy",
               out: bool = False, wanted: bool = False) -> Callable[[F], F]: ...

    def defvjp(self, rule=None, *, kind="numpy", out=False, wanted=False):
        """Register the VJP rule: `rule(primals, y, ct, [res,] **static) -> cts`.

        `primals` is the tuple of positional arguments, `y` the function's output, `ct`
        the output cotangent (zeros where unused; None for integer outputs). Return one
        cotangent per positional argument, in its structure; None means zero.
        `kind="numpy"` (default) runs the rule on the host with NumPy arrays;
        `kind="jax"` traces it, so it can be differentiated again. With `out=True` the
        rule writes into `out=` (one entry per positional argument, None where no
        cotangent is needed) and returns None. With `wanted=True` the rule is also
        given ``wanted=``: per positional argument, its pytree of bools, False where
        the cotangent is not used (an argument `grad` does not differentiate); the
        rule may return None there and skip that work (JAX's ``symbolic_zeros``).

        Example:
            >>> import jax, jax.numpy as jnp, numpy as np, jaxbridge as jb
            >>> f = jb.foreign(lambda x: x)(np.sin)
            >>> @f.defvjp
            ... def f_vjp(primals, y, ct):
            ...     (x,) = primals
            ...     return (np.cos(x) * ct,)
            >>> print(f"{float(jax.grad(f)(jnp.float32(0.0))):.3f}")
            1.000
        """
        return self._set_rule("vjp", rule, kind, out, wanted)

    @overload
    def defjvp(self, rule: F, *, kind: Literal["numpy", "jax"] = "numpy",
               out: bool = False) -> F: ...
    @overload
    def defjvp(self, rule: None = None, *, kind: Literal["numpy", "jax"] = "numpy",
               out: bool = False) -> Callable[[F], F]: ...

    def defjvp(self, rule=None, *, kind="numpy", out=False):
        """Register the JVP rule: `rule(primals, y, tangents, [res,] **static)`.

        `tangents` has one entry per positional argument; an entry (or a leaf inside
        it) is None where the tangent is a symbolic zero. Return the output tangent
        in the output's structure (None means zero). The rule must be linear in the
        tangents. `kind` and `out` as in :meth:`defvjp` (`out=` has the output's
        structure, None at integer outputs).

        Example:
            >>> import jax, jax.numpy as jnp, numpy as np, jaxbridge as jb
            >>> f = jb.foreign(lambda x: x)(np.sin)
            >>> @f.defjvp
            ... def f_jvp(primals, y, tangents):
            ...     (x,), (dx,) = primals, tangents
            ...     return np.cos(x) * dx
            >>> _, dy = jax.jvp(f, (jnp.float32(0.0),), (jnp.float32(2.0),))
            >>> print(f"{float(dy):.3f}")
            2.000
        """
        return self._set_rule("jvp", rule, kind, out)

    @overload
    def deftranspose(self, rule: F, *, kind: Literal["numpy", "jax"] = "numpy",
                     out: bool = False) -> F: ...
    @overload
    def deftranspose(self, rule: None = None, *, kind: Literal["numpy", "jax"] = "numpy",
                     out: bool = False) -> Callable[[F], F]: ...

    def deftranspose(self, rule=None, *, kind="numpy", out=False):
        """Register the transpose of a linear function: `rule(ct, **static) -> cts`.

        For functions declared ``jb.foreign(..., linear=True)``. `ct` has the output's
        structure; return one cotangent per positional argument. The JVP of a linear
        function is the function itself and its VJP is this transpose; both are
        linear foreign functions again, so derivatives of every order (grad, jacfwd,
        hessian, ...) work with NumPy code alone.

        Example:
            >>> import jax, jax.numpy as jnp, numpy as np, jaxbridge as jb
            >>> A = np.array([[1.0, 2.0], [0.0, 3.0]], np.float32)
            >>> matvec = jb.foreign(lambda x: x, linear=True)(lambda x: (A @ x).astype(x.dtype))
            >>> @matvec.deftranspose
            ... def _(ct):
            ...     return ((A.T @ ct).astype(ct.dtype),)
            >>> jax.jacrev(matvec)(jnp.ones(2, jnp.float32)).tolist()
            [[1.0, 2.0], [0.0, 3.0]]
        """
        return self._set_rule("transpose", rule, kind, out)

    # ---- calling
    def __call__(self, *args: Any, **static: Any) -> Any:
        sig, dyn = self._signature(args, static)
        outs = foreign_pair.call(sig, *dyn)
        return jax.tree_util.tree_unflatten(sig.out_tree, list(outs[:sig.n_out]))

    def _signature(self, args: tuple, static: dict) -> tuple[CallSignature, list]:
        name = self.__name__
        for key, value in static.items():
            try:
                hash(value)
            except TypeError:
                raise TypeError(
                    f"jaxbridge: foreign function {name!r}: keyword argument {key!r} is static "
                    f"(keyword arguments select a compiled version), so it must be hashable; "
                    f"got {type(value).__name__}. Pass arrays as positional arguments.") from None
        leaves, in_tree = jax.tree_util.tree_flatten(args)
        dyn, avals, static_leaves = [], [], []
        for i, leaf in enumerate(leaves):
            if is_array_leaf(leaf):
                x = leaf if isinstance(leaf, jax.Array) else jax.numpy.asarray(leaf)
                aval = aval_of(x)
                dyn.append(x)
                avals.append((tuple(aval.shape), np.dtype(aval.dtype)))
            else:
                try:
                    hash(leaf)
                except TypeError:
                    raise TypeError(
                        f"jaxbridge: foreign function {name!r}: positional arguments may "
                        f"contain arrays and hashable (static) leaves; leaf {i} is an "
                        f"unhashable {type(leaf).__name__}") from None
                static_leaves.append((i, leaf))
        defn = self._definition
        statics = tuple(sorted(static.items()))
        key = (in_tree, tuple(static_leaves), tuple(avals), statics)
        sig = defn.signature(key, lambda: _make_signature(
            defn, in_tree, tuple(static_leaves), tuple(avals), statics))
        return sig, dyn


def _check_choice(where: str, arg: str, value: Any, choices: tuple) -> None:
    if value not in choices:
        raise ValueError(f"{where}: {arg} must be one of {choices}, got {value!r}")


def _forward_aliases(name: str, aliases: Any) -> tuple[tuple[int, int], ...]:
    """``foreign(..., aliases=)`` as the forward call's ((operand, result), ...) pairs:
    only the forward call of a host function aliases."""
    pairs = check_aliases_arg(
        f"jaxbridge.foreign {name!r}: argument 'aliases'", aliases, ("forward",),
        why_not="derivative rules write into fresh buffers; give them out=True to save the "
                "copy of what they return")
    return pairs.get("forward", ())


def _make_signature(defn: Definition, in_tree: Any, static_leaves: tuple, avals: tuple,
                    statics: tuple) -> CallSignature:
    in_structs = tuple(jax.ShapeDtypeStruct(s, d) for s, d in avals)

    def declared(decl: Any, what: str) -> tuple[Any, tuple]:
        if callable(decl) and not hasattr(decl, "shape"):
            structs = iter(in_structs)
            leaves = dict(static_leaves)
            sds_leaves = [leaves[j] if j in leaves else next(structs)
                          for j in range(in_tree.num_leaves)]
            decl = decl(*jax.tree_util.tree_unflatten(in_tree, sds_leaves), **dict(statics))
        flat, tree = jax.tree_util.tree_flatten(decl)
        return tree, tuple(as_struct(x, what, defn.name) for x in flat)

    out_tree, out_avals = declared(defn.result, "result")
    res_tree, res_avals = (None, ())
    if defn.residuals is not None:
        res_tree, res_avals = declared(defn.residuals, "residuals")
    check_batch_dims(
        defn.batch_dims, in_structs + out_avals + res_avals,
        f"jaxbridge: foreign function {defn.name!r} declares batch_dims={defn.batch_dims}, so "
        f"every array argument, result and residual",
        fix="Broadcast unbatched arguments, or call the function inside jax.shard_map instead.")
    if defn.linear:
        _check_linear(defn, in_structs, out_avals)
    check_alias_types(f"jaxbridge.foreign {defn.name!r}", "forward", defn.aliases,
                      in_structs, out_avals + res_avals, "this call")
    return CallSignature(defn, CallInputs(in_tree, static_leaves, in_structs, statics),
                         CallOutputs(out_tree, out_avals, res_tree, res_avals))


def _check_linear(defn: Definition, ins: tuple, outs: tuple) -> None:
    bad = [f"{'argument' if i < len(ins) else 'result'} {s.dtype}"
           for i, s in enumerate(ins + outs) if not is_differentiable(s.dtype)]
    if bad:
        raise TypeError(
            f"jaxbridge: foreign function {defn.name!r} is declared linear=True, so every "
            f"array argument and result must be floating or complex (a linear map of them); "
            f"got {', '.join(bad)}. Make integer inputs static (keyword arguments), or drop "
            f"linear=True and define defvjp/defjvp.")


def foreign(result: Any, *, residuals: Any = None,
            vmap: Literal["loop", "vectorized"] = "loop",
            backend: Literal["auto", "native", "pure_callback"] = "auto",
            batch_dims: int = 0, on_mesh: Literal["error", "replicate"] = "error",
            out: bool = False, linear: bool = False, cast: bool = False,
            aliases: dict[str, dict[int, int]] | None = None,
            ) -> Callable[[Callable[..., Any]], ForeignFunction]:
    """Make a NumPy/SciPy function callable (and differentiable) from JAX.

    Args:
      result: the output's shapes and dtypes: a pytree of `jax.ShapeDtypeStruct`, or a
        callable that takes the positional arguments as ShapeDtypeStructs (plus the
        keyword arguments) and returns that pytree.
      residuals: optional, declared like `result`. The function then returns
        `(output, residuals)`, and the derivative rules get `res` as a fourth
        positional argument (to avoid recomputing, say, a factorization).
      vmap: how `jax.vmap` runs the function (and its rules): `"loop"` calls it once
        per batch element (always correct); `"vectorized"` calls it once with a
        leading batch axis on every argument (unbatched ones are broadcast), for
        functions written to broadcast over leading axes.
      backend: `"auto"` (native host call where available, else `jax.pure_callback`),
        `"native"` (error if unavailable) or `"pure_callback"`.
      batch_dims: the number of leading dimensions, shared by every array argument
        and result, along which the function is independent (it must accept any
        size there). Under `jit` on inputs sharded along them, XLA runs the call
        (and its rules) once per shard on the shard's own device, with no gather.
      on_mesh: what to do when a call that cannot be split (no `batch_dims`, or the
        `pure_callback` backend) is compiled for several devices: `"error"`
        (default; never a silent gather) or `"replicate"` (accept that XLA gathers
        the inputs and runs the call on every device).
      out: write results in place: the function is called as
        ``fun(*args, out=outs, **static)``, where `outs` has the result's structure
        (``(outputs, residuals)`` with residuals) and holds writable arrays that it
        must fill completely, and returns None. Saves a copy of every result.
      linear: the function is linear in its array arguments jointly (an FFT, a
        convolution with a fixed kernel, a sparse matvec with fixed matrix). Its
        JVP is then the function itself, and `deftranspose` gives its VJP:
        derivatives of every order work with NumPy code alone.
      cast: cast results of the right shape but another dtype (from the function or
        its rules) to the declared dtype. Off by default: nothing is silently cast.
      aliases: ``{"forward": {operand index: result index}}``: XLA writes that result
        into the operand's buffer (the FFI call's ``input_output_aliases``), so with
        ``out=True`` the function updates its input in place and no fresh result buffer
        is allocated. Operands are the array leaves of the positional arguments,
        results the leaves of the result (then the residuals); aliased ones need the
        same shape and dtype. XLA copies an operand first when it is still needed, so
        the caller's array is never clobbered. Like ``jb.kernel(..., aliases=)``.

    Positional arguments are pytrees whose array leaves are traced (float, complex,
    integer and bool; only inexact ones are differentiable); other leaves and all
    keyword arguments are static and must be hashable. The wrapped function gets
    NumPy arrays -- zero-copy views of XLA's buffers, valid only during the call: copy
    what you keep (a function that keeps one gets a `KeptViewError` once, and copies
    from then on) -- and must return exactly the declared shapes and dtypes. An
    exception it raises reaches the caller as itself, under `jit` too.

    Returns:
      A decorator: applied to a function, it returns a `ForeignFunction`.

    Raises:
      TypeError: a non-callable to wrap, or a flag that is not a bool.
      ValueError: an unknown `vmap`, `backend` or `on_mesh`, a negative `batch_dims`,
        or `residuals` with ``linear=True``.
      jaxbridge.errors.AliasError: malformed ``aliases`` (a ValueError, and a
        `KernelError` as for `jaxbridge.kernel`); calls raise it for aliased buffers of
        different shapes or dtypes.

    Calls raise `jaxbridge.errors.ResultMismatchError` for results that differ from
    the declaration, `MissingRuleError` when a transformation needs a rule that was
    not given, and `ShardingError` when a call would gather sharded inputs.

    Example:
        >>> import jax, jax.numpy as jnp, numpy as np, scipy.linalg
        >>> import jaxbridge as jb
        >>> @jb.foreign(lambda a, b: b)
        ... def solve(a, b):
        ...     return scipy.linalg.solve(a, b)
        >>> @solve.defvjp
        ... def solve_vjp(primals, x, ct):
        ...     a, _ = primals
        ...     lam = scipy.linalg.solve(a.T, ct)
        ...     return (-np.outer(lam, x), lam)
        >>> a, b = jnp.eye(2, dtype=jnp.float32) * 2.0, jnp.ones(2, dtype=jnp.float32)
        >>> jax.grad(lambda b: solve(a, b).sum())(b)
        Array([0.5, 0.5], dtype=float32)
    """
    # Over 80 lines: the docstring documents every option of this public front end.
    def wrap(fun: Callable[..., Any]) -> ForeignFunction:
        return ForeignFunction(fun, result, residuals=residuals, vmap=vmap, backend=backend,
                               batch_dims=batch_dims, on_mesh=on_mesh, out=out, linear=linear,
                               cast=cast, aliases=aliases)

    return wrap


def custom_gradient(result: Any, **options: Any) -> Callable[[Callable[..., Any]],
                                                              ForeignFunction]:
    """The one-function form: `fun(*args) -> (value, grad_fn)`, in NumPy.

    `grad_fn(ct)` returns one cotangent per positional argument (a tuple), or the
    cotangent itself for a one-argument function. The forward is run again inside
    the backward pass to obtain `grad_fn` (host state cannot cross XLA), so the
    backward costs one extra forward call. Options as in :func:`foreign`.

    Args:
      result: the declared result, as in :func:`foreign`.
      **options: any other option of :func:`foreign` (``vmap``, ``batch_dims``, ...).

    Returns:
      A decorator: applied to ``fun(*args) -> (value, grad_fn)``, it returns a
      `ForeignFunction` whose VJP rule calls ``grad_fn``.

    Example:
        >>> import jax, jax.numpy as jnp, numpy as np, jaxbridge as jb
        >>> @jb.custom_gradient(lambda x: x)
        ... def clipped_log(x):
        ...     return np.log(x), lambda ct: np.clip(ct / x, -10, 10)
        >>> print(float(jax.grad(clipped_log)(jnp.float32(0.01))))
        10.0
    """
    def wrap(fun: Callable[..., Any]) -> ForeignFunction:
        def forward(*args, **static):
            return fun(*args, **static)[0]

        try:
            functools.update_wrapper(forward, fun)
        except AttributeError:  # pragma: no cover
            pass
        forward.__name__ = callable_name(fun)
        wrapped = ForeignFunction(forward, result, **options)

        @wrapped.defvjp
        def _vjp(primals, out, ct, **static):
            cts = fun(*primals, **static)[1](ct)
            if len(primals) == 1 and not (isinstance(cts, (tuple, list)) and len(cts) == 1):
                cts = (cts,)
            return tuple(cts)

        _vjp.derivative_name = "custom_gradient's grad_fn (numpy)"  # type: ignore[attr-defined]

        return wrapped

    return wrap

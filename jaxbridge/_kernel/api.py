"""C++/CUDA XLA FFI targets -> differentiable JAX functions (`jaxbridge.kernel`).

The public face: `kernel` and the `Kernel` it returns. What one call depends on is in
signature.py (`KernelSpec`, `KernelSignature`), attribute typing in attributes.py and
target names in registry.py.

A kernel is up to three FFI targets playing the three roles of a derivative pair
(`jaxbridge._core.pair`), with fixed calling conventions:

* forward  ``(*primals) -> outputs``
* vjp      ``(*primals, *outputs, *cotangents) -> input cotangents``
* jvp      ``(*primals, *outputs, *tangents) -> output tangents`` (optional)

Cotangents/tangents exist only for floating-point outputs/inputs that are not in
``nondiff_argnums``. Static keyword arguments become FFI attributes of all three calls.
``pass_outputs=False`` drops ``*outputs`` from the VJP and JVP conventions;
``aliases`` lets a kernel write a result into an operand's buffer. A linear kernel
(``linear=True``) has no JVP or VJP kernel of its own: its JVP is the forward kernel
applied to the tangents and its VJP is the ``transpose`` kernel applied to the
cotangents (both take only those). ``adjoint=``/``tangent=`` are the deprecated
spellings of ``vjp=``/``jvp=`` (`jaxbridge._core.renamed`).

Batching is explicit: ``vmap="vectorized"`` means the kernels accept any number of
leading batch dimensions shared by every operand and result (a `vmap` is ONE call);
``vmap="loop"`` runs one call per batch element. (``"batch"`` is the deprecated
spelling of ``"vectorized"``, the word `jaxbridge.foreign` uses too.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._core.capabilities import Derivatives
from .._core.checks import check_aliases_arg, check_batch_dims
from .._core.jaxapi import (
    ShapedArray,
)
from .._core.pair import VMAP_CHOICES, make_pair
from .._core.renamed import renamed_attribute, renamed_keyword, renamed_role, renamed_value
from .._core.scalars import convert_scalar, is_scalar
from ..errors import KernelError
from . import guard
from .attributes import RESERVED_ATTR_PREFIX, attr_type, convert_attr
from .registry import check_name, is_registered, platform_key, register_target
from .signature import ROLES, CallAvals, KernelSignature, KernelSpec

__all__ = ["Kernel", "kernel", "get_include", "kernel_pair"]

kernel_pair = make_pair("jaxbridge_kernel")


# ----------------------------------------------------------------- include dirs
def get_include() -> str:
    """Directory with jaxbridge's C++ headers for kernel authors (``jaxbridge/*.h``).

    Use it together with ``jax.ffi.include_dir()`` (the XLA FFI headers): pass both
    as ``-I`` flags (`jaxbridge.cpp.load` does it for you).

    Returns:
      The directory that holds ``jaxbridge/ffi_helpers.h``, ``jaxbridge/parallel.h``
      and ``jaxbridge/cuda.h``.

    Raises:
      FileNotFoundError: the headers are missing from this installation.

    Example:
        >>> import os, jaxbridge as jb
        >>> os.path.exists(os.path.join(jb.get_include(), "jaxbridge", "ffi_helpers.h"))
        True
    """
    here = Path(__file__).resolve().parent.parent
    for cand in (here / "include", here.parent / "csrc" / "include"):
        if (cand / "jaxbridge" / "ffi_helpers.h").is_file():
            return str(cand)
    raise FileNotFoundError("jaxbridge: the C++ headers are missing from this installation "
                            f"(looked in {here / 'include'})")


def vmap_choice(vmap: Any, stacklevel: int = 3) -> str:
    """`vmap`, with the deprecated spelling ``"batch"`` read as ``"vectorized"`` (warned
    at the caller `stacklevel` frames up from this function's own frame)."""
    vmap = renamed_value("jaxbridge.kernel", "vmap", vmap, "batch", "vectorized",
                         stacklevel - 1)
    if vmap not in VMAP_CHOICES:
        raise KernelError(f"jaxbridge.kernel: vmap must be one of {VMAP_CHOICES}, got "
                          f"{vmap!r}")
    return str(vmap)


# ----------------------------------------------------------------- the Kernel object
def _targets(spec: Any, role: str, name: str, platforms: Sequence[str] | None,
             namespace: str | None) -> dict[str, str]:
    """Normalize a role's target(s) to {platform: target name}, registering capsules."""
    if spec is None:
        return {}
    if isinstance(spec, str) or type(spec).__name__ == "PyCapsule":
        spec = {p: spec for p in (platforms or ["cpu"])}
    if not isinstance(spec, Mapping):
        raise KernelError(f"jaxbridge.kernel {name!r}: {role} must be a target name, a "
                          f"PyCapsule, or a {{platform: name or capsule}} dict; got "
                          f"{type(spec).__name__}")
    out = {}
    for plat, target in spec.items():
        plat = platform_key(plat)
        if isinstance(target, str):
            # Referring to an already registered built-in target is fine; only
            # registering new names under the reserved prefix is refused.
            check_name(target, builtin=is_registered(target, plat))
            out[plat] = target
        else:
            out[plat] = register_target(f"{name}_{role}", target, platform=plat,
                                        namespace=namespace or "user")
    return out


class Kernel:
    """A differentiable JAX function backed by XLA FFI targets, made by :func:`kernel`
    (or `jaxbridge.cpp.Library.kernel`).

    Call it with the array arguments positionally and the attributes as keywords:
    ``k(*arrays, **attrs)``. It runs under `jit`, `vmap`, `grad`, `jvp`, `lax.scan` and
    `jax.export` with no Python at run time.

    Attributes:
      name: the kernel's name in messages.
      forward: the forward targets, ``{platform: target name}``.
      forward_with_residuals: the targets of the forward that also returns the
        residuals (empty if the forward returns them, or there are none).
      residuals: the declared residuals (or None).
      vjp: the VJP targets (``{}`` if none; ``adjoint`` is its deprecated name).
      jvp: the JVP targets (``{}`` if none; ``tangent`` is its deprecated name).
      transpose: the transpose targets of a linear kernel (``{}`` if none).
      result: the declared result.
      vmap: ``"vectorized"`` or ``"loop"``.
      dtypes: the allowed dtypes of differentiable arguments (None: any).
      batch_dims: the number of leading dimensions split per shard.
      guard_outputs: every call checks that the handlers write inside their outputs.

    Example (the built-in softplus is a `Kernel`):
        >>> import jax, jax.numpy as jnp
        >>> from jaxbridge import ops
        >>> print(f"{float(jax.grad(ops.softplus)(jnp.float32(0.0))):.2f}")  # sigmoid(0)
        0.50
    """

    def __init__(self, spec: KernelSpec):
        self.spec = spec
        self.attr_types = {k: attr_type(v) for k, v in spec.attrs.items()}
        self.defaults = {k: v for k, v in spec.attrs.items() if not isinstance(v, type)}
        self.__name__ = spec.name
        self.__doc__ = f"jaxbridge kernel {spec.name!r} (FFI targets: {self.targets()})"

    # What it is (read-only: a kernel is immutable; see KernelSpec).
    name = property(lambda self: self.spec.name)
    forward = property(lambda self: self.spec.forward)
    vjp = property(lambda self: self.spec.vjp)
    jvp = property(lambda self: self.spec.jvp)
    transpose = property(lambda self: self.spec.transpose)
    result = property(lambda self: self.spec.result)
    vmap = property(lambda self: self.spec.vmap)
    dtypes = property(lambda self: self.spec.dtypes)
    arg_names = property(lambda self: self.spec.arg_names)
    attrs = property(lambda self: self.spec.attrs)
    check = property(lambda self: self.spec.check)
    nondiff_argnums = property(lambda self: self.spec.nondiff_argnums)
    pass_outputs = property(lambda self: self.spec.pass_outputs)
    aliases = property(lambda self: self.spec.aliases)
    linear = property(lambda self: self.spec.linear)
    batch_dims = property(lambda self: self.spec.batch_dims)
    residuals = property(lambda self: self.spec.residuals)
    forward_with_residuals = property(lambda self: self.spec.forward_with_residuals)
    guard_outputs = property(lambda self: self.spec.guard_outputs)

    @property
    def adjoint(self) -> Any:
        """Deprecated name of `vjp`."""
        renamed_attribute("jaxbridge.Kernel", "vjp", "adjoint", 1)
        return self.vjp

    @property
    def tangent(self) -> Any:
        """Deprecated name of `jvp`."""
        renamed_attribute("jaxbridge.Kernel", "jvp", "tangent", 1)
        return self.jvp

    def __repr__(self) -> str:
        extra = (f"transpose={self.transpose}" if self.linear
                 else f"vjp={self.vjp}, jvp={self.jvp}")
        return f"Kernel({self.name!r}, forward={self.forward}, {extra}, vmap={self.vmap!r})"

    def derivatives(self) -> Derivatives:
        """Which derivatives this kernel has and what computes them (asked by
        `jaxbridge.testing.check_rules`, which plans its checks from the answer).

        Example:
            >>> import jaxbridge as jb
            >>> k = jb.kernel("my_forward", vjp="my_vjp", result=lambda x: x)
            >>> k.derivatives().how
            'forward mode: none; reverse mode: VJP kernel; second order: no'
        """
        forward: str | None
        if self.linear:
            forward, reverse = "the forward kernel (linear=True)", (
                "transpose kernel" if self.transpose else None)
        else:
            forward = "JVP kernel" if self.jvp else None
            reverse = "VJP kernel" if self.vjp else None
        what = "transpose" if self.linear else "vjp"
        missing = "; ".join(["pass jvp= to jaxbridge.kernel for forward mode"]
                            * (forward is None)
                            + [f"pass {what}= to jaxbridge.kernel for reverse mode"]
                            * (reverse is None))
        return Derivatives(forward=forward, reverse=reverse, missing=missing,
                           second_order=self.linear and reverse is not None)

    def targets(self) -> list[str]:
        """Every FFI target name this kernel may emit."""
        return self.spec.targets()

    def export_checks(self) -> list:
        """`disabled_checks` for `jax.export.export` of programs that call this kernel.

        The targets are not in JAX's list of stable custom calls, so exporting needs
        an explicit opt-in; the exported artifact runs where the same targets are
        registered (same library loaded). A guarded kernel's program calls the guarded
        call too (which runs the kernel's targets registered in that process).
        """
        targets = self.targets() + [guard.TARGET] * self.guard_outputs
        return [jax.export.DisabledSafetyCheck.custom_call(t) for t in targets]

    def _argname(self, i: int) -> str:
        if self.arg_names and i < len(self.arg_names):
            return self.arg_names[i]
        return f"#{i}"

    def target(self, role: str, platform: str | None) -> str:
        """The FFI target of `role` on `platform` (KernelError if there is none)."""
        return self.spec.target(role, platform)

    # -- calling
    def __call__(self, *args: Any, **static: Any) -> Any:
        where = f"jaxbridge kernel {self.name!r}"
        attrs = self._attributes(where, static)
        arrays = self._arrays(where, args)
        structs = [jax.ShapeDtypeStruct(np.shape(a), a.dtype) for a in arrays]
        self._check_dtypes(where, structs)
        py_attrs = {k: v.item() if isinstance(v, np.generic) else v for k, v in attrs.items()}
        if self.check is not None:
            self.check(*structs, **py_attrs)
        avals, out_tree = self._call_avals(where, structs, py_attrs)
        # Without a forward_with_residuals target, the forward target returns them.
        sig = KernelSignature(self.spec, tuple(sorted(attrs.items())), avals,
                              residual_outputs=not self.spec.forward_with_residuals,
                              guarded=self.spec.guard_outputs or (
                                  guard.active() and self._guardable()))
        sig.check_aliases(where)
        outs = kernel_pair.call(sig, *arrays)
        return jax.tree_util.tree_unflatten(out_tree, outs[:sig.n_outputs])

    def guarded(self) -> Kernel:
        """This kernel with ``guard_outputs=True``: each call checks that its handlers
        write inside their outputs (see `kernel`).

        Example:
            >>> import jaxbridge as jb
            >>> k = jb.kernel("my_forward", result=lambda x: x)
            >>> k.guard_outputs, k.guarded().guard_outputs
            (False, True)
        """
        return Kernel(dataclasses.replace(self.spec, guard_outputs=True))

    def _guardable(self) -> bool:
        """Whether every target was registered through jaxbridge, so that the guarded
        call can run it: `guard.guarding()` (check_rules) leaves other kernels as they
        are, where ``guard_outputs=True`` refuses them."""
        return all(is_registered(target, platform) for role in ROLES
                   for platform, target in self.spec.table(role).items())

    def _check_dtypes(self, where: str, structs: list) -> None:
        if self.dtypes is None:
            return
        for i, s in enumerate(structs):
            if i not in self.nondiff_argnums and np.dtype(s.dtype) not in self.dtypes:
                raise KernelError(
                    f"{where}: argument {self._argname(i)!r}: expected dtype "
                    f"{' or '.join(d.name for d in self.dtypes)}, received "
                    f"{np.dtype(s.dtype).name} (shape {tuple(s.shape)})")

    def _call_avals(self, where: str, structs: list, attrs: dict) -> tuple[CallAvals, Any]:
        """The call's abstract values and names, and the tree of its result."""
        def declared(spec: Any, what: str) -> tuple[list, Any]:
            value = spec(*structs, **attrs) if callable(spec) else spec
            leaves, tree = jax.tree_util.tree_flatten_with_path(value)
            avals = [self._result_aval(where, leaf, what) for _, leaf in leaves]
            names = [what + jax.tree_util.keystr(path) for path, _ in leaves]
            return list(zip(avals, names)), tree

        outs, out_tree = declared(self.result, "result")
        res = declared(self.residuals, "residuals")[0] if self.residuals is not None else []
        in_avals = tuple(ShapedArray(tuple(s.shape), np.dtype(s.dtype)) for s in structs)
        k = self.batch_dims(*structs, **attrs) if callable(self.batch_dims) \
            else self.batch_dims
        _check_batch_dims(where, k, in_avals + tuple(a for a, _ in outs + res))
        avals = CallAvals(
            in_avals, tuple(a for a, _ in outs), tuple(a for a, _ in res),
            frozenset(self.nondiff_argnums), int(k),
            input_names=tuple(self._argname(i) for i in range(len(structs))),
            output_names=tuple(n for _, n in outs), residual_names=tuple(n for _, n in res))
        return avals, out_tree

    def _attributes(self, where: str, static: dict) -> dict:
        values = dict(self.defaults)
        for key, value in static.items():
            if self.attrs and key not in self.attrs:
                raise KernelError(f"{where}: unknown attribute {key!r} (known: "
                                  f"{sorted(self.attrs)}); attributes are the keyword "
                                  f"arguments declared in attrs=")
            values[key] = value
        missing = [k for k, v in self.attrs.items() if isinstance(v, type) and k not in values]
        if missing:
            raise KernelError(f"{where}: attribute(s) {missing} are required (declared "
                              f"without a default); pass them as keyword arguments")
        return {k: convert_attr(where, k, v, self.attr_types.get(k)) for k, v in values.items()}

    def _arrays(self, where: str, args: tuple) -> list:
        if self.arg_names is not None and len(args) != len(self.arg_names):
            raise KernelError(
                f"{where}: expected {len(self.arg_names)} array argument(s) "
                f"({', '.join(self.arg_names)}), received {len(args)}"
                + (f"; attributes ({', '.join(sorted(self.attrs))}) are keyword-only"
                   if self.attrs and len(args) > len(self.arg_names) else ""))
        arrays = []
        for i, a in enumerate(args):
            if self.attrs and isinstance(a, (bool, int, float, str)):
                raise KernelError(
                    f"{where}: argument {self._argname(i)!r} is a Python {type(a).__name__} "
                    f"({a!r}); array arguments must be arrays and attributes "
                    f"({', '.join(sorted(self.attrs))}) are keyword-only, e.g. "
                    f"{self.name}(x, {sorted(self.attrs)[0]}=...)")
            if is_scalar(a) and self.dtypes is not None and i not in self.nondiff_argnums:
                pass  # typed by _weak_scalars
            elif not hasattr(a, "dtype") or not hasattr(a, "shape"):
                try:
                    a = jnp.asarray(a)
                except TypeError as e:
                    raise KernelError(f"{where}: argument {self._argname(i)!r} must be an "
                                      f"array; received {type(a).__name__}") from e
            arrays.append(a)
        return self._weak_scalars(where, args, arrays)

    def _weak_scalars(self, where: str, args: tuple, arrays: list) -> list:
        """JAX's weak typing for scalar arguments (`jaxbridge._core.scalars`): a Python
        scalar takes the dtype of the kernel's array arguments (else JAX's default for
        its kind), a NumPy scalar keeps its own unless `dtypes` excludes it; either must
        convert exactly."""
        if self.dtypes is None:
            return arrays
        diff = [i for i in range(len(args)) if i not in self.nondiff_argnums]
        shared = [np.dtype(arrays[i].dtype) for i in diff if not is_scalar(args[i])
                  and np.dtype(arrays[i].dtype) in self.dtypes]
        for i in diff:
            value = args[i]
            if not is_scalar(value):
                continue
            if isinstance(value, np.generic):
                own = np.dtype(value.dtype)
            else:  # JAX's default dtype for a Python number of this kind
                kind = complex if isinstance(value, complex) else \
                    float if isinstance(value, float) else np.int64
                own = np.dtype(jax.dtypes.canonicalize_dtype(kind))
            if own in self.dtypes and (isinstance(value, np.generic) or not shared):
                target = own
            else:
                target = shared[0] if shared else self.dtypes[0]
            try:
                arrays[i] = jnp.asarray(convert_scalar(value, target))
            except ValueError as why:
                raise KernelError(
                    f"{where}: argument {self._argname(i)!r}: {why}; the kernel computes in "
                    f"{target.name} here (allowed dtypes: "
                    f"{' or '.join(d.name for d in self.dtypes)})") from None
        return arrays

    def _result_aval(self, where: str, o: Any, what: str = "result") -> Any:
        if not hasattr(o, "shape") or not hasattr(o, "dtype"):
            raise KernelError(f"{where}: the {what} spec must be a pytree of "
                              f"jax.ShapeDtypeStruct; got a leaf {o!r}")
        shape = tuple(o.shape)
        if any(not isinstance(d, (int, np.integer)) or d < 0 for d in shape):
            raise KernelError(f"{where}: the {what} spec declares shape {shape}; dimensions "
                              f"must be non-negative integers")
        return ShapedArray(tuple(int(d) for d in shape), np.dtype(o.dtype))


def _check_batch_dims(where: str, k: Any, avals: tuple) -> None:
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 0:
        raise KernelError(f"{where}: batch_dims must be an int >= 0 (or a function of the "
                          f"arguments returning one); received {k!r}")
    check_batch_dims(int(k), avals, f"{where}: batch_dims={k}, so every array argument and "
                     f"result", error=KernelError)


def kernel(forward: Any, vjp: Any = None, jvp: Any = None, *, result: Any,
           platforms: Sequence[str] | None = None, vmap: str = "loop",
           name: str | None = None, arg_names: Sequence[str] | None = None,
           dtypes: Sequence[Any] | None = ("float32", "float64"),
           attrs: Mapping[str, Any] | None = None, check: Callable | None = None,
           nondiff_argnums: Sequence[int] = (), namespace: str | None = None,
           pass_outputs: bool = True, aliases: Mapping[str, Mapping[int, int]] | None = None,
           linear: bool = False, transpose: Any = None,
           batch_dims: int | Callable[..., int] = 0, residuals: Any = None,
           forward_with_residuals: Any = None, guard_outputs: bool = False,
           adjoint: Any = None, tangent: Any = None) -> Kernel:
    """Turn XLA FFI targets into one differentiable JAX function.

    Calling conventions (``...`` = the static keyword arguments, passed as FFI
    attributes of every call; (co)tangents exist only for floating outputs/inputs not
    in ``nondiff_argnums``)::

        forward(*primals, ...)                         -> outputs
        vjp(*primals, *outputs, *cotangents, ...)      -> one cotangent per diff. input
        jvp(*primals, *outputs, *tangents, ...)        -> one tangent per diff. output

    With ``residuals=``, what the forward computed for the derivatives reaches them
    (after the outputs; callers never see residuals)::

        forward_with_residuals(*primals, ...)          -> outputs, residuals
        vjp(*primals, *outputs, *residuals, *cotangents, ...)
        jvp(*primals, *outputs, *residuals, *tangents, ...)

    ``grad``/``vjp``/``jacrev`` use the VJP kernel, ``jvp``/``jacfwd`` the JVP kernel; either
    may be omitted (the transformation that needs it then raises `MissingRuleError`).
    A guide with a complete example is docs/guides/kernels.md.

    Args:
      forward: the forward target: a registered target name, a PyCapsule (registered
        for you under ``f"{namespace or 'user'}.{name}_forward"``), or a dict
        ``{platform: name or capsule}`` for per-platform targets.
      vjp: the VJP target (reverse mode), same forms.
      jvp: the JVP target (forward mode), same forms.
      result: a pytree of ``jax.ShapeDtypeStruct``, or a function of the arguments'
        ``ShapeDtypeStruct``s and the attributes returning one.
      platforms: platforms that string targets exist on (default ``("cpu",)``).
      vmap: ``"vectorized"`` (kernels take shared leading batch dims: one call under
        vmap) or ``"loop"`` (one call per batch element). ``"batch"`` is a deprecated
        spelling of ``"vectorized"``.
      name: the kernel's name in messages (default: from the forward target).
      arg_names: names of the positional (array) arguments: checked and used in errors.
      dtypes: allowed dtypes of the differentiable array arguments; None: any.
      attrs: the attributes (keyword-only arguments): ``{name: default}`` or ``{name:
        type}`` (required). The default's (or declared) type fixes the C++ type: ``int``
        -> ``int64_t``, ``float`` -> ``double``, ``bool`` -> ``bool``, ``str`` ->
        ``std::string_view``, NumPy scalars keep their width (``np.float32`` ->
        ``float``, ``np.int32`` -> ``int32_t``). A value of another type is an error
        at trace time (an ``int`` is accepted for a float attribute). Without
        ``attrs``, any keyword becomes an attribute of its own Python type.
      check: ``check(*arg_structs, **attrs)`` raising on bad input at trace time.
      nondiff_argnums: positional arguments that are never differentiated (integer
        index arrays, say); they get no cotangent and are exempt from ``dtypes``.
      namespace: namespace for targets registered from capsules.
      pass_outputs: ``False``: the VJP and JVP kernels take no ``*outputs``
        (``vjp(*primals, *cotangents)``), so ``jax.grad`` need not run the forward
        kernel when only the gradient is used.
      aliases: ``{role: {operand index: result index}}`` (role ``"forward"``,
        ``"forward_with_residuals"``, ``"vjp"``, ``"jvp"`` or ``"transpose"``;
        indices into that kernel's operands and results): the result is written into
        the operand's buffer, as ``jax.ffi.ffi_call``'s ``input_output_aliases`` (XLA
        copies the operand first when it is still needed). Same shape and dtype; the
        kernel must be correct in place.
      linear: the forward kernel is linear in all its (array) arguments jointly. Then
        its JVP is the forward kernel on the tangents and its VJP is
        ``transpose(*cotangents) -> one cotangent per argument``: derivatives of every
        order work. Give ``transpose`` instead of ``vjp``/``jvp``.
      transpose: the transpose target of a linear kernel, same forms as ``forward``.
      batch_dims: the number of leading dimensions, shared by every operand and result of
        every role, along which the kernels are independent (an int, or a function of
        the arguments' structs and attributes returning one). Under `jit` on inputs
        sharded along them (automatic or explicit mesh axes), XLA runs one call per
        shard on local data instead of refusing the call.
      residuals: what the derivative kernels take from the forward besides the outputs,
        declared like ``result`` (a pytree of ``jax.ShapeDtypeStruct`` or a function
        returning one). They follow the outputs in the operands of the VJP and
        JVP kernels (also with ``pass_outputs=False``), and `jax.jit` keeps them from the
        forward pass to the backward pass as `jax.custom_vjp` does.
      forward_with_residuals: the target of the forward that returns the outputs and
        then the residuals (same forms as ``forward``); differentiated calls run it,
        other calls run ``forward``, which then returns the outputs only, so a call
        nobody differentiates computes no residual. Without it, ``forward`` returns
        the residuals too, on every call.
      guard_outputs: check every call of every role: each output lies between guard
        bytes, and a handler that writes outside one fails the call with an error
        naming the kernel, the target and the output, instead of corrupting memory.
        Costs a copy of each output and 2-3x its memory (and a device wait on CUDA);
        `Kernel.guarded()` turns it on for an existing kernel, and
        `jaxbridge.testing.check_rules` for every kernel it traces.
      adjoint: deprecated spelling of ``vjp`` (a DeprecationWarning; removed in the
        next release).
      tangent: deprecated spelling of ``jvp`` (likewise).

    Returns:
      A `Kernel`, called as ``k(*arrays, **attrs)``.

    Raises:
      KernelError: a bad target (not a name, capsule or ``{platform: ...}`` dict; an
        invalid or reserved ``jaxbridge_`` name) or contradictory options (an unknown
        ``vmap``, ``linear`` with ``vjp``/``jvp`` or ``residuals``,
        ``transpose`` without ``linear``, ``forward_with_residuals`` without
        ``residuals``, malformed ``attrs`` or ``aliases``). Calls raise it too, at trace
        time: a dtype outside ``dtypes``, an unknown or missing attribute, one of the
        wrong type or a traced one, aliased buffers of different shapes, a target
        registered outside jaxbridge with ``guard_outputs``; ``check`` raises its own.
      AliasError: (a `KernelError`) malformed ``aliases``, or aliased buffers of
        different shapes or dtypes in a call; `jaxbridge.foreign` raises it too.
      TypeError: a keyword given together with its deprecated spelling (``vjp`` and
        ``adjoint``, ``jvp`` and ``tangent``).

    Example (compiles C++, so not run as a doctest; docs/getting-started.md and
    docs/guides/kernels.md run complete ones):
        >>> lib = jaxbridge.cpp.load("cube", sources=["cube.cc"])  # doctest: +SKIP
        >>> cube = jaxbridge.kernel(lib.handlers["CubeForward"],
        ...                         lib.handlers["CubeVjp"],
        ...                         result=lambda x, **_: x, vmap="vectorized",
        ...                         name="cube")  # doctest: +SKIP
        >>> jax.grad(lambda x: cube(x).sum())(jnp.ones(3))  # doctest: +SKIP

    This is how `jaxbridge.ops` declares the built-in softplus (its targets carry the
    reserved ``jaxbridge_`` prefix): the elementwise VJP kernel needs only ``x`` and
    overwrites the cotangent with the input cotangent::

        softplus = jaxbridge.kernel(
            "jaxbridge_softplus_fwd", "jaxbridge_softplus_adj", "jaxbridge_softplus_tan",
            result=lambda x, **_: x, vmap="vectorized", attrs={"beta": 1.0},
            pass_outputs=False, aliases={"vjp": {1: 0}})
    """
    # Over 80 lines: the docstring documents every option of this public front end.
    where = "jaxbridge.kernel"
    vjp = renamed_keyword(where, "vjp", vjp, "adjoint", adjoint, 1)
    jvp = renamed_keyword(where, "jvp", jvp, "tangent", tangent, 1)
    vmap = vmap_choice(vmap)
    if name is None:
        name = forward if isinstance(forward, str) else "kernel"
        name = name.removesuffix("_fwd").removesuffix("_forward")
    name = str(name)
    _check_roles(name, linear, vjp, jvp, transpose, residuals, forward_with_residuals)
    fwd = _targets(forward, "forward", name, platforms, namespace)
    if not fwd:
        raise KernelError(f"jaxbridge.kernel {name!r}: a forward target is required")
    plats = platforms or list(fwd)
    targets = {"forward": fwd,
               "vjp": _targets(vjp, "vjp", name, plats, namespace),
               "jvp": _targets(jvp, "jvp", name, plats, namespace),
               "transpose": _targets(transpose, "transpose", name, plats, namespace),
               "forward_with_residuals": _targets(forward_with_residuals,
                                                  "forward_with_residuals", name, plats,
                                                  namespace)}
    dts = None if dtypes is None else tuple(np.dtype(d) for d in dtypes)
    return Kernel(KernelSpec(
        name=name, **targets, result=result, vmap=vmap, dtypes=dts,
        arg_names=None if arg_names is None else tuple(arg_names),
        attrs=_check_attrs_arg(name, attrs), check=check,
        nondiff_argnums=tuple(nondiff_argnums), pass_outputs=bool(pass_outputs),
        aliases=check_aliases_arg(f"jaxbridge.kernel {name!r}: argument 'aliases'",
                                  _renamed_roles(name, aliases), ROLES),
        linear=bool(linear), batch_dims=batch_dims,
        residuals=residuals, guard_outputs=bool(guard_outputs)))


def _renamed_roles(name: str, aliases: Any) -> Any:
    """`aliases` with the deprecated roles ``"adjoint"``/``"tangent"`` read as
    ``"vjp"``/``"jvp"`` (warned at kernel()'s caller); checked by `check_aliases_arg`."""
    if not isinstance(aliases, Mapping):
        return aliases
    return {renamed_role(f"jaxbridge.kernel {name!r}: aliases", role, 2): pairs
            for role, pairs in aliases.items()}


def _check_roles(name: str, linear: bool, vjp: Any, jvp: Any, transpose: Any,
                 residuals: Any, forward_with_residuals: Any) -> None:
    """Raise on a combination of kernels and options that cannot work together."""
    where = f"jaxbridge.kernel {name!r}"
    if linear and (vjp is not None or jvp is not None):
        raise KernelError(f"{where}: a linear kernel's JVP is the forward kernel and its "
                          f"VJP is the transpose kernel: pass transpose=..., not "
                          f"vjp= or jvp=")
    if transpose is not None and not linear:
        raise KernelError(f"{where}: transpose= is for linear kernels (linear=True); give "
                          f"vjp= for this one")
    if linear and residuals is not None:
        raise KernelError(f"{where}: a linear kernel has no residuals (its derivatives do not "
                          f"depend on its inputs); drop residuals= or linear=True")
    if forward_with_residuals is not None and residuals is None:
        raise KernelError(f"{where}: forward_with_residuals= returns the residuals, so "
                          f"declare them: residuals=<pytree of jax.ShapeDtypeStruct, or a "
                          f"function of the arguments returning one>")


def _check_attrs_arg(name: str, attrs: Mapping[str, Any] | None) -> dict[str, Any]:
    """``attrs`` as a dict, each entry a default value or a type of an FFI attribute."""
    where = f"jaxbridge.kernel {name!r}"
    attrs = dict(attrs or {})
    for key, value in attrs.items():
        if str(key).startswith(RESERVED_ATTR_PREFIX):
            raise KernelError(f"{where}: attrs[{key!r}]: the prefix {RESERVED_ATTR_PREFIX!r} "
                              f"is reserved for jaxbridge's own attributes; rename it")
        if attr_type(value) is None:
            raise KernelError(f"{where}: attrs[{key!r}] must be a default value (bool, int, "
                              f"float, str or a NumPy scalar) or one of those types; "
                              f"received {value!r}")
    return attrs

"""C++/CUDA XLA FFI targets -> differentiable JAX functions (`jaxbridge.kernel`).

A kernel is up to three FFI targets playing the three roles of a derivative pair
(`jaxbridge._core.pair`), with fixed calling conventions:

* forward  ``(*primals) -> outputs``
* adjoint  ``(*primals, *outputs, *cotangents) -> input cotangents``
* tangent  ``(*primals, *outputs, *tangents) -> output tangents`` (optional)

Cotangents/tangents exist only for floating-point outputs/inputs that are not in
``nondiff_argnums``. Static keyword arguments become FFI attributes of all three calls.
``pass_outputs=False`` drops ``*outputs`` from the adjoint and tangent conventions;
``aliases`` lets a kernel write a result into an operand's buffer. A linear kernel
(``linear=True``) has no tangent or adjoint of its own: its tangent is the forward
kernel applied to the tangents and its adjoint is the ``transpose`` kernel applied to
the cotangents (both take only those).

Batching is explicit: ``vmap="batch"`` means the kernels accept any number of leading
batch dimensions shared by every operand and result (a `vmap` is ONE call);
``vmap="loop"`` runs one call per batch element.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._core.jaxapi import (
    ShapedArray,
    auto_partitioned_devices,
    ffi_lowering_aliased,
    hold_weakly_in_jax_caches,
    set_num_batch_dims,
    unsplittable_batch_dims,
)
from .._core.pair import make_pair
from ..errors import KernelError, MissingRuleError, ShardingError, describe
from .registry import (
    check_name,
    is_registered,
    make_batch_partitionable,
    platform_key,
    register_target,
)

__all__ = ["Kernel", "kernel", "make_kernel", "get_include", "kernel_pair"]

ROLES = ("forward", "adjoint", "tangent", "transpose")
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


# ----------------------------------------------------------------- FFI attributes
# Python value (or declared type) -> the C++ type the handler binds with .Attr<T>().
_ATTR_TYPES: dict[Any, str] = {
    bool: "bool", int: "int64_t", float: "double", str: "std::string_view",
    np.bool_: "bool", np.int8: "int8_t", np.int16: "int16_t", np.int32: "int32_t",
    np.int64: "int64_t", np.uint8: "uint8_t", np.uint16: "uint16_t", np.uint32: "uint32_t",
    np.uint64: "uint64_t", np.float32: "float", np.float64: "double",
}


def _attr_type(value: Any) -> type | None:
    """The attribute type a default value or a declared type stands for."""
    if isinstance(value, type):
        return bool if value is np.bool_ else value if value in _ATTR_TYPES else None
    if isinstance(value, (bool, np.bool_)):
        return bool
    if isinstance(value, str):
        return str
    if isinstance(value, np.generic) and type(value) in _ATTR_TYPES:
        return type(value)
    if isinstance(value, int):
        return int
    if isinstance(value, float):
        return float
    return None


def _convert_attr(where: str, key: str, value: Any, declared: type | None) -> Any:
    """`value` as the FFI attribute of type `declared` (inferred from `value` if None)."""
    kind = declared or _attr_type(value)
    if kind is None:
        raise KernelError(f"{where}: attribute {key!r} must be a bool, int, float, str or "
                          f"NumPy scalar (an FFI attribute); received "
                          f"{type(value).__name__} {value!r}")
    ok = {
        bool: isinstance(value, (bool, np.bool_)),
        str: isinstance(value, str),
    }.get(kind)
    if ok is None:  # numbers: ints for integer attributes; ints or floats for floats
        is_int = isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
        is_float = isinstance(value, (float, np.floating))
        ok = is_int if np.issubdtype(np.dtype(kind), np.integer) else (is_int or is_float)
    if not ok:
        raise KernelError(
            f"{where}: attribute {key!r} is declared {_ATTR_TYPES[kind]} "
            f"({kind.__name__}); received {type(value).__name__} {value!r}")
    if kind is bool:
        return np.bool_(value)
    if kind is str:
        return value
    if kind is int:
        return np.int64(value)
    if kind is float:
        return np.float64(value)
    return kind(value)


# ----------------------------------------------------------------- the call signature
def _inexact(dtype: Any) -> bool:
    return bool(jnp.issubdtype(dtype, jnp.inexact))


class KernelSignature:
    """Hashable static description of one kernel call (`jaxbridge._core.pair.Signature`)."""

    __slots__ = ("kernel", "attrs", "in_avals", "out_avals", "nondiff", "num_batch_dims",
                 "diff_in", "tangent_outs", "_key", "_hash", "__weakref__")
    prune_zero_tangents = False  # kernels take every differentiable tangent

    def __init__(self, kernel: Kernel, attrs: tuple, in_avals: tuple, out_avals: tuple,
                 nondiff: frozenset, num_batch_dims: int = 0):
        self.kernel, self.attrs = kernel, attrs
        self.in_avals, self.out_avals, self.nondiff = in_avals, out_avals, nondiff
        self.num_batch_dims = num_batch_dims
        self.diff_in = tuple(i not in nondiff and _inexact(a.dtype)
                             for i, a in enumerate(in_avals))
        self.tangent_outs = tuple(_inexact(a.dtype) for a in out_avals)
        # Attribute types are part of the key: 2 and 2.0 are equal but not the same FFI
        # attribute (int64 vs double) when no type was declared.
        types = tuple((k, type(v)) for k, v in attrs)
        self._key = (id(kernel), attrs, types, in_avals, out_avals, nondiff, num_batch_dims)
        self._hash = hash(self._key)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, KernelSignature) and self._key == other._key

    def __repr__(self) -> str:
        return f"KernelSignature({self.kernel.name!r}, attrs={dict(self.attrs)})"

    @property
    def name(self) -> str:
        return self.kernel.name

    @property
    def vectorized(self) -> bool:
        return self.kernel.vmap == "batch"

    def batched(self, size: int) -> KernelSignature:
        def pre(a: Any) -> Any:
            return ShapedArray((size, *a.shape), a.dtype)
        return KernelSignature(self.kernel, self.attrs, tuple(map(pre, self.in_avals)),
                               tuple(map(pre, self.out_avals)), self.nondiff,
                               self.num_batch_dims + 1 if self.num_batch_dims else 0)

    # ---- the derivative pair
    def eager(self, role: str, args: Sequence[Any], nz: tuple) -> None:
        return None  # compiled, like JAX's own primitives

    def fixed(self, primals: Sequence[Any], outs: Sequence[Any]) -> list:
        if self.kernel.linear:
            return []
        return [*primals, *outs] if self.kernel.pass_outputs else list(primals)

    def _targets(self, role: str) -> dict:
        k = self.kernel
        if role == "forward":
            return k.forward
        if role == "tangent":
            return k.forward if k.linear else k.tangent
        return k.transpose if k.linear else k.adjoint

    def rule(self, role: str) -> str | None:
        return "native" if self._targets(role) else None

    def traced(self, role: str, nz: tuple) -> Callable[..., list]:  # pragma: no cover
        raise AssertionError("kernels have no traced rules")

    def missing(self, role: str) -> MissingRuleError:
        name = self.name
        if role == "tangent":
            return MissingRuleError(
                f"jaxbridge: forward-mode differentiation (jvp, jacfwd, hessian, linearize) "
                f"of kernel {name!r} needs a tangent kernel, and none was given. Pass "
                f"tangent=<FFI target> to jaxbridge.kernel, or use reverse mode (grad, vjp, "
                f"jacrev), which uses the adjoint kernel.")
        if role == "adjoint":
            what = "transpose" if self.kernel.linear else "adjoint"
            return MissingRuleError(
                f"jaxbridge: reverse-mode differentiation (grad, vjp, jacrev) of kernel "
                f"{name!r} needs {'a' if what == 'transpose' else 'an'} {what} kernel, and "
                f"none was given. Pass {what}=<FFI target> to jaxbridge.kernel.")
        return MissingRuleError(
            f"jaxbridge: differentiation of kernel {name!r} needs an adjoint or tangent "
            f"kernel, and none was given. Pass adjoint=... and/or tangent=... to "
            f"jaxbridge.kernel (or linear=True with transpose=...).")

    def second_order_error(self, role: str) -> MissingRuleError:
        return MissingRuleError(
            f"jaxbridge: a second-order derivative of kernel {self.name!r} would "
            f"differentiate its {role} kernel with respect to the primal inputs, which C++ "
            f"kernels do not provide. Compose first-order derivatives instead, or declare a "
            f"linear kernel (linear=True, transpose=...), whose derivatives of every order "
            f"are the kernel and its transpose.")

    def role_avals(self, role: str) -> tuple[list, list]:
        """(operand avals, result avals) of the kernel playing `role` (for aliases)."""
        tan = [a for a, d in zip(self.out_avals, self.tangent_outs) if d]
        adj = [a for a, d in zip(self.in_avals, self.diff_in) if d]
        if role == "forward":
            return list(self.in_avals), list(self.out_avals)
        fixed = self.fixed(list(self.in_avals), list(self.out_avals))
        if role == "adjoint" or role == "transpose":
            return fixed + tan, adj
        return fixed + adj, tan

    def check_aliases(self, where: str) -> None:
        """Raise unless every declared alias pairs an operand and a result of one type."""
        for role, pairs in self.kernel.aliases.items():
            operands, results = self.role_avals(role)
            for o, r in pairs:
                if o >= len(operands) or r >= len(results):
                    raise KernelError(
                        f"{where}: aliases[{role!r}] maps operand {o} to result {r}, but the "
                        f"{role} kernel has {len(operands)} operands and {len(results)} "
                        "results here")
                a, b = operands[o], results[r]
                if (a.shape, a.dtype) != (b.shape, b.dtype):
                    raise KernelError(
                        f"{where}: aliases[{role!r}] maps operand {o} ({describe(a)}) to result "
                        f"{r} ({describe(b)}); aliased buffers need the same shape and dtype")

    def lower(self, role: str, ctx: Any, *args: Any, nz: tuple, platform: str | None
              ) -> Sequence[Any]:
        kernel_role = role
        if self.kernel.linear and role != "forward":
            kernel_role = "forward" if role == "tangent" else "transpose"
        target = self.kernel.target(kernel_role, platform)
        devices = auto_partitioned_devices(ctx)
        if devices > 1 and not self.num_batch_dims:  # XLA would gather the operands
            raise ShardingError(
                f"jaxbridge kernel {self.name!r} (FFI target {target!r}) is compiled into a "
                f"computation partitioned over {devices} devices, where XLA would gather its "
                f"inputs onto every device. Declare jaxbridge.kernel(..., batch_dims=...) if "
                f"it is independent along leading dimensions, or call it inside "
                f"jax.shard_map (it then runs once per shard on local data).")
        if devices > 1 and unsplittable_batch_dims(ctx, self.num_batch_dims):
            raise ShardingError(
                f"jaxbridge kernel {self.name!r} declares {self.num_batch_dims} batch "
                f"dimension(s), but some of its operands or results have no dimension beyond "
                f"them; XLA splits a call only along leading dimensions that leave at least "
                f"one, so it would gather the inputs. Give such arrays a trailing axis "
                f"(x[..., None]) or declare fewer batch_dims.")
        aliases = self.kernel.aliases.get(kernel_role, ())
        results = ffi_lowering_aliased(target, aliases)(ctx, *args, **dict(self.attrs))
        if self.num_batch_dims:
            make_batch_partitionable(target)
            set_num_batch_dims(results, self.num_batch_dims)
        return results


hold_weakly_in_jax_caches(KernelSignature)


# ----------------------------------------------------------------- the Kernel object
def _targets(spec: Any, role: str, name: str, platforms: Sequence[str] | None,
             namespace: str | None, builtin: bool) -> dict[str, str]:
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
            check_name(target, builtin=builtin or is_registered(target, plat))
            out[plat] = target
        else:
            out[plat] = register_target(f"{name}_{role}", target, platform=plat,
                                        namespace=namespace or "user", builtin=builtin)
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
      adjoint: the adjoint targets (or None).
      tangent: the tangent targets (or None).
      transpose: the transpose targets of a linear kernel (or None).
      result: the declared result.
      vmap: ``"batch"`` or ``"loop"``.
      dtypes: the allowed dtypes of differentiable arguments (None: any).
      batch_dims: the number of leading dimensions split per shard.

    Example (the built-in softplus is a `Kernel`):
        >>> import jax, jax.numpy as jnp
        >>> from jaxbridge import ops
        >>> print(f"{float(jax.grad(ops.softplus)(jnp.float32(0.0))):.2f}")  # sigmoid(0)
        0.50
    """

    def __init__(self, name: str, targets: dict[str, dict], result: Any, vmap: str,
                 dtypes: tuple | None, arg_names: tuple | None, attrs: dict,
                 check: Callable | None, nondiff_argnums: tuple, pass_outputs: bool,
                 aliases: dict, linear: bool, batch_dims: int | Callable[..., int] = 0):
        self.name = name
        self.batch_dims = batch_dims
        self.forward, self.adjoint = targets["forward"], targets["adjoint"]
        self.tangent, self.transpose = targets["tangent"], targets["transpose"]
        self.result = result
        self.vmap = vmap
        self.dtypes = dtypes
        self.arg_names = arg_names
        self.attrs = attrs
        self.attr_types = {k: _attr_type(v) for k, v in attrs.items()}
        self.defaults = {k: v for k, v in attrs.items() if not isinstance(v, type)}
        self.check = check
        self.nondiff_argnums = nondiff_argnums
        self.pass_outputs = pass_outputs
        self.aliases = aliases
        self.linear = linear
        self.__name__ = name
        self.__doc__ = f"jaxbridge kernel {name!r} (FFI targets: {self.targets()})"

    def __repr__(self) -> str:
        extra = (f"transpose={self.transpose}" if self.linear
                 else f"adjoint={self.adjoint}, tangent={self.tangent}")
        return f"Kernel({self.name!r}, forward={self.forward}, {extra}, vmap={self.vmap!r})"

    def targets(self) -> list[str]:
        """Every FFI target name this kernel may emit."""
        tables = (self.forward, self.adjoint, self.tangent, self.transpose)
        return sorted({t for d in tables for t in d.values()})

    def export_checks(self) -> list:
        """`disabled_checks` for `jax.export.export` of programs that call this kernel.

        The targets are not in JAX's list of stable custom calls, so exporting needs
        an explicit opt-in; the exported artifact runs where the same targets are
        registered (same library loaded).
        """
        return [jax.export.DisabledSafetyCheck.custom_call(t) for t in self.targets()]

    def _argname(self, i: int) -> str:
        if self.arg_names and i < len(self.arg_names):
            return self.arg_names[i]
        return f"#{i}"

    def target(self, role: str, platform: str | None) -> str:
        """The FFI target of `role` on `platform` (KernelError if there is none)."""
        table = {"forward": self.forward, "adjoint": self.adjoint, "tangent": self.tangent,
                 "transpose": self.transpose}[role]
        if platform is None or platform not in table:
            raise KernelError(
                f"jaxbridge: kernel {self.name!r} has no {role} implementation for platform "
                f"{platform!r} (available: {sorted(table)})")
        return table[platform]

    # -- calling
    def __call__(self, *args: Any, **static: Any) -> Any:
        where = f"jaxbridge kernel {self.name!r}"
        attrs = self._attributes(where, static)
        arrays = self._arrays(where, args)
        structs = [jax.ShapeDtypeStruct(np.shape(a), a.dtype) for a in arrays]
        if self.dtypes is not None:
            for i, s in enumerate(structs):
                if i in self.nondiff_argnums:
                    continue
                if np.dtype(s.dtype) not in self.dtypes:
                    raise KernelError(
                        f"{where}: argument {self._argname(i)!r}: expected dtype "
                        f"{' or '.join(d.name for d in self.dtypes)}, received "
                        f"{np.dtype(s.dtype).name} (shape {tuple(s.shape)})")
        py_attrs = {k: v.item() if isinstance(v, np.generic) else v for k, v in attrs.items()}
        if self.check is not None:
            self.check(*structs, **py_attrs)
        result = self.result(*structs, **py_attrs) if callable(self.result) else self.result
        out_leaves, out_tree = jax.tree_util.tree_flatten(result)
        out_avals = tuple(self._result_aval(where, o) for o in out_leaves)
        in_avals = tuple(ShapedArray(tuple(s.shape), np.dtype(s.dtype)) for s in structs)
        k = self.batch_dims(*structs, **py_attrs) if callable(self.batch_dims) \
            else self.batch_dims
        _check_batch_dims(where, k, in_avals + out_avals)
        sig = KernelSignature(self, tuple(sorted(attrs.items())), in_avals, out_avals,
                              frozenset(self.nondiff_argnums), int(k))
        sig.check_aliases(where)
        outs = kernel_pair.call(sig, *arrays)
        return jax.tree_util.tree_unflatten(out_tree, outs)

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
        return {k: _convert_attr(where, k, v, self.attr_types.get(k)) for k, v in values.items()}

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
            if not hasattr(a, "dtype") or not hasattr(a, "shape"):
                try:
                    a = jnp.asarray(a)
                except TypeError as e:
                    raise KernelError(f"{where}: argument {self._argname(i)!r} must be an "
                                      f"array; received {type(a).__name__}") from e
            arrays.append(a)
        return arrays

    def _result_aval(self, where: str, o: Any) -> Any:
        if not hasattr(o, "shape") or not hasattr(o, "dtype"):
            raise KernelError(f"{where}: the result spec must be a pytree of "
                              f"jax.ShapeDtypeStruct; got a leaf {o!r}")
        shape = tuple(o.shape)
        if any(not isinstance(d, (int, np.integer)) or d < 0 for d in shape):
            raise KernelError(f"{where}: the result spec declares shape {shape}; dimensions "
                              f"must be non-negative integers")
        return ShapedArray(tuple(int(d) for d in shape), np.dtype(o.dtype))


def _check_batch_dims(where: str, k: Any, avals: tuple) -> None:
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 0:
        raise KernelError(f"{where}: batch_dims must be an int >= 0 (or a function of the "
                          f"arguments returning one); received {k!r}")
    if k and (any(len(a.shape) < k for a in avals)
              or len({tuple(a.shape[:k]) for a in avals}) != 1):
        raise KernelError(
            f"{where}: batch_dims={k}, so every array argument and result must share the "
            f"same {k} leading dimension(s); got shapes {[list(a.shape) for a in avals]}")


def kernel(forward: Any, adjoint: Any = None, tangent: Any = None, *, result: Any,
           platforms: Sequence[str] | None = None, vmap: str = "loop",
           name: str | None = None, arg_names: Sequence[str] | None = None,
           dtypes: Sequence[Any] | None = ("float32", "float64"),
           attrs: Mapping[str, Any] | None = None, check: Callable | None = None,
           nondiff_argnums: Sequence[int] = (), namespace: str | None = None,
           pass_outputs: bool = True, aliases: Mapping[str, Mapping[int, int]] | None = None,
           linear: bool = False, transpose: Any = None,
           batch_dims: int | Callable[..., int] = 0) -> Kernel:
    """Turn XLA FFI targets into one differentiable JAX function.

    Calling conventions (``...`` = the static keyword arguments, passed as FFI
    attributes of every call; (co)tangents exist only for floating outputs/inputs not
    in ``nondiff_argnums``)::

        forward(*primals, ...)                         -> outputs
        adjoint(*primals, *outputs, *cotangents, ...)  -> one cotangent per diff. input
        tangent(*primals, *outputs, *tangents, ...)    -> one tangent per diff. output

    ``grad``/``vjp``/``jacrev`` use the adjoint, ``jvp``/``jacfwd`` the tangent; either
    may be omitted (the transformation that needs it then raises `MissingRuleError`).
    A guide with a complete example is docs/guides/kernels.md.

    Args:
      forward: the forward target: a registered target name, a PyCapsule (registered
        for you under ``f"{namespace or 'user'}.{name}_forward"``), or a dict
        ``{platform: name or capsule}`` for per-platform targets.
      adjoint: the adjoint (VJP) target, same forms.
      tangent: the tangent (JVP) target, same forms.
      result: a pytree of ``jax.ShapeDtypeStruct``, or a function of the arguments'
        ``ShapeDtypeStruct``s and the attributes returning one.
      platforms: platforms that string targets exist on (default ``("cpu",)``).
      vmap: ``"batch"`` (kernels take shared leading batch dims: one call under
        vmap) or ``"loop"`` (one call per batch element).
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
      pass_outputs: ``False``: the adjoint and tangent take no ``*outputs``
        (``adjoint(*primals, *cotangents)``), so ``jax.grad`` need not run the forward
        kernel when only the gradient is used.
      aliases: ``{role: {operand index: result index}}`` (role ``"forward"``,
        ``"adjoint"``, ``"tangent"`` or ``"transpose"``; indices into that kernel's
        operands and results): the result is written into the operand's buffer, as
        ``jax.ffi.ffi_call``'s ``input_output_aliases`` (XLA copies the operand first
        when it is still needed). Same shape and dtype; the kernel must be correct in
        place.
      linear: the forward kernel is linear in all its (array) arguments jointly. Then
        its tangent is the forward kernel on the tangents and its adjoint is
        ``transpose(*cotangents) -> one cotangent per argument``: derivatives of every
        order work. Give ``transpose`` instead of ``adjoint``/``tangent``.
      transpose: the transpose target of a linear kernel, same forms as ``forward``.
      batch_dims: the number of leading dimensions, shared by every operand and result of
        every role, along which the kernels are independent (an int, or a function of
        the arguments' structs and attributes returning one). Under `jit` on inputs
        sharded along them (automatic or explicit mesh axes), XLA runs one call per
        shard on local data instead of refusing the call.

    Returns:
      A `Kernel`, called as ``k(*arrays, **attrs)``.

    Raises:
      KernelError: a bad target (not a name, capsule or ``{platform: ...}`` dict; an
        invalid or reserved ``jaxbridge_`` name) or contradictory options (an unknown
        ``vmap``, ``linear`` with ``adjoint``/``tangent``, ``transpose`` without
        ``linear``, malformed ``attrs`` or ``aliases``). Calls raise it too, at trace
        time: a dtype outside ``dtypes``, an unknown or missing attribute or one of the
        wrong type, aliased buffers of different shapes; ``check`` raises its own.

    Example (compiles C++, so not run as a doctest; docs/getting-started.md and
    docs/guides/kernels.md run complete ones):
        >>> lib = jaxbridge.cpp.load("cube", sources=["cube.cc"])  # doctest: +SKIP
        >>> cube = jaxbridge.kernel(lib.handlers["CubeForward"],
        ...                         lib.handlers["CubeAdjoint"],
        ...                         result=lambda x, **_: x, vmap="batch",
        ...                         name="cube")  # doctest: +SKIP
        >>> jax.grad(lambda x: cube(x).sum())(jnp.ones(3))  # doctest: +SKIP

    This is how `jaxbridge.ops` declares the built-in softplus (its targets carry the
    reserved ``jaxbridge_`` prefix): the elementwise adjoint needs only ``x`` and
    overwrites the cotangent with the input cotangent::

        softplus = jaxbridge.kernel(
            "jaxbridge_softplus_fwd", "jaxbridge_softplus_adj", "jaxbridge_softplus_tan",
            result=lambda x, **_: x, vmap="batch", attrs={"beta": 1.0},
            pass_outputs=False, aliases={"adjoint": {1: 0}})
    """
    return make_kernel(forward, adjoint, tangent, result=result, platforms=platforms,
                       vmap=vmap, name=name, arg_names=arg_names, dtypes=dtypes, attrs=attrs,
                       check=check, nondiff_argnums=nondiff_argnums, namespace=namespace,
                       pass_outputs=pass_outputs, aliases=aliases, linear=linear,
                       transpose=transpose, batch_dims=batch_dims, builtin=False)


def make_kernel(forward: Any, adjoint: Any = None, tangent: Any = None, *, result: Any,
                platforms: Sequence[str] | None = None, vmap: str = "loop",
                name: str | None = None, arg_names: Sequence[str] | None = None,
                dtypes: Sequence[Any] | None = ("float32", "float64"),
                attrs: Mapping[str, Any] | None = None, check: Callable | None = None,
                nondiff_argnums: Sequence[int] = (), namespace: str | None = None,
                pass_outputs: bool = True,
                aliases: Mapping[str, Mapping[int, int]] | None = None,
                linear: bool = False, transpose: Any = None,
                batch_dims: int | Callable[..., int] = 0, builtin: bool = False) -> Kernel:
    """`kernel`, plus `builtin=True` for jaxbridge's own `jaxbridge_*` targets."""
    if vmap not in ("batch", "loop"):
        raise KernelError(f"jaxbridge.kernel: vmap must be 'batch' or 'loop', got {vmap!r}")
    if name is None:
        name = forward if isinstance(forward, str) else "kernel"
        name = name.removesuffix("_fwd").removesuffix("_forward")
    name = str(name)
    where = f"jaxbridge.kernel {name!r}"
    if linear and (adjoint is not None or tangent is not None):
        raise KernelError(f"{where}: a linear kernel's tangent is the forward kernel and its "
                          f"adjoint is the transpose kernel: pass transpose=..., not "
                          f"adjoint= or tangent=")
    if transpose is not None and not linear:
        raise KernelError(f"{where}: transpose= is for linear kernels (linear=True); give "
                          f"adjoint= for this one")
    fwd = _targets(forward, "forward", name, platforms, namespace, builtin)
    if not fwd:
        raise KernelError(f"{where}: a forward target is required")
    plats = platforms or list(fwd)
    targets = {"forward": fwd,
               "adjoint": _targets(adjoint, "adjoint", name, plats, namespace, builtin),
               "tangent": _targets(tangent, "tangent", name, plats, namespace, builtin),
               "transpose": _targets(transpose, "transpose", name, plats, namespace, builtin)}
    attrs = dict(attrs or {})
    for key, value in attrs.items():
        if _attr_type(value) is None:
            raise KernelError(f"{where}: attrs[{key!r}] must be a default value (bool, int, "
                              f"float, str or a NumPy scalar) or one of those types; "
                              f"received {value!r}")
    dts = None if dtypes is None else tuple(np.dtype(d) for d in dtypes)
    return Kernel(name, targets, result, vmap, dts,
                  None if arg_names is None else tuple(arg_names), attrs, check,
                  tuple(nondiff_argnums), bool(pass_outputs), _check_aliases_arg(name, aliases),
                  bool(linear), batch_dims)


def _check_aliases_arg(name: str, aliases: Any) -> dict[str, tuple[tuple[int, int], ...]]:
    """Normalize ``aliases`` to {role: ((operand, result), ...)}; shapes are checked per call."""
    where = f"jaxbridge.kernel {name!r}: argument 'aliases'"
    if aliases is None:
        return {}
    if not isinstance(aliases, Mapping):
        raise KernelError(f"{where}: expected a dict {{role: {{operand index: result index}}}}, "
                          f"received {type(aliases).__name__}")
    out = {}
    for role, pairs in aliases.items():
        if role not in ROLES:
            raise KernelError(f"{where}: unknown role {role!r}; expected one of {list(ROLES)}")
        if not isinstance(pairs, Mapping) or not all(
                isinstance(k, (int, np.integer)) and isinstance(v, (int, np.integer))
                and not isinstance(k, bool) and not isinstance(v, bool) and k >= 0 and v >= 0
                for k, v in pairs.items()):
            raise KernelError(f"{where}: {role!r} must map operand indices to result indices "
                              f"(non-negative ints), received {pairs!r}")
        if len(set(pairs.values())) != len(pairs):
            raise KernelError(f"{where}: {role!r}: two operands aliased to the same result "
                              f"({dict(pairs)})")
        out[role] = tuple(sorted((int(k), int(v)) for k, v in pairs.items()))
    return out

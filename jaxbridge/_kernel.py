"""C++/CUDA XLA FFI targets -> differentiable JAX functions (`jaxbridge.kernel`).

A kernel is up to three FFI targets with fixed calling conventions:

* forward  ``(*primals) -> outputs``
* adjoint  ``(*primals, *outputs, *cotangents) -> input cotangents``
* tangent  ``(*primals, *outputs, *tangents) -> output tangents`` (optional)

where cotangents/tangents exist only for floating-point outputs/inputs (integer
inputs get no cotangent and their tangents are not passed). Static keyword
arguments become FFI attributes of all three calls. With ``pass_outputs=False`` the
adjoint and tangent take no ``*outputs``: a reverse pass whose primal value is unused
(``jax.grad``) then never runs the forward kernel at all. ``aliases`` lets a kernel
write a result into an operand's buffer (``jax.ffi.ffi_call``'s
``input_output_aliases``), e.g. an elementwise adjoint overwriting its cotangent.

Design (the same as `_rules.py` for host functions): the forward primitive's JVP
emits a *linear* tangent primitive; its transpose is the adjoint primitive, whose
transpose is the tangent primitive again. `grad`/`vjp`/`jacrev` therefore need only
the adjoint kernel, `jvp`/`jacfwd` need the tangent kernel, and neither needs
`jax.custom_vjp` (which would rule out forward mode).

Batching is explicit: ``vmap="batch"`` means the kernels accept any number of
leading batch dimensions shared by every operand and result, so a `vmap` becomes
ONE call with a batch axis (unbatched operands are broadcast); ``vmap="loop"``
runs one call per batch element (`lax.map`).
"""

from __future__ import annotations

import ctypes
import functools
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._compat import (Primitive, ShapedArray, ad, auto_partitioned_devices, aval_of, batching,
                      ffi_lowering_aliased, is_zero, mlir, result_avals, zero_tangent)
from ._primitives import apply_via_jit, batch_rule, join_varying

__all__ = ["Kernel", "KernelError", "get_include", "kernel", "register_target"]

PLATFORMS = {"cpu": "cpu", "cuda": "CUDA", "rocm": "ROCM"}
ROLES = ("forward", "adjoint", "tangent")
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_RESERVED_PREFIX = "jaxbridge_"


from .errors import KernelError  # noqa: E402


# ----------------------------------------------------------------- include dirs
def get_include() -> str:
    """Directory with jaxbridge's C++ headers for kernel authors (``jaxbridge/*.h``).

    Use it together with ``jax.ffi.include_dir()`` (the XLA FFI headers):

        >>> import os, jaxbridge as jb
        >>> os.path.exists(os.path.join(jb.get_include(), "jaxbridge", "ffi_helpers.h"))
        True
    """
    here = Path(__file__).resolve().parent
    for cand in (here / "include", here.parent / "csrc" / "include"):
        if (cand / "jaxbridge" / "ffi_helpers.h").is_file():
            return str(cand)
    raise FileNotFoundError("jaxbridge: the C++ headers are missing from this installation "
                            f"(looked in {here / 'include'})")


# ----------------------------------------------------------------- target registry
_registry: dict[tuple[str, str], int] = {}
_registry_lock = threading.Lock()


def _capsule_pointer(capsule: Any) -> int:
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    name = ctypes.pythonapi.PyCapsule_GetName
    name.restype, name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    return int(get(capsule, name(capsule)) or 0)


def _platform(p: str) -> str:
    key = str(p).lower()
    if key == "gpu":
        key = "cuda"
    if key not in PLATFORMS:
        raise KernelError(f"jaxbridge: unknown platform {p!r}; expected one of "
                          f"{sorted(PLATFORMS)}")
    return key


def _check_name(name: str, *, builtin: bool = False) -> None:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise KernelError(f"jaxbridge: invalid FFI target name {name!r}: use letters, digits "
                          "and underscores, optionally namespaced with dots ('mylib.op_fwd')")
    if not builtin and name.startswith(_RESERVED_PREFIX):
        raise KernelError(f"jaxbridge: FFI target name {name!r}: the prefix "
                          f"{_RESERVED_PREFIX!r} is reserved for jaxbridge's built-in kernels")


def register_target(name: str, handler: Any, *, platform: str = "cpu",
                    namespace: str | None = None, _builtin: bool = False) -> str:
    """Register an XLA FFI handler (a PyCapsule) under a validated, namespaced name.

    Returns the full target name (``f"{namespace}.{name}"`` when a namespace is
    given). Registering the same handler twice is a no-op; registering a different
    handler under a name already taken raises.
    """
    full = f"{namespace}.{name}" if namespace else name
    _check_name(full, builtin=_builtin)
    plat = _platform(platform)
    if not type(handler).__name__ == "PyCapsule":
        raise KernelError(f"jaxbridge: handler for FFI target {full!r} must be a PyCapsule "
                          f"(got {type(handler).__name__}); wrap a ctypes function pointer "
                          "with jax.ffi.pycapsule")
    ptr = _capsule_pointer(handler)
    with _registry_lock:
        old = _registry.get((full, plat))
        if old is not None:
            if old != ptr:
                raise KernelError(f"jaxbridge: FFI target {full!r} on {plat} is already "
                                  "registered with a different handler")
            return full
        jax.ffi.register_ffi_target(full, handler, platform=PLATFORMS[plat])
        _registry[(full, plat)] = ptr
    return full


def is_registered(name: str, platform: str = "cpu") -> bool:
    return (name, _platform(platform)) in _registry


# ----------------------------------------------------------------- the Kernel object
def _targets(spec: Any, role: str, name: str, platforms: Sequence[str] | None,
             namespace: str | None, builtin: bool) -> dict[str, str]:
    """Normalize forward/adjoint/tangent to {platform: target name}, registering capsules."""
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
        plat = _platform(plat)
        if isinstance(target, str):
            # Referring to an already registered built-in target is fine; only
            # registering new names under the reserved prefix is refused.
            _check_name(target, builtin=builtin or is_registered(target, plat))
            out[plat] = target
        else:
            out[plat] = register_target(f"{name}_{role}", target, platform=plat,
                                        namespace=namespace or "user", _builtin=builtin)
    return out


def _attr_value(key: str, v: Any, fn: str) -> Any:
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return float(v)
    if isinstance(v, str):
        return v
    raise KernelError(f"{fn}: static argument {key!r} must be a bool, int, float or str "
                      f"(an FFI attribute); got {type(v).__name__}")


def _to_ffi(v: Any) -> Any:
    if isinstance(v, bool):
        return np.bool_(v)
    if isinstance(v, int):
        return np.int64(v)
    if isinstance(v, float):
        return np.float64(v)
    return v


class Kernel:
    """A differentiable JAX function backed by XLA FFI targets. See `kernel`."""

    def __init__(self, name: str, forward: dict, adjoint: dict, tangent: dict, result: Any,
                 vmap: str, dtypes: tuple | None, arg_names: tuple | None,
                 attrs: dict, check: Callable | None, nondiff_argnums: tuple,
                 pass_outputs: bool = True, aliases: dict | None = None):
        self.name = name
        self.forward, self.adjoint, self.tangent = forward, adjoint, tangent
        self.result = result
        self.vmap = vmap
        self.dtypes = dtypes
        self.arg_names = arg_names
        self.attrs = attrs
        self.check = check
        self.nondiff_argnums = nondiff_argnums
        self.pass_outputs = pass_outputs
        self.aliases = aliases or {}
        self.__name__ = name
        self.__doc__ = f"jaxbridge kernel {name!r} (FFI targets: {self.targets()})"

    def __repr__(self) -> str:
        return (f"Kernel({self.name!r}, forward={self.forward}, adjoint={self.adjoint}, "
                f"tangent={self.tangent}, vmap={self.vmap!r})")

    @property
    def platforms(self) -> tuple[str, ...]:
        return tuple(self.forward)

    def targets(self) -> list[str]:
        """Every FFI target name this kernel may emit."""
        names = {t for d in (self.forward, self.adjoint, self.tangent) for t in d.values()}
        return sorted(names)

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

    def target(self, role: str, platform: str) -> str:
        table = {"forward": self.forward, "adjoint": self.adjoint, "tangent": self.tangent}[role]
        if not table:
            if role == "tangent":
                raise KernelError(
                    f"jaxbridge: forward-mode differentiation (jvp, jacfwd, hessian, "
                    f"linearize) of kernel {self.name!r} needs a tangent kernel, and none "
                    f"was given. Pass tangent=<FFI target> to jaxbridge.kernel, or use "
                    f"reverse mode (grad, vjp, jacrev), which uses the adjoint kernel.")
            raise KernelError(
                f"jaxbridge: reverse-mode differentiation (grad, vjp, jacrev) of kernel "
                f"{self.name!r} needs an adjoint kernel, and none was given. Pass "
                f"adjoint=<FFI target> to jaxbridge.kernel.")
        if platform not in table:
            raise KernelError(
                f"jaxbridge: kernel {self.name!r} has no {role} implementation for platform "
                f"{platform!r} (available: {sorted(table)})")
        return table[platform]

    # -- calling
    def __call__(self, *args: Any, **static: Any) -> Any:
        fn = f"jaxbridge kernel {self.name!r}"
        attrs = dict(self.attrs)
        for k, v in static.items():
            if self.attrs and k not in self.attrs:
                raise KernelError(f"{fn}: unknown static argument {k!r} (known: "
                                  f"{sorted(self.attrs)})")
            attrs[k] = v
        attrs = {k: _attr_value(k, v, fn) for k, v in attrs.items()}
        arrays = []
        for i, a in enumerate(args):
            if not hasattr(a, "dtype") or not hasattr(a, "shape"):
                try:
                    a = jnp.asarray(a)
                except TypeError as e:
                    raise KernelError(f"{fn}: argument {self._argname(i)!r} must be an array; "
                                      f"got {type(a).__name__}") from e
            arrays.append(a)
        structs = [jax.ShapeDtypeStruct(np.shape(a), a.dtype) for a in arrays]
        if self.dtypes is not None:
            for i, s in enumerate(structs):
                if i in self.nondiff_argnums:
                    continue
                if np.dtype(s.dtype) not in self.dtypes:
                    raise KernelError(
                        f"{fn}: argument {self._argname(i)!r}: expected dtype "
                        f"{' or '.join(d.name for d in self.dtypes)}, received "
                        f"{np.dtype(s.dtype).name} (shape {tuple(s.shape)})")
        if self.check is not None:
            self.check(*structs, **attrs)
        result = self.result(*structs, **attrs) if callable(self.result) else self.result
        out_leaves, out_tree = jax.tree_util.tree_flatten(result)
        for o in out_leaves:
            if not hasattr(o, "shape") or not hasattr(o, "dtype"):
                raise KernelError(f"{fn}: result spec must be a pytree of "
                                  f"jax.ShapeDtypeStruct; got a leaf {o!r}")
        spec = _Spec(self, tuple(sorted(attrs.items())),
                     tuple(ShapedArray(tuple(s.shape), np.dtype(s.dtype)) for s in structs),
                     tuple(ShapedArray(tuple(o.shape), np.dtype(o.dtype)) for o in out_leaves),
                     frozenset(self.nondiff_argnums))
        spec.check_aliases(fn)
        outs = kernel_call_p.bind(*join_varying(list(arrays)), spec=spec)
        return jax.tree_util.tree_unflatten(out_tree, outs)


def kernel(forward: Any, adjoint: Any = None, tangent: Any = None, *, result: Any,
           platforms: Sequence[str] | None = None, vmap: str = "loop", name: str | None = None,
           arg_names: Sequence[str] | None = None,
           dtypes: Sequence[Any] | None = ("float32", "float64"),
           attrs: Mapping[str, Any] | None = None, check: Callable | None = None,
           nondiff_argnums: Sequence[int] = (), namespace: str | None = None,
           pass_outputs: bool = True, aliases: Mapping[str, Mapping[int, int]] | None = None,
           _builtin: bool = False) -> Kernel:
    """Turn XLA FFI targets into one differentiable JAX function.

    Args:
      forward: the forward target: a registered target name, a PyCapsule (registered
        for you under ``f"{namespace or 'user'}.{name}_forward"``), or a dict
        ``{platform: name or capsule}`` for per-platform targets.
      adjoint: the adjoint (VJP) target, same forms; needed for ``grad``.
      tangent: the tangent (JVP) target, same forms; needed for ``jvp``/``jacfwd``.
      result: a pytree of ``jax.ShapeDtypeStruct``, or a function of the arguments'
        ``ShapeDtypeStruct``s and the static keyword arguments returning one.
      platforms: platforms the string targets exist on (default ``("cpu",)``).
      vmap: ``"batch"`` (kernels take shared leading batch dims: one call under
        vmap) or ``"loop"`` (one call per batch element).
      arg_names: names of the positional arguments, for error messages.
      dtypes: allowed dtypes of the (differentiable) array arguments; None: any.
      attrs: default static keyword arguments (FFI attributes); when given, other
        keywords are rejected.
      check: ``check(*arg_structs, **attrs)`` raising on bad input at trace time.
      nondiff_argnums: positional arguments that are never differentiated (integer
        index arrays, say); they get no cotangent and are exempt from ``dtypes``.
      namespace: namespace for targets registered from capsules.
      pass_outputs: whether the adjoint and tangent kernels take the forward's
        outputs (default). ``False``: they are called as ``adjoint(*primals,
        *cotangents)`` and ``tangent(*primals, *tangents)``, so ``jax.grad`` does not
        run the forward kernel when only the gradient is used.
      aliases: ``{role: {operand index: result index}}`` with role ``"forward"``,
        ``"adjoint"`` or ``"tangent"`` and indices into that kernel's operands and
        results (the calling conventions above): the result is written into the
        operand's buffer, as ``jax.ffi.ffi_call``'s ``input_output_aliases`` (XLA
        copies the operand first when it is still needed elsewhere). The two must
        have the same shape and dtype, and the kernel must be correct in place.

    Example (the built-in softplus: an elementwise adjoint needs only ``x`` and
    overwrites the cotangent with the input cotangent)::

        softplus = jaxbridge.kernel(
            "jaxbridge_softplus_fwd", "jaxbridge_softplus_adj", "jaxbridge_softplus_tan",
            result=lambda x, **_: x, vmap="batch", attrs={"beta": 1.0},
            pass_outputs=False, aliases={"adjoint": {1: 0}})
    """
    if vmap not in ("batch", "loop"):
        raise KernelError(f"jaxbridge.kernel: vmap must be 'batch' or 'loop', got {vmap!r}")
    if name is None:
        name = forward if isinstance(forward, str) else "kernel"
        name = name.removesuffix("_fwd").removesuffix("_forward")
    name = str(name)
    fwd = _targets(forward, "forward", name, platforms, namespace, _builtin)
    if not fwd:
        raise KernelError(f"jaxbridge.kernel {name!r}: a forward target is required")
    adj = _targets(adjoint, "adjoint", name, platforms or list(fwd), namespace, _builtin)
    tan = _targets(tangent, "tangent", name, platforms or list(fwd), namespace, _builtin)
    dts = None if dtypes is None else tuple(np.dtype(d) for d in dtypes)
    return Kernel(name, fwd, adj, tan, result, vmap, dts,
                  None if arg_names is None else tuple(arg_names), dict(attrs or {}), check,
                  tuple(nondiff_argnums), bool(pass_outputs), _check_aliases_arg(name, aliases))


def _check_aliases_arg(name: str, aliases: Any) -> dict[str, tuple[tuple[int, int], ...]]:
    """Normalize ``aliases`` to {role: ((operand, result), ...)}; shapes are checked per call."""
    fn = f"jaxbridge.kernel {name!r}: argument 'aliases'"
    if aliases is None:
        return {}
    if not isinstance(aliases, Mapping):
        raise KernelError(f"{fn}: expected a dict {{role: {{operand index: result index}}}}, "
                          f"received {type(aliases).__name__}")
    out = {}
    for role, pairs in aliases.items():
        if role not in ROLES:
            raise KernelError(f"{fn}: unknown role {role!r}; expected one of {list(ROLES)}")
        if not isinstance(pairs, Mapping) or not all(
                isinstance(k, (int, np.integer)) and isinstance(v, (int, np.integer))
                and not isinstance(k, bool) and not isinstance(v, bool) and k >= 0 and v >= 0
                for k, v in pairs.items()):
            raise KernelError(f"{fn}: {role!r} must map operand indices to result indices "
                              f"(non-negative ints), received {pairs!r}")
        if len(set(pairs.values())) != len(pairs):
            raise KernelError(f"{fn}: {role!r}: two operands aliased to the same result "
                              f"({dict(pairs)})")
        out[role] = tuple(sorted((int(k), int(v)) for k, v in pairs.items()))
    return out


# ----------------------------------------------------------------- primitives
class _Spec:
    """Hashable static parameters of one kernel call (all three primitives)."""

    __slots__ = ("kernel", "attrs", "in_avals", "out_avals", "nondiff", "diff_in",
                 "diff_out", "_hash")

    def __init__(self, kernel: Kernel, attrs: tuple, in_avals: tuple, out_avals: tuple,
                 nondiff: frozenset):
        self.kernel, self.attrs = kernel, attrs
        self.in_avals, self.out_avals, self.nondiff = in_avals, out_avals, nondiff
        self.diff_in = tuple(i not in nondiff and jnp.issubdtype(a.dtype, jnp.inexact)
                             for i, a in enumerate(in_avals))
        self.diff_out = tuple(jnp.issubdtype(a.dtype, jnp.inexact) for a in out_avals)
        self._hash = hash((id(kernel), attrs, in_avals, out_avals, nondiff))

    def _key(self) -> tuple:
        return (id(self.kernel), self.attrs, self.in_avals, self.out_avals, self.nondiff)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, _Spec) and self._key() == other._key()

    def __repr__(self) -> str:
        return f"KernelSpec({self.kernel.name!r}, attrs={dict(self.attrs)})"

    def batched(self, size: int) -> _Spec:
        pre = lambda a: ShapedArray((size, *a.shape), a.dtype)  # noqa: E731
        return _Spec(self.kernel, self.attrs, tuple(map(pre, self.in_avals)),
                     tuple(map(pre, self.out_avals)), self.nondiff)

    def fixed_avals(self) -> list:
        """Operands the tangent/adjoint kernels take before the (co)tangents."""
        return list(self.in_avals) + (list(self.out_avals) if self.kernel.pass_outputs else [])

    @property
    def n_fixed(self) -> int:
        return len(self.fixed_avals())

    def role_avals(self, role: str) -> tuple[list, list]:
        """(operand avals, result avals) of the kernel playing `role`."""
        if role == "forward":
            return list(self.in_avals), list(self.out_avals)
        if role == "adjoint":
            return self.fixed_avals() + self.tan_avals(), self.adj_avals()
        return self.fixed_avals() + self.adj_avals(), self.tan_avals()

    def check_aliases(self, fn: str) -> None:
        """Raise unless every declared alias pairs an operand and a result of one type."""
        for role, pairs in self.kernel.aliases.items():
            operands, results = self.role_avals(role)
            for o, r in pairs:
                if o >= len(operands) or r >= len(results):
                    raise KernelError(
                        f"{fn}: aliases[{role!r}] maps operand {o} to result {r}, but the "
                        f"{role} kernel has {len(operands)} operands and {len(results)} "
                        "results here")
                a, b = operands[o], results[r]
                if (a.shape, a.dtype) != (b.shape, b.dtype):
                    raise KernelError(
                        f"{fn}: aliases[{role!r}] maps operand {o} ({a.dtype.name}"
                        f"{list(a.shape)}) to result {r} ({b.dtype.name}{list(b.shape)}); "
                        "aliased buffers need the same shape and dtype")

    def tan_avals(self) -> list:
        return [a for a, d in zip(self.out_avals, self.diff_out) if d]

    def adj_avals(self) -> list:
        return [a for a, d in zip(self.in_avals, self.diff_in) if d]

    def ffi_attrs(self) -> dict:
        return {k: _to_ffi(v) for k, v in self.attrs}


kernel_call_p = Primitive("jaxbridge_kernel")
kernel_tan_p = Primitive("jaxbridge_kernel_tangent")
kernel_adj_p = Primitive("jaxbridge_kernel_adjoint")
_ROLE = {kernel_call_p: "forward", kernel_tan_p: "tangent", kernel_adj_p: "adjoint"}
for _p in _ROLE:
    _p.multiple_results = True

# Results vary over the same shard_map axes as the inputs (see _compat.result_avals).
kernel_call_p.def_abstract_eval(
    lambda *avals, spec: result_avals(avals, spec.out_avals, "jaxbridge kernel"))
kernel_tan_p.def_abstract_eval(
    lambda *avals, spec: result_avals(avals, spec.tan_avals(), "jaxbridge kernel"))
kernel_adj_p.def_abstract_eval(
    lambda *avals, spec: result_avals(avals, spec.adj_avals(), "jaxbridge kernel"))


def _impl(prim: Primitive, *args: Any, spec: _Spec) -> Any:
    role = _ROLE[prim]
    if role != "forward":
        # Fail before compiling, with the clear message (missing tangent/adjoint).
        plat = jax.default_backend()
        spec.kernel.target(role, "cuda" if plat == "gpu" else plat)
    return apply_via_jit(prim, *args, spec=spec)


for _p in _ROLE:
    _p.def_impl(functools.partial(_impl, _p))


def _lower(prim: Primitive, platform: str, ctx: Any, *args: Any, spec: _Spec) -> Any:
    target = spec.kernel.target(_ROLE[prim], platform)
    devices = auto_partitioned_devices(ctx)
    if devices > 1:  # XLA would gather the operands: say so instead (issue: no silent gather)
        raise KernelError(
            f"jaxbridge kernel {target!r} is compiled into a computation partitioned over "
            f"{devices} devices, where XLA would gather its inputs onto every device. Call it "
            f"inside jax.shard_map (it then runs once per shard on local data).")
    aliases = spec.kernel.aliases.get(_ROLE[prim], ())
    return ffi_lowering_aliased(target, aliases)(ctx, *args, **spec.ffi_attrs())


for _p in _ROLE:
    for _plat in PLATFORMS:
        mlir.register_lowering(_p, functools.partial(_lower, _p, _plat), platform=_plat)


# ----------------------------------------------------------------- forward mode
def _zeros_like_aval(a: Any) -> Any:
    return jnp.zeros(a.shape, a.dtype)


def _call_jvp(primals: Sequence[Any], tangents: Sequence[Any], *, spec: _Spec):
    outs = kernel_call_p.bind(*primals, spec=spec)
    live = [d and not is_zero(t) for d, t in zip(spec.diff_in, tangents)]
    zeros = [zero_tangent(aval_of(o)) for o in outs]
    if not any(live):
        return outs, zeros
    tans = [_zeros_like_aval(a) if is_zero(t) else t
            for t, a, d in zip(tangents, spec.in_avals, spec.diff_in) if d]
    fixed = (*primals, *outs) if spec.kernel.pass_outputs else primals
    out_t = iter(kernel_tan_p.bind(*fixed, *tans, spec=spec))
    return outs, [next(out_t) if d else z for d, z in zip(spec.diff_out, zeros)]


ad.primitive_jvps[kernel_call_p] = _call_jvp


def _linear_jvp(prim: Primitive):
    def jvp(primals, tangents, *, spec: _Spec):
        out = prim.bind(*primals, spec=spec)
        n = spec.n_fixed
        if any(not is_zero(t) for t in tangents[:n]):
            raise KernelError(
                f"jaxbridge: a second-order derivative of kernel {spec.kernel.name!r} would "
                f"differentiate its {_ROLE[prim]} kernel with respect to the primal inputs, "
                "which C++ kernels do not provide. Compose first-order derivatives instead "
                "(e.g. jacrev of a function of the gradient is not supported).")
        lin = [_zeros_like_aval(aval_of(p)) if is_zero(t) else t
               for t, p in zip(tangents[n:], primals[n:])]
        return out, prim.bind(*primals[:n], *lin, spec=spec)

    return jvp


ad.primitive_jvps[kernel_tan_p] = _linear_jvp(kernel_tan_p)
ad.primitive_jvps[kernel_adj_p] = _linear_jvp(kernel_adj_p)


# ----------------------------------------------------------------- reverse mode
def _transpose(to: Primitive, ct_avals: Callable[[_Spec], list]):
    def rule(cts, *operands, spec: _Spec):
        n = spec.n_fixed
        fixed = operands[:n]
        if any(ad.is_undefined_primal(x) for x in fixed):
            raise KernelError(f"jaxbridge: kernel {spec.kernel.name!r}: cannot transpose a "
                              "derivative kernel with respect to its primal inputs")
        linear = operands[n:]
        if all(is_zero(c) for c in cts):
            return [None] * n + [ad.Zero(x.aval) for x in linear]
        cts = [_zeros_like_aval(a) if is_zero(c) else c for c, a in zip(cts, ct_avals(spec))]
        return [None] * n + list(to.bind(*fixed, *cts, spec=spec))

    return rule


ad.primitive_transposes[kernel_tan_p] = _transpose(kernel_adj_p, _Spec.tan_avals)
ad.primitive_transposes[kernel_adj_p] = _transpose(kernel_tan_p, _Spec.adj_avals)


# ----------------------------------------------------------------- vmap
for _p in _ROLE:
    batching.primitive_batchers[_p] = batch_rule(_p, lambda spec: spec.kernel.vmap == "batch")

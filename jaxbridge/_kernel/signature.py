"""What a kernel call depends on, frozen.

* `KernelSpec`: a kernel's targets and options (what `jaxbridge.kernel` was given).
* `CallAvals`: the abstract values of one call -- inputs, outputs, residuals -- and the
  names its messages give them.
* `KernelSignature`: one call -- the spec, attributes, abstract values -- as the
  parameter of the derivative-pair primitives (`jaxbridge._core.pair.Signature`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .._core.checks import check_alias_types, is_differentiable, refuse_gather
from .._core.jaxapi import (
    ShapedArray,
    ffi_lowering_aliased,
    hold_weakly_in_jax_caches,
    mlir,
    set_num_batch_dims,
)
from ..errors import KernelError, MissingRuleError
from . import guard
from .registry import make_batch_partitionable

__all__ = ["ROLES", "KernelSpec", "CallAvals", "KernelSignature"]

ROLES = ("forward", "forward_with_residuals", "vjp", "jvp", "transpose")


@dataclasses.dataclass(frozen=True, eq=False)
class KernelSpec:
    """What `jaxbridge.kernel` was given, checked and normalized, as one immutable value
    (compared by identity: it holds the user's callables)."""

    name: str
    forward: Mapping[str, str]          # {platform: FFI target name}
    vjp: Mapping[str, str]
    jvp: Mapping[str, str]
    transpose: Mapping[str, str]
    result: Any                         # a pytree of ShapeDtypeStruct, or a function
    vmap: str                           # "loop" | "vectorized"
    dtypes: tuple | None                # allowed dtypes of differentiable arguments
    arg_names: tuple | None
    attrs: Mapping[str, Any]            # {name: default value or type}
    check: Callable | None
    nondiff_argnums: tuple
    pass_outputs: bool
    aliases: Mapping[str, tuple]        # {role: ((operand, result), ...)}
    linear: bool
    batch_dims: int | Callable[..., int]
    residuals: Any = None               # like `result`; None: no residuals
    forward_with_residuals: Mapping[str, str] = dataclasses.field(default_factory=dict)
    guard_outputs: bool = False         # every call checked (guard.py)

    def table(self, role: str) -> Mapping[str, str]:
        return {"forward": self.forward, "vjp": self.vjp, "jvp": self.jvp,
                "transpose": self.transpose,
                "forward_with_residuals": self.forward_with_residuals}[role]

    def target(self, role: str, platform: str | None) -> str:
        """The FFI target of `role` on `platform` (KernelError if there is none)."""
        table = self.table(role)
        if platform is None or platform not in table:
            raise KernelError(
                f"jaxbridge: kernel {self.name!r} has no {role} implementation for platform "
                f"{platform!r} (available: {sorted(table)})")
        return table[platform]

    def targets(self) -> list[str]:
        """Every FFI target name the kernel may emit."""
        return sorted({t for role in ROLES for t in self.table(role).values()})


@dataclasses.dataclass(frozen=True)
class CallAvals:
    """The abstract values of one kernel call, and the names messages give them.

    Attributes:
      inputs: the array arguments' avals.
      outputs: the outputs' (the result's leaves').
      residuals: the residuals' (the leaves of ``residuals=``; empty without).
      nondiff: the indices of arguments in ``nondiff_argnums``.
      num_batch_dims: leading dimensions XLA may split the call along.
      input_names, output_names, residual_names: for messages (not compared).
    """

    inputs: tuple
    outputs: tuple
    residuals: tuple = ()
    nondiff: frozenset = frozenset()
    num_batch_dims: int = 0
    input_names: tuple = dataclasses.field(default=(), compare=False)
    output_names: tuple = dataclasses.field(default=(), compare=False)
    residual_names: tuple = dataclasses.field(default=(), compare=False)

    def batched(self, size: int) -> CallAvals:
        """Every aval with a leading axis of `size` (a vectorized vmap)."""
        def pre(avals: tuple) -> tuple:
            return tuple(ShapedArray((size, *a.shape), a.dtype) for a in avals)
        return dataclasses.replace(
            self, inputs=pre(self.inputs), outputs=pre(self.outputs),
            residuals=pre(self.residuals),
            num_batch_dims=self.num_batch_dims + 1 if self.num_batch_dims else 0)


class KernelSignature:
    """Hashable static description of one kernel call (`jaxbridge._core.pair.Signature`).

    With residuals, a call nobody differentiates runs the plain forward target (its
    results: the outputs); `with_residuals()` is the call the derivatives need, whose
    forward also returns the residuals, after the outputs (from the
    ``forward_with_residuals`` target, or from the forward target itself when the
    kernel has no separate one: then every call returns them).
    """

    __slots__ = ("spec", "attrs", "avals", "residual_outputs", "guarded", "in_avals",
                 "out_avals", "nondiff", "num_batch_dims", "diff_in", "tangent_outs",
                 "_key", "_hash", "__weakref__")
    prune_zero_tangents = False  # kernels take every differentiable tangent

    def __init__(self, spec: KernelSpec, attrs: tuple, avals: CallAvals, *,
                 residual_outputs: bool = False, guarded: bool = False):
        self.spec, self.attrs, self.avals = spec, attrs, avals
        self.residual_outputs = residual_outputs and bool(avals.residuals)
        self.guarded = guarded
        self.in_avals, self.nondiff = avals.inputs, avals.nondiff
        self.num_batch_dims = avals.num_batch_dims
        extra = avals.residuals if self.residual_outputs else ()
        self.out_avals = avals.outputs + extra
        self.diff_in = tuple(i not in self.nondiff and is_differentiable(a.dtype)
                             for i, a in enumerate(self.in_avals))
        self.tangent_outs = tuple(is_differentiable(a.dtype) for a in avals.outputs) + (
            (False,) * len(extra))
        # Attribute types are part of the key: 2 and 2.0 are equal but not the same FFI
        # attribute (int64 vs double) when no type was declared.
        types = tuple((k, type(v)) for k, v in attrs)
        self._key = (spec, attrs, types, avals, self.residual_outputs, guarded)
        self._hash = hash(self._key)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, KernelSignature) and self._key == other._key

    def __repr__(self) -> str:
        return f"KernelSignature({self.spec.name!r}, attrs={dict(self.attrs)})"

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def vectorized(self) -> bool:
        return self.spec.vmap == "vectorized"

    @property
    def n_outputs(self) -> int:
        """How many of the forward call's results are outputs (the rest: residuals)."""
        return len(self.avals.outputs)

    def batched(self, size: int) -> KernelSignature:
        return KernelSignature(self.spec, self.attrs, self.avals.batched(size),
                               residual_outputs=self.residual_outputs, guarded=self.guarded)

    def with_residuals(self) -> KernelSignature:
        """The call the derivatives need: its forward returns the residuals too."""
        if self.residual_outputs or not self.avals.residuals:
            return self
        return KernelSignature(self.spec, self.attrs, self.avals, residual_outputs=True,
                               guarded=self.guarded)

    # ---- the derivative pair
    def eager(self, role: str, args: Sequence[Any], nz: tuple) -> None:
        return None  # compiled, like JAX's own primitives

    def fixed(self, primals: Sequence[Any], outs: Sequence[Any]) -> list:
        """What the derivative kernels take before the (co)tangents: the primals, the
        outputs (unless ``pass_outputs=False``), the residuals."""
        if self.spec.linear:
            return []
        n = self.n_outputs
        kept = list(outs[:n]) if self.spec.pass_outputs else []
        return [*primals, *kept, *outs[n:]]

    def kernel_role(self, role: str) -> str:
        """The kernel that plays the pair's `role`: a linear kernel's JVP is its
        forward kernel, its VJP the transpose kernel; the forward of a call that
        returns residuals is the ``forward_with_residuals`` kernel where there is one."""
        if self.spec.linear and role != "forward":
            return "forward" if role == "jvp" else "transpose"
        if role == "forward" and self.residual_outputs and self.spec.forward_with_residuals:
            return "forward_with_residuals"
        return role

    def rule(self, role: str) -> str | None:
        return "opaque" if self.spec.table(self.kernel_role(role)) else None

    def traced(self, role: str, nz: tuple) -> Callable[..., list]:  # pragma: no cover
        raise AssertionError("kernels have no traced rules")

    def missing(self, role: str) -> MissingRuleError:
        name = self.name
        if role == "jvp":
            return MissingRuleError(
                f"jaxbridge: forward-mode differentiation (jvp, jacfwd, hessian, linearize) "
                f"of kernel {name!r} needs a JVP kernel, and none was given. Pass "
                f"jvp=<FFI target> to jaxbridge.kernel, or use reverse mode (grad, vjp, "
                f"jacrev), which uses the VJP kernel.")
        if role == "vjp":
            what = "transpose" if self.spec.linear else "vjp"
            return MissingRuleError(
                f"jaxbridge: reverse-mode differentiation (grad, vjp, jacrev) of kernel "
                f"{name!r} needs a {what.upper() if what == 'vjp' else what} kernel, and "
                f"none was given. Pass {what}=<FFI target> to jaxbridge.kernel.")
        return MissingRuleError(
            f"jaxbridge: differentiation of kernel {name!r} needs a VJP or JVP kernel, and "
            f"none was given. Pass vjp=... and/or jvp=... to jaxbridge.kernel (or "
            f"linear=True with transpose=...).")

    def second_order_error(self, role: str) -> MissingRuleError:
        return MissingRuleError(
            f"jaxbridge: a second-order derivative of kernel {self.name!r} would "
            f"differentiate its {role} kernel with respect to the primal inputs, which C++ "
            f"kernels do not provide. Compose first-order derivatives instead, or declare a "
            f"linear kernel (linear=True, transpose=...), whose derivatives of every order "
            f"are the kernel and its transpose.")

    def role_avals(self, role: str) -> tuple[list, list]:
        """(operand avals, result avals) of the kernel `role` (for aliases)."""
        outputs, residuals = list(self.avals.outputs), list(self.avals.residuals)
        tan = [a for a in outputs if is_differentiable(a.dtype)]
        adj = [a for a, d in zip(self.in_avals, self.diff_in) if d]
        if role == "forward_with_residuals" or (
                role == "forward" and not self.spec.forward_with_residuals):
            return list(self.in_avals), outputs + residuals
        if role == "forward":
            return list(self.in_avals), outputs
        fixed = self.fixed(list(self.in_avals), outputs + residuals)
        if role == "vjp" or role == "transpose":
            return fixed + tan, adj
        return fixed + adj, tan

    def result_names(self, role: str) -> list[str]:
        """The names of the results of the pair's `role` (for messages)."""
        av = self.avals
        if role == "forward":
            return list(av.output_names) + list(av.residual_names) * self.residual_outputs
        if role == "jvp":
            return [f"tangent of {n}" for n, a in zip(av.output_names, av.outputs)
                    if is_differentiable(a.dtype)]
        return [f"cotangent of argument {n!r}" for n, d in zip(av.input_names, self.diff_in)
                if d]

    def check_aliases(self, where: str) -> None:
        """Raise `AliasError` unless every declared alias pairs an operand and a result of
        one type."""
        for role, pairs in self.spec.aliases.items():
            operands, results = self.role_avals(role)
            check_alias_types(where, role, pairs, operands, results, f"the {role} kernel")

    def lower(self, role: str, ctx: Any, *args: Any, nz: tuple, platform: str | None
              ) -> Sequence[Any]:
        kernel_role = self.kernel_role(role)
        target = self.spec.target(kernel_role, platform)
        refuse_gather(
            ctx, f"jaxbridge kernel {self.name!r} (FFI target {target!r})",
            self.num_batch_dims, None if self.num_batch_dims else "declares no batch dimensions",
            fix="Declare jaxbridge.kernel(..., batch_dims=...) if it is independent along "
                "leading dimensions, or call it inside jax.shard_map (it then runs once per "
                "shard on local data).")
        aliases = self.spec.aliases.get(kernel_role, ())
        if self.guarded:
            call = guard.GuardedCall(
                target=target, platform=platform or "cpu", aliases=aliases,
                attrs=self.attrs, names=tuple(self.result_names(role)),
                context=f"jaxbridge kernel {self.name!r}, {kernel_role} target {target!r}",
                results=tuple(ctx.avals_out))
            return mlir.lower_fun(call.run, multiple_results=True)(ctx, *args)
        results = ffi_lowering_aliased(target, aliases)(ctx, *args, **dict(self.attrs))
        if self.num_batch_dims:
            make_batch_partitionable(target)
            set_num_batch_dims(results, self.num_batch_dims)
        return results


hold_weakly_in_jax_caches(KernelSignature)

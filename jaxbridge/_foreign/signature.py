"""What a compiled call of a host function depends on, frozen.

`CallSignature`: one call of a `Definition` (its `CallLayout`, see definition.py) as the
parameter of the derivative-pair primitives (`jaxbridge._core.pair.Signature`): eager
runs, traced rules, lowering to a host call. Equal calls share one signature object
(cached on the definition), so JAX's own caches hit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax

from .._core.jaxapi import hold_weakly_in_jax_caches
from ..errors import MissingRuleError
from . import runners
from .definition import CallLayout, Definition, Rule
from .hostcall import HostCallable, lower_host_call

__all__ = ["Rule", "Definition", "CallSignature"]


class CallSignature(CallLayout):
    """One concrete call of a `Definition`; see the module docstring."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._callables: dict[Any, HostCallable] = {}

    # ---- the derivative pair (jaxbridge._core.pair.Signature)
    def eager(self, role: str, args: Sequence[Any], nz: tuple) -> list | None:
        """Eager calls run the host code directly on the host (no XLA program: faster,
        and nothing for JAX to cache); arrays sharded over several devices take the
        compiled path, which splits or refuses the call as under `jit`."""
        devices = set()
        for a in args:
            if isinstance(a, jax.Array):
                devices |= a.devices()
        if len(devices) > 1:
            return None
        if self.batch_shape and role != "forward" and self.rule(role) == "traced":
            # A JAX-written rule of a vectorized call sees one element at a time (as
            # when compiled, see `traced`); the host filler would hand it the batch.
            return list(self.traced(role, nz)(*args))
        target = self.host_callable(role, nz)
        outs = target.run_eagerly(args)
        device = next(iter(devices), None)
        return [jax.device_put(o, device) for o in outs]

    def fixed(self, primals: Sequence[Any], outs: Sequence[Any]) -> list:
        return [] if self.defn.linear else [*primals, *outs]

    def rule(self, role: str) -> str | None:
        rule = self._rule_of(role)
        if rule is None:
            return None
        return "traced" if rule.kind == "jax" else "opaque"  # kind="numpy": a host call

    def traced(self, role: str, nz: tuple) -> Callable[..., list]:
        """The user's JAX-written rule as a function of flat operands (vmapped over any
        batch axes of a vectorized call)."""
        base = self.base
        rule = self._rule_of(role)
        if rule is None:
            raise self.missing(role)

        def run(*ops: Any) -> list:
            return runners.run_rule(base, role, rule, ops, nz, host=False)

        for _ in self.batch_shape:
            run = jax.vmap(run)
        return run

    def second_order_error(self, role: str) -> MissingRuleError:
        kind = "JVP" if role == "jvp" else "VJP"
        method = "defjvp" if role == "jvp" else "defvjp"
        return MissingRuleError(
            f"jaxbridge: a second-order derivative of foreign function {self.name!r} "
            f"differentiates its {kind} rule with respect to the primal inputs, but that rule "
            f"runs on the host and cannot be differentiated. Write it in JAX and register it "
            f"with {self.name}.{method}(rule, kind='jax'), or declare a linear function with "
            f"jb.foreign(..., linear=True) and a transpose rule.")

    def lower(self, role: str, ctx: Any, *args: Any, nz: tuple, platform: str | None
              ) -> Sequence[Any]:
        defn = self.defn
        return lower_host_call(ctx, self.host_callable(role, nz), *args, backend=defn.backend,
                               platform=platform, num_batch_dims=self.num_batch_dims,
                               on_mesh=defn.on_mesh,
                               aliases=defn.aliases if role == "forward" else ())

    def host_callable(self, role: str, nz: tuple = ()) -> HostCallable:
        """The host computation of `role` (one per role and `nz`, cached)."""
        key = (role, nz)
        target = self._callables.get(key)
        if target is None:
            fill, avals, what = runners.filler(self, role, self._rule_of(role), nz)
            if self.batch_shape and self.defn.vmap != "vectorized":
                fill = runners.loop_leading(
                    runners.filler(self.base, role, self._rule_of(role), nz)[0],
                    len(self.batch_shape))
            # A forward function may adapt its fill to this call (a leaner fill; one on
            # XLA's device buffers for CUDA): jaxbridge.torch's do (torch/_wrap.py).
            adapt = getattr(self.defn.fun, "jaxbridge_adapt_fill", None)
            device_fill = None
            if adapt is not None and role == "forward":
                fill, device_fill = adapt(self, fill)
            target = HostCallable(fill, avals, self.name, what, self.defn.copy_policy(role),
                                  device_fill)
            self._callables[key] = target
        return target


hold_weakly_in_jax_caches(CallSignature)

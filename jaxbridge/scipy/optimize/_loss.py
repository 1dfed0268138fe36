"""least_squares' robust losses rho(z), z = f^2, in JAX (SciPy's named ones)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

LOSSES = ("linear", "soft_l1", "huber", "cauchy", "arctan")


def rho(loss: str, z: jax.Array) -> jax.Array:
    """SciPy's robust loss rho(z), z = f^2 (scipy.optimize._lsq.least_squares)."""
    if loss == "linear":
        return z
    if loss == "soft_l1":
        return 2 * (jnp.sqrt(1 + z) - 1)
    if loss == "huber":
        safe = jnp.where(z <= 1, 1.0, z)
        return jnp.where(z <= 1, z, 2 * jnp.sqrt(safe) - 1)
    if loss == "cauchy":
        return jnp.log1p(z)
    return jnp.arctan(z)  # "arctan"

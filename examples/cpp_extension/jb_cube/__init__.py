"""Example extension: ``cube(x, factor=1.0) = factor * x**3`` as a jaxbridge kernel.

    >>> import jax, jax.numpy as jnp, jb_cube
    >>> jax.grad(lambda x: jb_cube.cube(x, factor=2.0).sum())(jnp.ones(3))
    Array([6., 6., 6.], dtype=float32)
"""

from jaxbridge import kernel

from . import _cube

_h = _cube.handlers()

cube = kernel(
    forward=_h["forward"], vjp=_h["vjp"], jvp=_h["jvp"],
    name="cube", namespace="jb_cube",           # targets: jb_cube.cube_{forward,...}
    result=lambda x, **_: x,                    # same shape and dtype as x
    attrs={"factor": 1.0},                      # static keyword -> FFI attribute
    vmap="vectorized",                          # elementwise: any leading dims
    arg_names=("x",),
)

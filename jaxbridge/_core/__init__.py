"""The derivative pair and what every part of jaxbridge shares (JAX version bridge, arrays,
extension loading)."""

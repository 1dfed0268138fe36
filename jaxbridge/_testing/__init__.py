"""Private implementation of :mod:`jaxbridge.testing` (the checker, its report, strategies)."""

"""The integrand of `quad` at whole Gauss-Kronrod intervals: one JAX call per interval.

SciPy's `quad` (QUADPACK's QAGSE, QAGPE) asks for the integrand one point at a time,
but always 21 points at once in effect: its 21-point Gauss-Kronrod rule (`qk21`)
evaluates the centre of an interval `[lo, hi]` and then the 20 nodes
`centre -/+ half * xgk[j]` (`centre = 0.5 (lo + hi)`, `half = 0.5 (hi - lo)`), and each
bisection of `[lo, hi]` is followed by the rule on both halves. One JAX dispatch costs
more than SciPy's whole evaluation of a NumPy integrand, so `NodeTable` evaluates the
nodes SciPy is about to ask for in one vectorized call, when SciPy asks for the centre
of an interval it expects (the limits first, then the halves of every interval
evaluated so far, both halves in one call), and serves SciPy's next requests from
that table.

The expected intervals are guesses (SciPy's arithmetic could round a node otherwise,
e.g. with fused multiply-adds, or a future SciPy could order its work differently),
so a guess is only ever used through an exact check: a request is served from the
table only when its abscissa equals a tabulated one bit for bit (the signed zero
excepted: zero is always evaluated directly), and every other request is evaluated
directly, as before. A wrong guess costs one wasted vectorized call, never a value.
An integrand that cannot be evaluated vectorized (a `jax.pure_callback` without a
`vmap_method`) is evaluated point by point, as before.

>>> table = NodeTable(lambda x: x * x, lambda xs: xs * xs, [(0.0, 2.0)])
>>> centre, *others = gk21_nodes(0.0, 2.0)
>>> table(centre), table(others[0]) == others[0] ** 2, table(0.3)
(1.0, True, 0.09)
>>> table.info()  # the centre and a node from the table, 0.3 directly
{'served': 2, 'direct': 1, 'evaluated': 21}
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

__all__ = ["XGK", "NodeTable", "gk21_nodes", "seed_intervals"]

# QUADPACK's qk21 abscissae (Gauss-Kronrod, 21 points on [-1, 1]), the nonzero ones;
# the centre is the 21st node.
XGK = (0.995657163025808080735527280689003, 0.973906528517171720077964012084452,
       0.930157491355708226001207180059508, 0.865063366688984510732096688423493,
       0.780817726586416897063717578345042, 0.679409568299024406234327365114874,
       0.562757134668604683339000099272694, 0.433395394129247190799265943165784,
       0.294392862701460198131126603103866, 0.148874338981631210884826001129720)

Interval = tuple[float, float]
_BATCH = 42  # abscissae per vectorized call (or a multiple)


def gk21_nodes(lo: float, hi: float) -> list[float]:
    """The 21 abscissae QUADPACK's `qk21` evaluates on `[lo, hi]`, computed as it does
    (in double precision: centre, half-length, then `centre -/+ half * xgk`).

    >>> gk21_nodes(-1.0, 1.0)[:3]
    [0.0, -0.9956571630258081, 0.9956571630258081]
    """
    centre, half = 0.5 * (lo + hi), 0.5 * (hi - lo)
    nodes = [centre]
    for x in XGK:
        absc = half * x
        nodes += [centre - absc, centre + absc]
    return nodes


def seed_intervals(a: float, b: float, points: Iterable[float] = ()) -> list[Interval]:
    """The intervals SciPy's `quad` starts from on finite limits: `[a, b]`, or with
    `points` the pieces between the sorted break points inside it (QAGPE); none for an
    infinite limit (QAGIE maps the range onto (0, 1]: no guess)."""
    if not (np.isfinite(a) and np.isfinite(b)) or a == b:
        return []
    lo, hi = min(a, b), max(a, b)
    inner = sorted({float(p) for p in points if lo < p < hi})
    edges = [a, *(inner if a < b else inner[::-1]), b]
    return list(zip(edges[:-1], edges[1:]))


class NodeTable:
    """`f(x)` for SciPy's requests, vectorized over whole expected intervals.

    one: `x -> f(x)` (a float), for every request the table does not hold.
    many: a float64 vector of abscissae -> `f` at each (same length); it computes what
      `one` computes, a point at a time.
    seeds: the intervals SciPy starts from (`seed_intervals`), evaluated together
      when SciPy first asks for the centre of one of them.
    """

    def __init__(self, one: Callable[[float], float],
                 many: Callable[[np.ndarray], np.ndarray], seeds: list[Interval]) -> None:
        self._one, self._many = one, many
        self._values: dict[float, float] = {}
        # centre of each interval of a group -> the group (evaluated together)
        self._expected: dict[float, tuple[Interval, ...]] = {}
        self._counts = {"served": 0, "direct": 0, "evaluated": 0}
        if seeds:
            self._expect(tuple(seeds))

    def __call__(self, x: float) -> float:
        x = float(x)
        if x != 0.0:  # (0.0 == -0.0: a signed zero is never served from the table)
            value = self._values.get(x)
            if value is not None:
                self._counts["served"] += 1
                return value
        group = self._expected.pop(x, None)
        if group is not None:
            self._evaluate(group)
            if x != 0.0:
                return self(x)
        self._counts["direct"] += 1
        return self._one(x)

    def info(self) -> dict:
        """How many requests were served from the table, evaluated directly, and how
        many abscissae were evaluated in vectorized calls."""
        return dict(self._counts)

    def _expect(self, group: tuple[Interval, ...]) -> None:
        for lo, hi in group:  # (whichever interval SciPy starts the group with)
            self._expected[0.5 * (lo + hi)] = group

    def _evaluate(self, group: tuple[Interval, ...]) -> None:
        """The rule's nodes on every interval of `group` in one call; then expect the
        halves of each (SciPy evaluates both halves of the interval it bisects)."""
        for lo, hi in group:
            self._expected.pop(0.5 * (lo + hi), None)
        xs = np.array([x for lo, hi in group for x in gk21_nodes(lo, hi)], np.float64)
        # padded to a multiple of 42 (a bisection's two intervals): one compiled shape
        # serves the limits' interval and every bisection
        padded = np.resize(xs, -(-xs.size // _BATCH) * _BATCH)
        try:
            values = np.asarray(self._many(padded), np.float64)[:xs.size]
        except Exception:  # noqa: BLE001 - e.g. a callback JAX cannot vmap: point by point
            self._expected.clear()  # (and an error of the function's own is raised by
            return                  # `one` at the point SciPy asks for, as before)
        self._counts["evaluated"] += xs.size
        self._values.update(zip(xs.tolist(), values.tolist()))
        for lo, hi in group:
            mid = 0.5 * (lo + hi)
            self._expect(((lo, mid), (mid, hi)))

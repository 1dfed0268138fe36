"""What `solve_ivp` returns and the method names: shared by `integrate` and `_events`
(its events / dense-output path), which would otherwise import each other."""

from __future__ import annotations

from typing import ClassVar

from ._common import Result

METHODS = ("RK23", "RK45", "DOP853", "Radau", "BDF", "LSODA")
IMPLICIT_METHODS = ("Radau", "BDF", "LSODA")


class OdeResult(Result):
    """What :func:`solve_ivp` returns: SciPy's `OdeResult` fields.

    `t` (T,), `y` (y0.shape + (T,)), `status` (0: reached the end; -1: a step failed,
    only with `on_failure="nan"`), `success`, and SciPy's counters `nfev`, `njev`,
    `nlu` (of the forward solve). `sol` (with ``dense_output=True``), `t_events` and
    `y_events` (with ``events=``) are set by the events path (`_events`), else None.
    """

    _fields = ("t", "y", "sol", "t_events", "y_events", "nfev", "njev", "nlu", "status",
               "success")
    _messages: ClassVar[dict[int, str]] = {
        0: "The solver successfully reached the end of the integration interval.",
        -1: "Integration step failed."}

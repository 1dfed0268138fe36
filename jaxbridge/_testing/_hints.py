"""Guesses at the bug behind a failed comparison of a rule with its reference ("sign
flipped", "off by a constant factor ~1.01", "Jacobian looks transposed", ...), read
from the numbers alone. `tests/test_testing_mutants.py` holds the checker to them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: Hints of `guess`, by the bug they name (the mutation tests look for these words).
HINTS = {
    "sign": "sign flipped (rule ~ -reference)",
    "transposed": "cotangent looks transposed",
    "jacobian_transposed": "Jacobian looks transposed (a matrix used where its transpose "
                           "belongs?)",
    "zeros": "rule returns zeros (does it ignore this input?)",
    "dropped": "wrong in {bad} of {n} entries, right in the others (a dropped term?)",
    "operator": "wrong in every entry, not by a sign, scale, transpose or swap (the "
                "derivative or transpose of another operator?)",
}


def guess(rule: np.ndarray, ref: np.ndarray, tol: np.ndarray | float,
          transposed: np.ndarray | None = None,
          swapped: Sequence[tuple[str, np.ndarray, np.ndarray]] = (),
          entries: bool = False) -> str:
    """A cheap guess at what is wrong when `rule` (what the rule gave) != `ref`.

    `transposed`: what the rule's result would be if it were transposed; `swapped`:
    (label, reference, tolerance) of the other inputs of the same shape (a rule that
    swapped two arguments matches one of them); `entries`: `rule` and `ref` are the
    entries of a Jacobian, so a rule right in some entries and wrong in others is told
    apart from one wrong everywhere."""
    if rule.shape != ref.shape:
        return f"wrong shape: got {list(rule.shape)}, expected {list(ref.shape)}"
    if not np.all(np.isfinite(rule)):
        return "non-finite values"
    if not np.all(np.isfinite(ref)) or not np.all(np.isfinite(tol)):
        return ("no finite-difference estimate: the function is not finite (or not "
                "smooth) near these inputs")
    big = np.abs(ref) > 1e-3 * np.max(np.abs(ref), initial=0.0)
    if not big.any():
        return "rule is non-zero where the reference is zero"
    if np.all(np.abs(rule + ref) <= tol):
        return HINTS["sign"]
    if transposed is not None and np.all(np.abs(transposed - ref) <= tol):
        return HINTS["transposed"]
    if entries and ref.ndim == 2 and ref.shape[0] == ref.shape[1] > 1 and \
            np.all(np.abs(rule.T - ref) <= tol):
        return HINTS["jacobian_transposed"]
    for label, other, other_tol in swapped:
        if other.shape == rule.shape and np.any(other != 0) and \
                np.all(np.abs(rule - other) <= other_tol):
            return f"looks like the derivative with respect to {label} (arguments swapped?)"
    if np.all(rule == 0):
        return HINTS["zeros"]
    k = np.median((rule[big] / ref[big]).real)
    if np.isfinite(k) and abs(k - 1) > 1e-3 and k != 0 and \
            np.all(np.abs(rule - k * ref) <= np.asarray(tol) * max(1.0, abs(k)) * 10):
        # enough digits that the factor does not print as 1 (1.002, not "~1")
        digits = max(3, 1 + int(np.ceil(-np.log10(abs(k - 1)))))
        return f"off by a constant factor ~{k:.{digits}g}"
    if np.iscomplexobj(rule) and np.all(np.abs(rule - np.conj(ref)) <= tol):
        return "looks complex-conjugated"
    if entries:
        good = np.abs(rule - ref) <= np.broadcast_to(tol, ref.shape)
        if good[big].any():
            return HINTS["dropped"].format(bad=int(np.sum(~good)), n=good.size)
        return HINTS["operator"]
    return ""

"""The planner's step-time fits: how long a step of B rows with k drafts (of tree width w) takes, by least squares
over what past steps took, forgetting old steps.

    plain(B)     = a0 + b0 * B                       `plain_features`
    verify(B, k) = a + b * B * (k + 1) + c * k + d * k * B + one offset per k in (0, max_k)
                                                     `verify_features` (over `step_features`); the planner
                                                     holds each offset towards 0 (`prior`)
    draft(B, k)  = k * (e + f * B)                   `draft_features`
"""
from __future__ import annotations

import operator

import numpy as np


def step_features(batch: int, k: int, width: int = 1) -> tuple[float, ...]:
    """A pass over B rows of 1 + e tokens, e = width * k extra (drafted) tokens per row."""
    e = width * k
    return 1.0, batch * (e + 1.0), float(e), float(e * batch)


def plain_features(batch: int, k: int = 0, width: int = 1) -> tuple[float, ...]:
    """A plain decoding step over B rows."""
    return 1.0, float(batch)


def verify_features(extras: list[int]):
    """`step_features` plus an indicator for each extra-token count e in `extras` (the options' e
    strictly between 0 and the largest)."""
    def features(batch: int, k: int, width: int = 1) -> tuple[float, ...]:
        return step_features(batch, k, width) + tuple(float(width * k == e) for e in extras)
    return features


def draft_features(batch: int, k: int, width: int = 1) -> tuple[float, ...]:
    """Proposer passes and rows drafted: a chain is k passes over B rows; a tree one pass over B rows
    (the candidates) and k - 1 over B * width (the branches)."""
    return float(k), float(batch + max(k - 1, 0) * batch * width if width > 1 else k * batch)


class StepTimeModel:
    """Least squares fit of a time on `features(B, k)`, forgetting old steps by `decay`.

    The fit is solved once after each `add`, when first needed, not per prediction: the planner
    prices every option on every step, and on a small model, whose steps are short, a solve per option
    is a sizeable share of the step. Predictions are plain Python over the solved coefficients: numpy's
    per-call cost, on the caches a model pass left cold, outweighs the few multiply-adds a price takes.
    For the same reason `add` only notes the step; the steps noted since the last fit join the sums at
    once, when the fit is next needed (or every `FOLD_AT` steps): updating the sums at each step was most
    of what feeding the planner cost where plain decoding stands unpriced (`reprice_every`). The measured
    costs are in docs/log.md.

    A step measured at under 1 / `STALL_RATIO` of what the fit, as last solved, predicts for it shows that the
    steps behind that prediction were slowed by something else (a thread descheduled for tens of milliseconds
    while the first steps ran): the fit keeps `STALL_KEEP` of their weight before adding it. Least squares with
    forgetting would otherwise carry such a step for as long as no later step runs with its features: an option
    priced at a stalled step is never chosen again, so it is never measured again. (Checked against the fit last
    solved only: solving at every step would cost what noting steps saves; the planner solves before each step
    it prices.)"""

    FOLD_AT = 64  # noted steps that join the sums even if no fit is asked for (adaptive=False is never priced)
    STALL_RATIO = 4.0  # a step this many times cheaper than predicted shows the steps behind the prediction stalled
    STALL_KEEP = 1e-4  # ... and they keep this share of their weight (a 1000x stall weighs as 0.1 usual step then)

    def __init__(self, decay: float = 0.98, ridge: float = 1e-9, features=step_features,
                 prior: tuple[float, ...] | None = None):
        """`prior`: per feature, the weight in steps (each step adds its feature row once) holding its
        coefficient at 0, past the `ridge` every one has (None: none)."""
        self.decay, self.ridge, self.features = decay, ridge, features
        n = len(features(1, 1))
        self.xtx = np.zeros((n, n))
        self.xty = np.zeros(n)
        self._prior = tuple(prior) if prior is not None else (0.0,) * n
        self._eye, self._prior_matrix = np.eye(n), np.diag(self._prior)
        self._coef: list[float] | None = None
        self._rows: dict[tuple[int, int, int], tuple[float, ...]] = {}  # feature rows per (B, k, width): a drain
        # revisits the same few
        self._noted: list[tuple[tuple[float, ...], float]] = []  # steps added since the sums were last updated

    def add(self, batch: int, k: int, seconds: float, width: int = 1) -> None:
        key = (batch, k, width)
        row = self._rows.get(key)
        if row is None:
            row = self._rows[key] = self.features(batch, k, width)
        if self._coef is not None and seconds * self.STALL_RATIO < self.predict_features(row):  # (solved: all folded)
            self.xtx *= self.STALL_KEEP
            self.xty *= self.STALL_KEEP
        self._noted.append((row, seconds))
        self._coef = None
        if len(self._noted) >= self.FOLD_AT:
            self._fold()

    def _fold(self) -> None:
        """The noted steps into the sums: of m steps, the i-th weighs decay^(m-1-i), the sums before them
        decay^m, as if each had been added alone."""
        m = len(self._noted)
        if not m:
            return
        x = np.array([row for row, _ in self._noted])
        y = np.array([seconds for _, seconds in self._noted])
        xw = x * (self.decay ** np.arange(m - 1, -1, -1.0))[:, None]
        self.xtx = self.xtx * self.decay ** m + xw.T @ x
        self.xty = self.xty * self.decay ** m + xw.T @ y
        self._noted.clear()

    @property
    def coef(self) -> list[float]:
        """The fitted coefficients, one per feature."""
        if self._coef is None:
            self._fold()
            xtx, xty = self.xtx.tolist(), self.xty.tolist()
            ridge = self.ridge * (sum(xtx[i][i] for i in range(len(xty))) or 1.0)
            if len(xty) == 2:  # the plain and draft fits: in closed form (numpy's per-call cost outweighs a 2x2 solve)
                (a, b), (c, d) = xtx
                a, d = a + ridge + self._prior[0], d + ridge + self._prior[1]
                det = a * d - b * c
                self._coef = [(d * xty[0] - b * xty[1]) / det, (a * xty[1] - c * xty[0]) / det]
            else:
                self._coef = np.linalg.solve(self.xtx + ridge * self._eye + self._prior_matrix, self.xty).tolist()
        return self._coef

    @property
    def fitted(self) -> bool:
        """Whether any step was added."""
        return bool(self._noted) or bool(self.xty.any())

    def predict(self, batch: int, k: int, width: int = 1) -> float:
        return self.predict_features(self.features(batch, k, width))

    def predict_features(self, features: tuple[float, ...]) -> float:
        """The prediction for one feature row (never below zero)."""
        return max(sum(map(operator.mul, features, self.coef)), 0.0)

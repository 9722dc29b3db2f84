"""Where rows stop: the chance that a row's token at each generated position is its last.

    h(n) = P(the token at generated position n ends the row (a stop token or string) | the row kept it)

A chain drafted past a row's stop is thrown away, so the tokens a step keeps depend on where its rows are
in their responses. The controller prices a step by its live rows' go-on profile

    G_i = mean over rows of prod_{t=0..i} (1 - h(L + t))        L: the tokens the row has generated

the chance that none of the row's tokens at L, ..., L + i is its last, so that draft i + 1, if accepted,
is kept. One stop rate for every position (the profile (1 - rate)^(i+1)) prices a drain badly where
responses end at similar lengths: on `tiny`, whose answers have a few fixed lengths, rows at 32-37 of a
batch of 64 were mostly at their answer's last token, so k = 1 kept 1.00-1.03 tokens a row where one rate
(a stop every ~9 tokens) expected 1.9, and speculating there lost.

h(n) is a ratio of counts at position n: the rows that kept a token there and those it ended. A step that
reaches n first forgets n's counts by `visit_decay`, so the last ~1 / (1 - visit_decay) steps at each
position dominate (the policy's lengths drift over an RL run). It is pulled towards the overall rate
(stops per kept token, forgotten by `decay` each step) with the weight of `prior_rows` rows, which is all
a position no row has reached has. Positions from `positions` - 1 on share one count.
"""
from __future__ import annotations

import numpy as np


class StopHazard:
    def __init__(self, decay: float = 0.99, visit_decay: float = 0.9, prior_rows: float = 2.0,
                 positions: int = 2048):
        if prior_rows <= 0:
            raise ValueError(f"prior_rows must be > 0 (a position no row reached has only the prior), got {prior_rows}")
        self.decay, self.visit_decay, self.prior_rows, self.positions = decay, visit_decay, prior_rows, positions
        self.kept = self.stops = 0.0  # decayed counts over all positions: tokens kept, rows a stop ended
        self.reached = np.zeros(positions)  # per position: decayed count of rows that kept a token there
        self.ended = np.zeros(positions)  # and of rows whose last token it was

    @property
    def rate(self) -> float:
        """Stops per kept token over the recent steps, at any position."""
        return self.stops / self.kept if self.kept else 0.0

    def observe(self, generated, kept, stopped) -> None:
        """One step: per row, the tokens it had generated before the step, the tokens it kept, and whether a
        stop token or string ended it."""
        generated, kept = np.asarray(generated, dtype=np.int64), np.asarray(kept, dtype=np.int64)
        stopped = np.asarray(stopped, dtype=bool) & (kept > 0)
        total = int(kept.sum())
        if not total:
            return
        self.kept = self.decay * self.kept + total
        self.stops = self.decay * self.stops + int(stopped.sum())
        last = self.positions - 1
        firsts = np.repeat(generated, kept)
        offsets = np.arange(total) - np.repeat(np.cumsum(kept) - kept, kept)  # 0, 1, ... within each row
        at = np.minimum(firsts + offsets, last)
        touched = np.unique(at)
        self.reached[touched] *= self.visit_decay
        self.ended[touched] *= self.visit_decay
        np.add.at(self.reached, at, 1.0)
        np.add.at(self.ended, np.minimum(generated + kept - 1, last)[stopped], 1.0)

    def hazard(self, positions: np.ndarray) -> np.ndarray:
        """h(n) at each generated position n."""
        n = np.minimum(positions, self.positions - 1)
        return (self.ended[n] + self.prior_rows * self.rate) / (self.reached[n] + self.prior_rows)

    def go_on(self, depth: int, generated=None) -> list[float]:
        """G_0, ..., G_{depth-1} for rows that have generated `generated` tokens each (module docstring); with
        no rows given, from the overall rate alone: (1 - rate)^(i+1)."""
        if generated is None or len(generated) == 0:
            g = 1.0 - self.rate
            return [g ** (i + 1) for i in range(depth)]
        n = np.asarray(generated, dtype=np.int64)[:, None] + np.arange(depth)
        return np.cumprod(1.0 - self.hazard(n), axis=1).mean(0).tolist()

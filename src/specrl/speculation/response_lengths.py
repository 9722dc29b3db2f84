"""Where responses end: the chance that a row goes on past each generated position, from the lengths of the
rows retired.

A chain drafted past a row's stop is thrown away, so the tokens a step keeps depend on where its rows are in
their responses. With one stop rate for every position, a drain's last rows, which are mostly at their
answer's last token, were priced as if mid-answer: on `tiny` at batch 64 the last row alone drafted several
tokens, in a step far dearer than a plain one, and kept only its one stop token.

The hazard at generated position t, the chance that the token there is the row's last given the row kept it,
is estimated as Kaplan-Meier does, from decayed counts of the retired rows' lengths m (tokens generated):

    ended[m]       rows a stop token or string ended after m tokens
    at_risk(t)     rows that kept a token at position t: every retired row longer than t, whether a stop
                   ended it or max_tokens cut it (a cut row could have gone on: it counts only as far as it got)
    h(t)           (ended[t + 1] + prior_rows * prior(t)) / (at_risk(t) + prior_rows)
    prior(t)       (h(t - 1) + pooled) / 2

each position pulled, with the weight of `prior_rows` rows, half towards the one before it and half towards
the pooled rate (all stops over all positions at risk). A position few rows reached, or none, leans on its
neighbour's hazard: on `tiny`, where few answers run past 10 tokens, the pooled rate alone priced a row at
10 as going on, while rows that reach 9 all stop at 10. Past the rows retired, the hazard returns to the
pooled rate within a few positions: a flat extrapolation of the last one (the longest row's end, near 1)
kept a GRPO drain's long last row on SmolLM2 decoding plainly for many steps. A row that has
generated L tokens keeps draft i + 1 of a step only if none of its tokens at L, ..., L + i is its last:

    G_i(L) = prod_{t = L .. L + i} (1 - h(t))

The counts are updated once per retirement, not per step or token, and each retired row's weight grows by
1 / `decay` (the older rows fade: the policy's lengths drift over an RL run), so a step pays nothing for them;
the hazards are recomputed at the first pricing after a retirement.
"""
from __future__ import annotations


class ResponseLengths:
    def __init__(self, decay: float = 0.98, prior_rows: float = 2.0):
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {decay}")
        if prior_rows <= 0:
            raise ValueError(f"prior_rows must be > 0 (a position no row reached has only the prior), got {prior_rows}")
        self.decay, self.prior_rows = decay, prior_rows
        self.ended: list[float] = []  # [m]: decayed rows a stop ended after m tokens (in units of `_weight`)
        self.retired: list[float] = []  # [m]: decayed rows retired after m tokens, ended or cut
        self._weight = 1.0  # the weight of the next row retired; the counts are scaled down when it grows large
        self._hazard: list[float] | None = None  # h(t), computed when first needed after a retirement
        self._pooled = 0.0  # stops over all positions at risk, computed with it

    def retire(self, lengths: list[int], stopped: list[bool]) -> None:
        """Rows left the batch: the tokens each generated, and whether a stop token or string ended it (else
        max_tokens cut it). Plain Python: a few rows at a time, where numpy's fixed per-call cost would
        outweigh the work."""
        for length, stop in zip(lengths, stopped):
            if length >= len(self.retired):
                grow = length + 1 - len(self.retired)
                self.ended += [0.0] * grow
                self.retired += [0.0] * grow
            self._weight /= self.decay
            self.retired[length] += self._weight
            if stop:
                self.ended[length] += self._weight
        if self._weight > 1e12:
            self.ended = [x / self._weight for x in self.ended]
            self.retired = [x / self._weight for x in self.retired]
            self._weight = 1.0
        self._hazard = None

    @property
    def hazard(self) -> list[float]:
        """h(0), h(1), ... up to the longest row retired (module docstring); past it, `beyond`."""
        if self._hazard is None:
            at_risk = self.retired[:]  # rows longer than t: suffix sums of `retired` past t
            for t in range(len(at_risk) - 2, -1, -1):
                at_risk[t] += at_risk[t + 1]
            at_risk = at_risk[1:] + [0.0]
            prior = self.prior_rows * self._weight  # in the counts' units
            self._pooled = h = sum(self.ended) / max(sum(at_risk), 1e-30)
            hazard = []
            for t in range(len(at_risk) - 1):
                h = (self.ended[t + 1] + prior * (h + self._pooled) / 2) / (at_risk[t] + prior)
                hazard.append(h)
            self._hazard = hazard
        return self._hazard

    def beyond(self, last: float, steps: int) -> float:
        """The hazard `steps` positions past the longest row retired, whose own is `last`: no row to pull it,
        so halfway to the pooled rate per position."""
        return self._pooled + (last - self._pooled) * 0.5 ** steps

    def go_on(self, generated: list[int], depth: int) -> list[float]:
        """G_0, ..., G_{depth-1} averaged over live rows that have generated `generated` tokens each (module
        docstring)."""
        positions: dict[int, int] = {}
        for n in generated:
            positions[n] = positions.get(n, 0) + 1
        hazard = self.hazard
        size, last = len(hazard), hazard[-1] if hazard else 0.0
        total = [0.0] * depth
        for start, rows in positions.items():
            kept = 1.0
            for i in range(depth):
                t = start + i
                kept *= 1.0 - (hazard[t] if t < size else self.beyond(last, t - size + 1))
                total[i] += rows * kept
        count = len(generated)
        return [g / count for g in total]

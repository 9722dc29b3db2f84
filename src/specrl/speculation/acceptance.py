"""Per-position acceptance of a draft, estimated from counts.

    c_j = P(draft j accepted | drafts 0..j-1 accepted)      conditional acceptance at position j
    prefix[j] = P(drafts 0..j all accepted) = c_0 c_1 ... c_j

Each c_j is a ratio of decayed counts: the rows that reached position j (its trials) and those of
them that accepted it. An observation adds its counts and first forgets the old ones by
`1 - smoothing`, so a step weighs in proportion to the rows it saw, and the last ~1/smoothing
observations dominate.

Estimating conditionals, not the prefix itself, matters when deeper positions are drafted less
often than shallow ones (an adaptive K that mostly drafts one token): position j is updated only by
observations that reached it, but its prefix moves with every position before it. When the first
position's acceptance falls (a new temperature, a policy that drifted), the deeper prefixes fall
with it instead of keeping their old values.

The prior each c_j starts from (held with the weight of `prior_rows` rows, forgotten like the counts) is
`prior` at position 0 and, deeper, the estimate of position j - 1. A position the planner has not
drafted lately keeps the prior it was given, so a fixed prior below a good draft's acceptance would price
long chains by the prior and never run them to learn better (the int8 self-draft, accepted 0.96 at
position 0, drafted K = 3 where K = 8 paid more). Borrowing from the position before errs the other
way where acceptance falls with depth (learned heads), and that error corrects itself: the long chains
it prices too high are run, and their counts replace the borrowed prior.
"""
from __future__ import annotations


class AcceptanceEstimate:
    def __init__(self, depth: int, prior: float, smoothing: float = 0.1, prior_rows: float = 0.0):
        """`prior`: the conditional acceptance assumed at every position before any observation, held
        with the weight of `prior_rows` rows (0: the first observation of a position replaces it)."""
        self.prior, self.smoothing = prior, smoothing
        self.trials = [0.0] * depth  # decayed counts of observed rows (plain lists: the planner updates them
        self.accepted = [0.0] * depth  # every speculative step, and numpy's per-call cost would be most of it)
        self.prior_weight = [float(prior_rows)] * depth  # decayed with the counts
        self._update_prefix()

    def _update_prefix(self) -> None:
        self.prefix, prior, product = [], self.prior, 1.0
        for trials, accepted, weight in zip(self.trials, self.accepted, self.prior_weight):
            prior = (accepted + weight * prior) / (trials + weight) if trials + weight > 0 else prior
            product *= prior  # prior: this position's conditional, and the prior of the next
            self.prefix.append(product)

    def expected(self, k: int) -> float:
        """Expected accepted drafts among the first k: sum of prefix[:k]."""
        return float(sum(self.prefix[:k]))

    def observe(self, trials, accepted, weight: float | None = None) -> None:
        """Add one observation: per position j, `trials[j]` rows reached it (their drafts 0..j-1 were
        accepted) and `accepted[j]` of them accepted draft j. Positions with no trials are left as they
        are. `weight`: give this observation that share of each position's estimate instead (a
        one-off re-measurement that must be noticed at once)."""
        for j, (t, a) in enumerate(zip(trials, accepted)):
            if t <= 0:
                continue
            held = self.trials[j] + self.prior_weight[j]
            if weight is None:
                keep = 1.0 - self.smoothing
            else:
                keep = min(1.0, t * (1.0 - weight) / (weight * held)) if held > 0 else 0.0
            self.trials[j] = keep * self.trials[j] + t
            self.accepted[j] = keep * self.accepted[j] + a
            self.prior_weight[j] *= keep
        self._update_prefix()

    def observe_accepted_prefix(self, rows: int, accepted_per_pos, weight: float | None = None) -> None:
        """One step over `rows` rows, given per position j how many rows accepted drafts 0..j (the
        engine's count along each row's accepted path): the rows that reached j are those that accepted
        through j - 1."""
        accepted = list(accepted_per_pos)
        self.observe([rows] + accepted[:-1], accepted, weight)


def expected_tokens(k: int, accept_prefix: list[float]) -> float:
    """tau(k): expected tokens emitted by a step with k drafts.

    accept_prefix[i] = P(drafts 0..i all accepted). With i.i.d. acceptance a this is
    a^(i+1) and tau(k) = (1 - a^(k+1)) / (1 - a).
    """
    return 1.0 + sum(accept_prefix[:k])

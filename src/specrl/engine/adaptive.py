"""Adaptive speculation: choose K (0 = plain decoding) for each step of the live batch.

The choice maximises expected tokens per second:

    rate(k) = tau(k) / T_step(B, k),   tau(k) = 1 + sum_{i<k} P(the first i+1 drafts all accepted)

T_step(B, k) is the measured wall time of a whole step (draft + verify + sampling +
bookkeeping) for a live batch of size about B, kept as an exponential moving average
per (batch bucket, k). P(first i+1 accepted) is the measured per-position acceptance,
also a moving average. Each (bucket, k) cell is tried once before it is trusted, so
the controller explores on real work and never pays for synthetic calibration.
Because k = 0 is always a candidate, speculation is switched off wherever it does
not pay: a draft that is slow or rarely accepted cannot make a rollout slower than
plain decoding, beyond the one exploratory step per cell.
"""
from __future__ import annotations

from dataclasses import dataclass


def batch_bucket(batch: int) -> int:
    """Exact below 8, then powers of two: step time varies smoothly with batch there."""
    if batch <= 8:
        return batch
    return 1 << (batch - 1).bit_length()


def expected_tokens(k: int, accept_prefix: list[float]) -> float:
    """tau(k): expected tokens emitted by a step with k drafts.

    accept_prefix[i] = P(drafts 0..i all accepted). With i.i.d. acceptance a this is
    a^(i+1) and tau(k) = (1 - a^(k+1)) / (1 - a).
    """
    return 1.0 + sum(accept_prefix[:k])


@dataclass
class SpeculationController:
    max_k: int  # largest K tried
    adaptive: bool = True  # False: always max_k
    smoothing: float = 0.2  # weight of the newest observation in the moving averages
    prior_acceptance: float = 0.7  # per-token acceptance assumed before any draft is verified

    def __post_init__(self):
        if self.max_k < 0:
            raise ValueError(f"num_speculative_tokens (K) must be >= 0, got {self.max_k}")
        self.step_time: dict[tuple[int, int], float] = {}
        self.accept_prefix = [self.prior_acceptance ** (i + 1) for i in range(self.max_k)]

    def choose(self, batch: int) -> int:
        if not self.adaptive or self.max_k == 0:
            return self.max_k
        bucket = batch_bucket(batch)
        untried = [k for k in range(self.max_k, -1, -1) if (bucket, k) not in self.step_time]
        if untried:
            return untried[0]
        return max(range(self.max_k + 1),
                   key=lambda k: expected_tokens(k, self.accept_prefix) / self.step_time[(bucket, k)])

    def observe(self, batch: int, k: int, seconds: float, accepted_per_pos: list[int]) -> None:
        """Record one step: its wall time and, per draft position, how many rows accepted it."""
        key, w = (batch_bucket(batch), k), self.smoothing
        self.step_time[key] = seconds if key not in self.step_time else (1 - w) * self.step_time[key] + w * seconds
        for i, count in enumerate(accepted_per_pos):
            self.accept_prefix[i] = (1 - w) * self.accept_prefix[i] + w * count / batch

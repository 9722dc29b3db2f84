"""Speculation policies: how many drafts K an iteration proposes.

A policy sees the live batch and its cached tokens and returns K (0 = off).
  FixedK     always K (the seed's setting: K = 3).
  AdaptiveK  the K among `candidates` with the highest expected tokens per second,
             acceptance_length(K) / iteration_time(B, K, kv); K = 0 when speculation
             does not pay at this batch (large batches, compute-bound verification).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from specrl.sim.acceptance import Acceptance, acceptance_length
from specrl.sim.iteration import Engine


@dataclass(frozen=True)
class FixedK:
    """Always propose `k` drafts (0 = speculation off)."""

    k: int

    def choose(self, engine: Engine, batch: int, kv_tokens: float) -> int:
        return self.k if engine.drafter is not None else 0


@dataclass
class AdaptiveK:
    """Pick K per iteration segment from the live batch and the expected acceptance.

    acceptance: the acceptance the policy believes in (e.g. measured so far).
    candidates: K values it may pick; include 0 to allow switching speculation off.
    """

    acceptance: Acceptance
    candidates: tuple[int, ...] = (0, 1, 2, 3, 4, 5, 7)
    _lengths: dict[int, float] = field(default_factory=dict, repr=False)

    def choose(self, engine: Engine, batch: int, kv_tokens: float) -> int:
        if engine.drafter is None:
            return 0
        best_k, best_rate = 0, -1.0
        for k in self.candidates:
            if k not in self._lengths:
                self._lengths[k] = acceptance_length(self.acceptance, k) if k else 1.0
            rate = self._lengths[k] / float(engine.iteration_time(batch, k, np.float64(kv_tokens)))
            if rate > best_rate:
                best_k, best_rate = k, rate
        return best_k

"""Speculation policies: how many drafts K an iteration proposes.

A policy sees the live batch and its cached tokens and returns K (0 = off); after each segment of
iterations it is told what they cost and what they accepted (`observe`), and `max_segment` caps the
iterations it commits to at once.
  FixedK     always K (the seed's setting: K = 3).
  PlannedK   the planner users get: the embedded engine's planner (`speculation.planner`), with its
             exploration, its fitted step costs, the acceptance it learns from the drafts its steps
             accept, and the never-lose rule, fed the simulated iteration times; it decides every few
             iterations.
  OracleK    an upper bound, not a planner anyone runs: it knows the true acceptance and the true
             iteration times, and picks the K among `candidates` with the most tokens per second,
             acceptance_length(K) / iteration_time(B, K, kv); K = 0 where speculation does not pay.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from specrl.sim.acceptance import Acceptance, acceptance_length
from specrl.sim.iteration import Engine
from specrl.speculation.planner import Planner, best_option

LONG_SEGMENT = 256  # iterations a policy that never changes its mind lets the simulator run at once


@dataclass(frozen=True)
class FixedK:
    """Always propose `k` drafts (0 = speculation off)."""

    k: int
    max_segment: int = LONG_SEGMENT

    def choose(self, engine: Engine, batch: int, kv_tokens: float) -> int:
        return self.k if engine.drafter is not None else 0

    def observe(self, batch: int, k: int, seconds: float, accepted_per_pos) -> None:
        pass


@dataclass
class PlannedK:
    """The engine's planner with up to `max_k` drafts, deciding from what it has observed. The engine asks it every
    step; the simulator every `max_segment` iterations, observing each segment as one step of its mean cost (so
    its exploration and refresh steps last a segment each: a few hundred of the thousands of iterations of a
    rollout)."""

    max_k: int
    max_segment: int = 8
    planner: Planner = field(init=False, repr=False)

    def __post_init__(self):
        self.planner = Planner(max_k=self.max_k)

    def choose(self, engine: Engine, batch: int, kv_tokens: float) -> int:
        return self.planner.choose(batch) if engine.drafter is not None else 0

    def observe(self, batch: int, k: int, seconds: float, accepted_per_pos) -> None:
        """One iteration over `batch` rows with k drafts: its seconds and, per position, the rows that accepted
        drafts 0..j (expected counts)."""
        self.planner.observe(batch, k, seconds, list(accepted_per_pos))


@dataclass
class OracleK:
    """The best K for the true acceptance and costs (an upper bound on what a planner achieves).

    acceptance: the true acceptance model.
    candidates: K values it may pick; include 0 to allow switching speculation off.
    """

    acceptance: Acceptance
    candidates: tuple[int, ...] = (0, 1, 2, 3, 4, 5, 7)
    max_segment: int = LONG_SEGMENT
    _lengths: dict[int, float] = field(default_factory=dict, repr=False)

    def choose(self, engine: Engine, batch: int, kv_tokens: float) -> int:
        if engine.drafter is None:
            return 0
        for k in self.candidates:
            if k not in self._lengths:
                self._lengths[k] = acceptance_length(self.acceptance, k) if k else 1.0
        seconds = [float(engine.iteration_time(batch, k, np.float64(kv_tokens))) for k in self.candidates]
        return self.candidates[best_option([self._lengths[k] for k in self.candidates], seconds)]

    def observe(self, batch: int, k: int, seconds: float, accepted_per_pos) -> None:
        pass

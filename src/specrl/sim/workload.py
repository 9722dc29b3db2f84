"""RL rollout workload: prompts x G samples with long-tailed response lengths.

Response lengths follow a log-normal body with mean `mean` and log-space spread
`sigma`, truncated at `cap`; an extra fraction `cap_mass` of samples runs to the
cap (unfinished answers, common early in RL-Zero). Ignores: correlation of
lengths within a prompt's group, and prompt-length variation.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LengthDistribution:
    """Response-length distribution, in tokens.

    mean: mean of the log-normal body before truncation.
    sigma: standard deviation of log length (0.5 mild tail, 1.0 heavy tail).
    cap: maximum response tokens.
    cap_mass: fraction of samples forced to the cap, in [0, 1).
    """

    mean: float
    sigma: float
    cap: int
    cap_mass: float = 0.0

    def __post_init__(self) -> None:
        if self.mean <= 0 or self.sigma < 0 or self.cap < 1:
            raise ValueError(f"LengthDistribution needs mean > 0, sigma >= 0, cap >= 1; got {self}")
        if not 0.0 <= self.cap_mass < 1.0:
            raise ValueError(f"LengthDistribution.cap_mass must be in [0, 1), got {self.cap_mass}")


@dataclass(frozen=True)
class Workload:
    """One RL step's rollouts: `prompts` x `samples_per_prompt` requests.

    prompt_tokens: tokens per prompt (same for all).
    lengths: response-length distribution.
    """

    prompts: int
    samples_per_prompt: int
    prompt_tokens: int
    lengths: LengthDistribution

    @property
    def requests(self) -> int:
        return self.prompts * self.samples_per_prompt


def sample_lengths(dist: LengthDistribution, n: int, rng: np.random.Generator) -> np.ndarray:
    """Draw n response lengths (integers in [1, cap]).

    Log-normal with E[L] = mean: mu = ln(mean) - sigma^2 / 2. Then min(L, cap), then a random
    `cap_mass` share of the samples is set to the cap.
    """
    mu = np.log(dist.mean) - dist.sigma**2 / 2.0
    lengths = np.minimum(np.ceil(rng.lognormal(mu, dist.sigma, size=n)), dist.cap)
    at_cap = rng.random(n) < dist.cap_mass
    lengths[at_cap] = dist.cap
    return np.maximum(lengths, 1.0)


def expected_length(dist: LengthDistribution, samples: int = 200_000, seed: int = 0) -> float:
    """Mean response length after truncation and cap mass (Monte Carlo, seeded)."""
    return float(sample_lengths(dist, samples, np.random.default_rng(seed)).mean())


def trained_tokens(w: Workload, shared_prompt: bool) -> float:
    """Tokens the trainer's forward and backward run over in one step: every response, and each prompt once per
    sample (a row per sequence) or once per group (`shared_prompt`: specrl's packed trainer, `rl.packing`)."""
    prompts = w.prompts if shared_prompt else w.requests
    return prompts * w.prompt_tokens + w.requests * expected_length(w.lengths)

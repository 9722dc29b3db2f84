"""Acceptance of chain drafts: per request, per position.

Notation: p = target, q = draft. Each verification window w of a request has a
first-position acceptance probability alpha_w, drawn from Beta(m * c, (1 - m) * c)
(local variation: easy and hard stretches of text); the draft at position j
(1-based) is accepted, given all earlier ones were, with probability
alpha_w * decay^(j - 1). One verification of K drafts then emits

    tau_r(K) = 1 + sum_{j=1..K} prod_{i=1..j} alpha_r * decay^(i-1)
             = 1 + sum_{j=1..K} alpha_r^j * decay^(j(j-1)/2)

tokens in expectation (accepted drafts plus the one bonus/residual token). With
decay = 1 this is the i.i.d. formula (1 - alpha^(K+1)) / (1 - alpha).

A long response sees the whole local distribution, so its tokens per iteration
is the harmonic mean of tau over alpha_w (vLLM's acceptance length, 1 + accepted /
drafts, weighs windows by iterations, hence harmonic). Requests differ too: each
request r has its own m_r ~ Normal(mean, request_spread), clipped to [0.02, 0.98].
Local heterogeneity (small c) makes deep positions look better than a single
alpha would: the windows still drafting there are the easy ones.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import brentq, least_squares
from scipy.stats import beta as beta_dist

_QUAD_POINTS = 64


@dataclass(frozen=True)
class Acceptance:
    """Per-request acceptance model.

    mean: mean first-position acceptance m, in (0, 1).
    concentration: Beta concentration c of the local alpha_w (large = uniform text).
    decay: per-position multiplier of the acceptance probability, in (0, 1].
    request_spread: standard deviation of the per-request mean m_r around `mean`.
    """

    mean: float
    concentration: float = 1e6
    decay: float = 1.0
    request_spread: float = 0.05

    def __post_init__(self) -> None:
        if not 0.0 < self.mean < 1.0:
            raise ValueError(f"Acceptance.mean must be in (0, 1), got {self.mean}")
        if self.concentration <= 0:
            raise ValueError(f"Acceptance.concentration must be > 0, got {self.concentration}")
        if not 0.0 < self.decay <= 1.0:
            raise ValueError(f"Acceptance.decay must be in (0, 1], got {self.decay}")


def iid_tokens_per_step(alpha, k: int):
    """Expected tokens per verification of K i.i.d. drafts: (1 - alpha^(K+1)) / (1 - alpha)."""
    a = np.asarray(alpha, dtype=float)
    return np.where(np.isclose(a, 1.0), k + 1.0, (1.0 - a ** (k + 1)) / (1.0 - np.where(np.isclose(a, 1.0), 0.0, a)))


def tokens_per_step(alpha, k: int, decay: float = 1.0):
    """Expected tokens per verification of K drafts with per-position decay (see module docstring).

    alpha: array of per-request first-position acceptance; returns an array of the same shape.
    K = 0 (no speculation) returns 1.
    """
    a = np.asarray(alpha, dtype=float)
    tau = np.ones_like(a)
    survive = np.ones_like(a)
    for j in range(1, k + 1):
        survive = survive * a * decay ** (j - 1)
        tau = tau + survive
    return tau


def request_means(acc: Acceptance, n: int, rng: np.random.Generator) -> np.ndarray:
    """Draw the per-request mean acceptance m_r ~ Normal(mean, request_spread), clipped to [0.02, 0.98]."""
    return np.clip(rng.normal(acc.mean, acc.request_spread, size=n), 0.02, 0.98)


def quadrature_alphas(acc: Acceptance, points: int = _QUAD_POINTS) -> np.ndarray:
    """Deterministic stand-in for many windows: Beta quantiles at the midpoints of `points` equal bins."""
    u = (np.arange(points) + 0.5) / points
    a = acc.mean * acc.concentration
    b = (1.0 - acc.mean) * acc.concentration
    return np.minimum(beta_dist.ppf(u, a, b), 0.999)


def acceptance_length(acc: Acceptance, k: int) -> float:
    """Acceptance length at K of a long response with mean `acc.mean`: harmonic mean over windows of tau."""
    tau = tokens_per_step(quadrature_alphas(acc), k, acc.decay)
    return float(1.0 / np.mean(1.0 / tau))


def request_tokens_per_step(acc: Acceptance, means, k: int) -> np.ndarray:
    """Tokens per iteration for requests with per-request means `means` (interpolated on a grid of m)."""
    if k == 0:
        return np.ones_like(np.asarray(means, dtype=float))
    grid = np.linspace(0.02, 0.98, 49)
    values = [acceptance_length(replace(acc, mean=float(m)), k) for m in grid]
    return np.interp(means, grid, values)


def prefix_acceptance(acc: Acceptance, k: int) -> np.ndarray:
    """[K]: P(the first j drafts all accepted), j = 1..K, per iteration of a long response with mean `acc.mean`:
    windows weighted by the iterations spent in them (1 / tau), as a planner that counts accepted drafts per
    step sees them. 1 + its sum is `acceptance_length`."""
    alphas = quadrature_alphas(acc)
    weight = 1.0 / tokens_per_step(alphas, k, acc.decay)
    survive, out = np.ones_like(alphas), []
    for j in range(1, k + 1):
        survive = survive * alphas * acc.decay ** (j - 1)
        out.append(float(np.sum(weight * survive) / np.sum(weight)))
    return np.asarray(out)


def request_prefix_acceptance(acc: Acceptance, means, k: int) -> np.ndarray:
    """[R, K]: `prefix_acceptance` for requests with per-request means `means` (interpolated on a grid of m)."""
    means = np.asarray(means, dtype=float)
    if k == 0:
        return np.zeros((len(means), 0))
    grid = np.linspace(0.02, 0.98, 49)
    table = np.stack([prefix_acceptance(replace(acc, mean=float(m)), k) for m in grid])  # [49, K]
    return np.stack([np.interp(means, grid, table[:, j]) for j in range(k)], axis=-1)


def fit_acceptance(lengths_by_k: dict[int, float]) -> Acceptance:
    """Least-squares fit of (mean, concentration, decay) to measured acceptance lengths at several K."""
    ks = sorted(lengths_by_k)

    def residuals(x):
        acc = Acceptance(x[0], np.exp(x[1]), x[2])
        return [acceptance_length(acc, k) / lengths_by_k[k] - 1.0 for k in ks]

    sol = least_squares(residuals, x0=[0.7, np.log(5.0), 0.95], bounds=([0.05, np.log(0.5), 0.5], [0.98, np.log(1e4), 1.0]))
    return Acceptance(float(sol.x[0]), float(np.exp(sol.x[1])), float(sol.x[2]))


def with_length(acc: Acceptance, k: int, length: float) -> Acceptance:
    """Same heterogeneity and decay, mean rescaled so the aggregate acceptance length at K equals `length`."""
    top = max_length(acc, k)
    if not 1.0 < length < top:
        raise ValueError(f"acceptance length at K={k} must be in (1, {top:.2f}) for this acceptance shape, got {length}")
    mean = brentq(lambda m: acceptance_length(replace(acc, mean=m), k) - length, 1e-3, 0.995)
    return replace(acc, mean=float(mean))


def max_length(acc: Acceptance, k: int) -> float:
    """Largest acceptance length at K this shape reaches (mean acceptance 0.995)."""
    return acceptance_length(replace(acc, mean=0.995), k)

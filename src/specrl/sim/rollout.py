"""Discrete-event rollout simulation: continuous batching on engine replicas.

One replica holds at most `max_seqs` live sequences; the rest wait and are
admitted (with a prefill iteration) as others finish. Between two events (a
sequence finishing, or `max_segment` iterations passing so an adaptive policy can
re-decide K) the live set is fixed, so every request r advances by its expected
tau_r(K) tokens per iteration and the replica's cached tokens grow linearly;
the segment's iteration times are evaluated at once with numpy.

What is ignored: iteration-to-iteration acceptance noise (for L tokens at
acceptance length tau the iteration count's relative spread is about
sigma / sqrt(tau * L), under 2% for L >= 1000), preemption under KV pressure,
chunked prefill overlapping decode, and prefix caching of the G samples of a prompt.

Replicas are statistically identical; the rollout ends when the slowest of the
simulated replicas ends (the step waits for every replica).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specrl.sim.acceptance import Acceptance, request_means, request_prefix_acceptance, request_tokens_per_step
from specrl.sim.iteration import Engine
from specrl.sim.workload import Workload, sample_lengths


@dataclass
class RolloutResult:
    """Outcome of one rollout.

    time_s: wall time until the last sequence finished.
    tokens: response tokens generated on the simulated replica(s).
    iterations: engine iterations on the slowest replica.
    trajectory: [segments, 3] array of (start time s, live batch, K) on the slowest replica.
    """

    time_s: float
    tokens: float
    iterations: int
    trajectory: np.ndarray

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.time_s if self.time_s > 0 else 0.0


def simulate_replica(
    engine: Engine, lengths: np.ndarray, means: np.ndarray, acceptance: Acceptance, prompt_tokens: int, policy,
    max_seqs: int,
) -> RolloutResult:
    """Run one replica until all its requests finish.

    lengths: [R] response tokens per request; means: [R] per-request mean acceptance m_r;
    acceptance: local heterogeneity and decay; policy: a `sim.speculation` policy (choose(engine, batch,
    kv_tokens) -> K; observe(batch, K, seconds per iteration, accepted rows per position); max_segment).
    """
    order = np.arange(len(lengths))
    queue = list(order[max_seqs:])
    live = order[:max_seqs].copy()
    rem = lengths[live].astype(float)
    kv = np.full(len(live), float(prompt_tokens))
    t = engine.prefill_time(len(live) * prompt_tokens)
    iterations, traj, tau_cache, prefix_cache = 0, [], {}, {}
    while len(live):
        batch = len(live)
        k = policy.choose(engine, batch, float(kv.sum()))
        if k not in tau_cache:
            tau_cache[k] = request_tokens_per_step(acceptance, means, k)
            prefix_cache[k] = request_prefix_acceptance(acceptance, means, k)  # [R, k]
        tau = tau_cache[k][live]
        n = int(min(max(np.ceil(np.min(rem / tau)), 1), policy.max_segment))
        steps = np.arange(n, dtype=float)
        if not traj or traj[-1][1:] != (batch, k):
            traj.append((t, batch, k))
        seconds = float(np.sum(engine.iteration_time(batch, k, kv.sum() + steps * tau.sum())))
        policy.observe(batch, k, seconds / n, prefix_cache[k][live].sum(axis=0))
        t += seconds
        iterations += n
        emitted = np.minimum(n * tau, rem)
        rem -= emitted
        kv += emitted
        done = rem <= 1e-9
        if done.any():
            live, rem, kv = live[~done], rem[~done], kv[~done]
            admit = queue[: int(done.sum())]
            del queue[: len(admit)]
            if admit:
                t += engine.prefill_time(len(admit) * prompt_tokens)
                live = np.concatenate([live, np.asarray(admit)])
                rem = np.concatenate([rem, lengths[admit].astype(float)])
                kv = np.concatenate([kv, np.full(len(admit), float(prompt_tokens))])
    traj.append((t, 0, 0))
    return RolloutResult(t, float(lengths.sum()), iterations, np.asarray(traj, dtype=float))


def simulate_rollout(
    engine: Engine, workload: Workload, replicas: int, acceptance: Acceptance | None, policy,
    max_seqs: int = 256, seed: int = 0, replicas_simulated: int = 4,
) -> RolloutResult:
    """Simulate one step's rollout spread evenly over `replicas` replicas.

    Simulates min(replicas, replicas_simulated) replicas with independently drawn requests (same seed
    => same lengths and acceptance with speculation on or off, so speedups are paired) and reports the
    slowest. `tokens` is scaled to the whole workload.
    """
    rng = np.random.default_rng(seed)
    per_replica = int(np.ceil(workload.requests / replicas))
    acc = acceptance or Acceptance(0.5)
    results = []
    for _ in range(min(replicas, replicas_simulated)):
        lengths = sample_lengths(workload.lengths, per_replica, rng)
        means = request_means(acc, per_replica, rng)
        results.append(simulate_replica(engine, lengths, means, acc, workload.prompt_tokens, policy, max_seqs))
    slowest = max(results, key=lambda r: r.time_s)
    mean_tokens = np.mean([r.tokens for r in results])
    return RolloutResult(slowest.time_s, mean_tokens * replicas, slowest.iterations, slowest.trajectory)


def settled_choice(policy, engine: Engine, batch: int, kv_tokens: float, accepted_rows, iterations: int = 96) -> int:
    """The K a policy settles on at a fixed batch: it decides and observes `iterations` iterations (a planner
    explores, then prices what it learned), and the K it chose most in the last third is returned.
    `accepted_rows(k)`: the rows accepting drafts 0..j per position, as one iteration shows them."""
    chosen = []
    for _ in range(iterations):
        k = policy.choose(engine, batch, kv_tokens)
        policy.observe(batch, k, float(engine.iteration_time(batch, k, np.float64(kv_tokens))), accepted_rows(k))
        chosen.append(k)
    last = chosen[-(iterations // 3):]
    return max(set(last), key=last.count)


def steady_state_rollout(
    engine: Engine, workload: Workload, replicas: int, acceptance: Acceptance | None, policy,
    max_seqs: int = 256, samples: int = 200_000, seed: int = 0,
) -> RolloutResult:
    """Rollout time when generation streams across steps (fully async, no drain).

    Every replica stays full: `max_seqs` live sequences whose lengths are length-biased (a
    sequence of length L stays live L iterations), so the mean cached tokens per live sequence
    is prompt + E[L^2] / (2 E[L]). Tokens per iteration = max_seqs * acceptance length at K.
    Time = step tokens / (replicas * tokens per second). Ignores the one-off start-up fill.
    """
    rng = np.random.default_rng(seed)
    lengths = sample_lengths(workload.lengths, samples, rng)
    kv_per_seq = workload.prompt_tokens + float(np.mean(lengths**2) / (2.0 * np.mean(lengths)))
    batch = min(max_seqs, int(np.ceil(workload.requests / replicas)))
    kv = batch * kv_per_seq
    acc = acceptance or Acceptance(0.5)
    means = request_means(acc, 4096, rng)
    k = settled_choice(policy, engine, batch, kv, lambda k: batch * request_prefix_acceptance(acc, means, k).mean(0))
    tau = float(np.mean(request_tokens_per_step(acc, means, k)))
    rate = batch * tau / float(engine.iteration_time(batch, k, kv))
    tokens = workload.requests * float(np.mean(lengths))
    time_s = tokens / (replicas * rate)
    return RolloutResult(time_s, tokens, int(np.ceil(time_s / float(engine.iteration_time(batch, k, kv)))),
                         np.asarray([(0.0, batch, k), (time_s, batch, k)], dtype=float))

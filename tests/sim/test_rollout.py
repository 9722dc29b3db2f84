"""Rollout simulation: hand-checkable cases and the simulator's monotonic properties."""
from dataclasses import replace

import numpy as np
import pytest

from specrl.sim.acceptance import Acceptance
from specrl.sim.calibration import iteration_speedup
from specrl.sim.costs import Layout
from specrl.sim.drafters import get_drafter
from specrl.sim.hardware import GPUS
from specrl.sim.iteration import Engine
from specrl.sim.models import get_model
from specrl.sim.rollout import simulate_replica, simulate_rollout
from specrl.sim.scenarios import SCENARIOS
from specrl.sim.speculation import FixedK, OracleK, PlannedK
from specrl.sim.workload import LengthDistribution, Workload, sample_lengths

MODEL = get_model("llama-3.1-8b")
ENGINE = Engine(GPUS["h100"], MODEL, Layout(), get_drafter("eagle3", MODEL))


def test_one_request_without_speculation_takes_one_iteration_per_token():
    res = simulate_replica(ENGINE, np.array([10.0]), np.array([0.5]), Acceptance(0.5), 4, FixedK(0), max_seqs=8)
    expected = ENGINE.prefill_time(4) + sum(float(ENGINE.iteration_time(1, 0, 4 + i)) for i in range(10))
    assert res.iterations == 10
    assert res.time_s == pytest.approx(expected, rel=1e-9)


def test_one_request_with_certain_acceptance_finishes_in_length_over_k_plus_one_iterations():
    acc = Acceptance(0.98, concentration=1e6, decay=1.0, request_spread=0.0)
    res = simulate_replica(ENGINE, np.array([400.0]), np.array([0.98]), acc, 4, FixedK(3), max_seqs=8)
    tau = 1 + 0.98 + 0.98**2 + 0.98**3
    assert res.iterations == int(np.ceil(400 / tau))


def test_a_replica_with_one_slot_serves_requests_one_after_another():
    lengths = np.array([5.0, 7.0])
    both = simulate_replica(ENGINE, lengths, np.full(2, 0.5), Acceptance(0.5), 4, FixedK(0), max_seqs=1)
    assert both.iterations == 12


def test_lognormal_lengths_respect_cap_and_cap_mass():
    """200k draws: the cap share's standard error is ~0.0007, so the 0.005 tolerance fails with odds < 1e-9."""
    from scipy.stats import norm

    dist = LengthDistribution(1000, 1.0, 4000, 0.1)
    lengths = sample_lengths(dist, 200_000, np.random.default_rng(0))
    assert lengths.max() == 4000
    # log-normal body: mu = ln(1000) - 1/2, so P(L >= 4000) = sf((ln 4000 - mu) / 1) ~= 0.0297
    body_over_cap = norm.sf(np.log(4000) - (np.log(1000) - 0.5))
    assert np.mean(lengths == 4000) == pytest.approx(0.1 + 0.9 * body_over_cap, abs=0.005)


def test_more_acceptance_is_never_slower():
    s = SCENARIOS["seed-8b-sync"]
    times = []
    for length in (1.3, 1.8, 2.3, 2.8, 3.3):
        setup = replace(s, acceptance_length=length).setup()
        roll = simulate_rollout(_engine(setup), setup.workload, 32, setup.acceptance,
                                setup.policy, setup.max_seqs, seed=1)
        times.append(roll.time_s)
    assert all(b <= a for a, b in zip(times, times[1:]))


def _engine(setup):
    return Engine(setup.device, setup.model, setup.layout, setup.drafter)


def test_speculation_stops_paying_at_a_large_enough_batch():
    assert iteration_speedup(ENGINE, 1, 3, 2.38) > 1.5
    assert iteration_speedup(ENGINE, 2048, 3, 2.38) < 1.0


def test_speedup_falls_as_the_live_batch_grows():
    speedups = [iteration_speedup(ENGINE, b, 3, 2.38) for b in (1, 8, 64, 512)]
    assert all(b < a for a, b in zip(speedups, speedups[1:]))


def test_the_oracle_is_never_slower_than_the_best_fixed_k_and_the_planner_comes_close():
    s = SCENARIOS["seed-8b-sync"]
    setup = s.setup()
    engine = _engine(setup)
    small = replace(setup.workload, prompts=64)
    fixed = min(simulate_rollout(engine, small, 32, setup.acceptance, FixedK(k), seed=2).time_s for k in (0, 1, 3, 5))
    oracle = simulate_rollout(engine, small, 32, setup.acceptance, OracleK(setup.acceptance), seed=2).time_s
    planned = simulate_rollout(engine, small, 32, setup.acceptance, PlannedK(5), seed=2).time_s
    assert oracle <= fixed * 1.01
    assert planned <= fixed * 1.10  # it pays for exploring and learning what the oracle is told


def test_the_oracle_and_the_planner_switch_speculation_off_at_huge_batches_only():
    acceptance = Acceptance(0.6, 2.0, 0.95)
    assert OracleK(acceptance).choose(ENGINE, 4096, 4096 * 256.0) == 0
    assert OracleK(acceptance).choose(ENGINE, 1, 256.0) > 0

    def settled(batch: int) -> int:
        from specrl.sim.acceptance import prefix_acceptance
        from specrl.sim.rollout import settled_choice

        return settled_choice(PlannedK(5), ENGINE, batch, batch * 256.0,
                              lambda k: batch * prefix_acceptance(acceptance, k))

    assert settled(4096) == 0 and settled(1) > 0


def test_the_planners_learned_acceptance_is_what_its_steps_accepted():
    """The sim shows the planner expected accepted counts; its estimate converges to the true prefix."""
    from specrl.sim.acceptance import prefix_acceptance

    acceptance, policy = Acceptance(0.7, 5.0, 0.95), PlannedK(3)
    for _ in range(200):
        policy.observe(8, 3, 0.01, 8 * prefix_acceptance(acceptance, 3))
    np.testing.assert_allclose(policy.planner.acceptance[1].prefix, prefix_acceptance(acceptance, 3), rtol=1e-3)


def test_the_batch_drains_over_the_rollout():
    s = SCENARIOS["seed-8b-sync"]
    setup = s.setup()
    roll = simulate_rollout(_engine(setup), setup.workload, 32, setup.acceptance, setup.policy, seed=0)
    batches = roll.trajectory[:, 1]
    assert batches[0] == 256 and batches[-1] == 0
    assert np.all(np.diff(batches) <= 0)

"""The rollout pool's failure accounting, with stand-in actors (no Ray cluster): a dead actor is replaced
and counted, an actor that is only unreachable for a moment is kept, and both kinds of failed
request come back to be re-issued."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from ray.exceptions import ActorDiedError, ActorUnavailableError

from specrl.pipeline import actors
from specrl.pipeline.actors import RolloutPool, RolloutRequest


class StandInActor:
    def __init__(self, slot: int):
        self.slot = slot
        self.generate = SimpleNamespace(remote=lambda request: ("ref", self, request.number))


@pytest.fixture
def pool(monkeypatch):
    failures = {}  # request number -> exception its result raises
    monkeypatch.setattr(actors.ray, "wait", lambda refs, num_returns, timeout: (list(refs)[:num_returns], []))

    def get(ref):
        if ref[2] in failures:
            raise failures[ref[2]]
        return f"result {ref[2]}"

    monkeypatch.setattr(actors.ray, "get", get)
    pool = RolloutPool(StandInActor, num_actors=1, requests_per_actor=2)
    pool.failures = failures
    return pool


def request(number: int) -> RolloutRequest:
    return RolloutRequest(number, number * 4, 4, seed=number)


def test_a_transient_unavailability_reissues_without_counting_a_death(pool):
    first = pool.actors[0]
    pool.failures[0] = ActorUnavailableError("a network blip", None)
    pool.submit(0, request(0))
    results, failed = pool.collect(timeout=0)
    assert results == [] and failed == [request(0)]
    assert pool.actors[0] is first and pool.restarts == [0]


def test_a_dead_actor_is_replaced_and_counted(pool):
    first = pool.actors[0]
    pool.failures[1] = ActorDiedError()
    pool.submit(0, request(1))
    results, failed = pool.collect(timeout=0)
    assert failed == [request(1)]
    assert pool.actors[0] is not first and pool.restarts == [1]

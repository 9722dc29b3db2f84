"""Reward scorers never run model output in the trainer's process.

Chain of invariants:
    every dataset specrl accepts        scores code-executing answers without running them (0 canaries),
                                        with its own scorer or specrl's rewrite of it (test_safe_scorers);
    a dataset whose scorer evaluates    and has no rewrite is refused by name, with the reason;
    task.isolated_scoring               is gone, and a config that still sets it fails at load, naming it.
"""
from __future__ import annotations

import pytest

from specrl.pipeline.config import load_config
from specrl.tasks import TaskConfig, make_task
from specrl.tasks.gym import EVALUATING_SCORERS, FLAWED_SCORERS, SAFE_SCORERS
from specrl.tasks.safe_scorers import REWRITTEN_SCORERS

PAYLOADS = [
    "__import__('os').system('touch {canary}')",
    "__import__('pathlib').Path('{canary}').touch()",
    "[[__import__('os').system('touch {canary}')]]",
    "(lambda: __import__('os').system('touch {canary}'))()",
    '["a", __import__(\'os\').system(\'touch {canary}\')]',
    "__import__('os').system('touch {canary}') + 0",
    "open('{canary}', 'w').write('x')",
]


@pytest.mark.slow
def test_no_accepted_dataset_runs_a_code_executing_answer(tmp_path):
    canaries = tmp_path / "canaries"
    canaries.mkdir()
    tried = 0
    accepted = sorted(SAFE_SCORERS | REWRITTEN_SCORERS.keys())
    for name in accepted:
        task = make_task(TaskConfig(name=name, size=2))
        problem = task[0]
        for i, payload in enumerate(PAYLOADS):
            answer = payload.format(canary=canaries / f"{name}_{i}")
            assert task.reward(f"<answer>{answer}</answer>", problem) in (0.0, 1.0)
            tried += 1
    assert tried == len(accepted) * len(PAYLOADS)
    assert sorted(p.name for p in canaries.iterdir()) == []  # not one answer ran


@pytest.mark.parametrize("name", sorted(EVALUATING_SCORERS) + sorted(FLAWED_SCORERS))
def test_a_dataset_whose_scorer_evaluates_or_does_not_verify_is_refused_with_the_reason(name):
    reason = (EVALUATING_SCORERS | FLAWED_SCORERS)[name]
    with pytest.raises(ValueError, match=f"task '{name}' is refused: {reason[:20]}"):
        make_task(TaskConfig(name=name, size=2))


def test_an_unvetted_dataset_name_is_refused():
    with pytest.raises(ValueError, match="has not been vetted"):
        make_task(TaskConfig(name="some_future_dataset", size=2))


def test_a_scorer_that_raises_on_a_malformed_answer_scores_zero():
    task = make_task(TaskConfig(name="prime_factorization", size=2))
    assert task.reward("<answer>not a number × x</answer>", task[0]) == 0.0


def test_no_dataset_is_both_rewritten_and_refused_or_vetted():
    assert not REWRITTEN_SCORERS.keys() & (SAFE_SCORERS | EVALUATING_SCORERS.keys() | FLAWED_SCORERS.keys())


def test_a_config_that_still_sets_isolated_scoring_fails_at_load_naming_it():
    """The field was removed: every dataset specrl accepts is now scored without running the answer."""
    for override in ("task.isolated_scoring=true", "task.isolated_scoring=false"):
        with pytest.raises(ValueError, match=r"config key 'task\.isolated_scoring' was removed: its worker ran"):
            load_config(overrides=[override])
    with pytest.raises(TypeError, match="isolated_scoring"):
        TaskConfig(name="countdown", isolated_scoring=True)

"""Reward scorers never run model output in the trainer's process.

Chain of invariants:
    every dataset specrl accepts     scores code-executing answers without running them (0 canaries);
    a dataset whose scorer evaluates  is refused by name, with the reason;
    task.isolated_scoring=true        scores such a dataset in another process, with no inherited
                                      environment, and a hung answer costs a timeout, not the run.
"""
from __future__ import annotations

import os

import pytest

from specrl.tasks import TaskConfig, make_task
from specrl.tasks.gym import EVALUATING_SCORERS, FLAWED_SCORERS, SAFE_SCORERS

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
    for name in sorted(SAFE_SCORERS):
        task = make_task(TaskConfig(name=name, size=2))
        problem = task[0]
        for i, payload in enumerate(PAYLOADS):
            answer = payload.format(canary=canaries / f"{name}_{i}")
            assert task.reward(f"<answer>{answer}</answer>", problem) in (0.0, 1.0)
            tried += 1
    assert tried == len(SAFE_SCORERS) * len(PAYLOADS)
    assert sorted(p.name for p in canaries.iterdir()) == []  # not one answer ran


@pytest.mark.parametrize("name", sorted(EVALUATING_SCORERS.keys() - {"composite"}) + sorted(FLAWED_SCORERS))
def test_a_dataset_whose_scorer_evaluates_or_does_not_verify_is_refused_with_the_reason(name):
    reason = (EVALUATING_SCORERS | FLAWED_SCORERS)[name]
    with pytest.raises(ValueError, match=f"task '{name}' is refused: {reason[:20]}"):
        make_task(TaskConfig(name=name, size=2))


def test_an_unvetted_dataset_name_is_refused():
    with pytest.raises(ValueError, match="has not been vetted"):
        make_task(TaskConfig(name="some_future_dataset", size=2))


def test_isolated_scoring_runs_the_scorer_in_another_process_without_our_environment(tmp_path, monkeypatch):
    """countdown's scorer evals the answer; with isolated_scoring it does so in a worker that holds
    neither this process's memory nor its environment (the payload records what it sees)."""
    monkeypatch.setenv("SPECRL_TEST_SECRET", "do-not-leak")
    task = make_task(TaskConfig(name="countdown", size=2, isolated_scoring=True))
    problem = task[0]
    assert task.reward(f"<answer>{problem.answer}</answer>", problem) == 1.0
    seen = tmp_path / "seen"  # the shell's parent is the process that evaluated the answer
    spy = f"__import__('os').system('echo $PPID ${{SPECRL_TEST_SECRET:-None}} > {seen}')"
    assert task.reward(f"<answer>{spy}</answer>", problem) == 0.0
    pid, secret = seen.read_text().split()
    assert int(pid) != os.getpid() and secret == "None"


def test_an_answer_that_hangs_the_isolated_scorer_scores_zero_and_the_next_one_is_scored(monkeypatch):
    task = make_task(TaskConfig(name="countdown", size=2, isolated_scoring=True))
    task.isolated.timeout = 3.0
    problem = task[0]
    assert task.reward("<answer>__import__('time').sleep(60)</answer>", problem) == 0.0
    assert task.reward(f"<answer>{problem.answer}</answer>", problem) == 1.0


def test_a_scorer_that_raises_on_a_malformed_answer_scores_zero():
    task = make_task(TaskConfig(name="prime_factorization", size=2))
    assert task.reward("<answer>not a number × x</answer>", task[0]) == 0.0

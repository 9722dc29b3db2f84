"""Online adaptation of EAGLE-3 and MTP heads during GRPO (tiny model, sync pipeline).

Invariants:
    the engine drafts with exactly the trainer's adapted head after every sync (bit for bit);
    rollouts stay exact: engine logprobs == the trainer's (<= 1e-4) while the head changes;
    after policy updates that shift its distribution, the adapted head's held-out expected
    acceptance sum_x min(p, q) beats the frozen head's, at every depth;
    a checkpoint holds the adapted head in its proposer's layout, and a resume drafts with it.
"""
from __future__ import annotations

import pytest
import torch

from specrl.models.registry import draft_checkpoint
from specrl.pipeline.loop import Pipeline
from specrl.rl.head_adaptation import HeadTrainer
from specrl.sampling import SamplingParams
from specrl.speculation.proposer_registry import load_head
from test_pipeline import small_config


def held_out_acceptance(pipeline: Pipeline, head: HeadTrainer) -> list[float]:
    """Per depth: expected acceptance of `head` against the trainer's current policy, on 32 fresh
    rollouts of that policy (prompts the run never trained on)."""
    tok = pipeline.learner.tokenizer
    prompts = [pipeline.learner.task.render(pipeline.learner.task[10_000 + i], tok) for i in range(32)]
    result = pipeline.source.backend.generate(prompts, SamplingParams(max_tokens=12, seed=11))
    return pipeline.learner.trainer.head_acceptance(head, [c.prompt_ids for c in result.completions],
                                           [c.token_ids for c in result.completions])


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["eagle3", "mtp"])
def test_an_adapted_head_beats_a_frozen_one_after_the_policy_shifts(tmp_path, kind):
    # optim.lr=1e-3 moves tiny's policy far in 8 steps: the frozen head's acceptance falls from ~0.9
    pipeline = Pipeline(small_config(tmp_path, "run.steps=8", "draft.enabled=true", "draft.lr=1e-3",
                                       f"backend.proposer={kind}"))
    pipeline.run()
    first, last = (pipeline.history[i]["train"]["draft_expected_acceptance"] for i in (0, -1))
    assert last < first - 0.1, "the policy did not move: the test would not tell adaptation apart"
    for record in pipeline.history:
        assert record["train"]["logprob_abs_error_max"] < 1e-4  # the head changes speed, never the samples
    frozen = HeadTrainer(draft_checkpoint("tiny", kind, None), kind, pipeline.learner.trainer.model, pipeline.learner.policy_dir,
                         pipeline.config.draft, pipeline.config.rollout.sampling())
    adapted, fixed = held_out_acceptance(pipeline, pipeline.learner.draft), held_out_acceptance(pipeline, frozen)
    assert all(a > f for a, f in zip(adapted, fixed)), (adapted, fixed)


@pytest.mark.parametrize("kind", ["eagle3", "mtp"])
def test_the_engine_drafts_with_the_adapted_head_and_a_resume_restores_it(tmp_path, kind):
    run = small_config(tmp_path, "run.steps=2", "draft.enabled=true", f"backend.proposer={kind}")
    pipeline = Pipeline(run)
    summary = pipeline.run()
    assert summary["acceptance_length"] > 1.0
    trained = pipeline.learner.draft.head.checkpoint_state()
    served = pipeline.source.backend.proposer.head.checkpoint_state()
    assert trained.keys() == served.keys() and all(torch.equal(trained[k], served[k]) for k in trained)
    assert "draft_loss" in pipeline.history[-1]["train"]
    saved = load_head(tmp_path / "checkpoints" / "step_000002" / "draft", pipeline.source.backend.engine.model, kind)
    assert all(torch.equal(saved.checkpoint_state()[k], trained[k]) for k in trained)
    resumed = Pipeline(small_config(tmp_path, "run.steps=3", "draft.enabled=true", f"backend.proposer={kind}"),
                          resume=True)
    again = resumed.source.backend.proposer.head.checkpoint_state()
    assert all(torch.equal(again[k], trained[k]) for k in trained)


def test_head_weights_with_a_wrong_shape_or_nan_are_refused_before_anything_is_replaced(tmp_path):
    pipeline = Pipeline(small_config(tmp_path, "run.steps=1", "draft.enabled=true", "backend.proposer=eagle3"))
    policy, head = pipeline.learner.weights()
    before = pipeline.source.backend.proposer.head.checkpoint_state()
    bad = dict(head, **{"fc.weight": head["fc.weight"][:, :-1]})
    with pytest.raises(ValueError, match="'fc.weight' has shape"):
        pipeline.source.backend.sync_weights(policy, version=1, draft=bad)
    nan = dict(head, **{"norm.weight": torch.full_like(head["norm.weight"], float("nan"))})
    with pytest.raises(ValueError, match="'norm.weight' holds NaN"):
        pipeline.source.backend.sync_weights(policy, version=1, draft=nan)
    after = pipeline.source.backend.proposer.head.checkpoint_state()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert pipeline.source.backend.version == 0  # the policy was not replaced either

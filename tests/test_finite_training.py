"""No NaN reaches the weights, and the parity metrics can fail.

Chain of invariants:
    masking before arithmetic: positions outside the loss mask (logprob -inf under top-k / top-p) and
    response tokens the trainer's truncation excludes never enter the loss; the loss and its gradient
    are finite and equal the loss over the tokens that count, and the excluded tokens are counted;
    a GRPO run with truncation and KL (the review's reproduction) keeps finite weights;
    a non-finite loss or gradient skips the optimiser step (weights and AdamW state unchanged), warns,
    and is counted; non-finite weights are never published or checkpointed;
    the engine-vs-trainer logprob error is measured over the tokens that count: shifting the
    behaviour logprobs by 0.5 moves its mean and max to 0.5, under truncation too;
    a weight sync holding NaN says that the synced weights are not finite, not which folder the
    model came from.
"""
from __future__ import annotations

import math

import pytest
import torch

from specrl.finite_step import finite_step
from specrl.models.registry import resolve_checkpoint
from specrl.pipeline.config import load_config
from specrl.pipeline.loop import Pipeline
from specrl.rl.grpo import GRPOConfig, grpo_loss
from specrl.rl.trainer import OptimConfig, PolicyTrainer
from specrl.sampling import SamplingParams

INF = float("inf")


def truncated_case():
    """Two rows of 5 positions: the first holds a prompt position (-inf, mask 0) and a response token the
    trainer's truncation excludes (-inf current logprob, mask 1); the second ends in padding (-inf, mask 0)."""
    current = torch.tensor([[-INF, -0.5, -INF, -1.2, -0.3], [-0.7, -0.2, -0.9, -INF, -INF]])
    behaviour = torch.tensor([[0.0, -0.6, -0.4, -1.0, -0.3], [-0.8, -0.1, -1.0, 0.0, 0.0]])
    reference = torch.tensor([[-INF, -0.4, -0.5, -INF, -0.2], [-0.6, -0.3, -0.8, -INF, -INF]])
    mask = torch.tensor([[0.0, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    return current, behaviour, reference, mask


@pytest.mark.parametrize("decoupled", [False, True], ids=["sync", "stale"])
def test_positions_outside_the_mask_and_excluded_tokens_never_reach_the_loss(decoupled):
    """The fix for NaN weights under truncation with KL or stale batches: the loss over every position equals
    the loss over the tokens that count, with a finite gradient (NaN before the fix), and the two excluded
    response tokens (current -inf at row 0 col 2, reference -inf at row 0 col 3) are counted."""
    current, behaviour, reference, mask = truncated_case()
    config = GRPOConfig(group_size=2, kl_coef=0.05)
    adv = torch.tensor([1.0, -1.0])
    full = current.clone().requires_grad_(True)
    loss, stats = grpo_loss(full, behaviour, adv, mask, config, num_tokens=7, ref_logprobs=reference,
                            proximal_logprobs=full.detach() if decoupled else None)
    loss.backward()
    assert math.isfinite(loss.item()) and torch.isfinite(full.grad).all()
    assert stats["excluded_tokens"] == 2 and all(math.isfinite(v) for v in stats.values())

    counts = torch.tensor([[0.0, 1, 0, 0, 1], [1, 1, 1, 0, 0]])  # the rule: excluded tokens leave the loss
    finite = lambda t: torch.where(counts > 0, t, -1.0)  # noqa: E731 - any finite filler: the mask removes it
    kept = finite(current).requires_grad_(True)
    expected, _ = grpo_loss(kept, finite(behaviour), adv, counts, config, num_tokens=7,
                            ref_logprobs=finite(reference), proximal_logprobs=kept.detach() if decoupled else None)
    expected.backward()
    assert loss.item() == pytest.approx(expected.item(), abs=1e-7)
    assert torch.allclose(full.grad, kept.grad * counts)


def tiny_trainer(**grpo) -> PolicyTrainer:
    return PolicyTrainer(resolve_checkpoint("tiny"), GRPOConfig(group_size=2, **grpo), OptimConfig(lr=1e-3),
                         SamplingParams(top_p=0.7), 0)


PROMPTS = [[5, 6, 7], [8, 9]]


def responses_of(trainer: PolicyTrainer) -> list[list[int]]:
    """Row 0: three greedy tokens then the least likely one (outside top_p 0.7: excluded); row 1: two greedy."""
    rows = []
    for prompt, greedy, last in ((PROMPTS[0], 3, True), (PROMPTS[1], 2, False)):
        ids = list(prompt)
        with torch.no_grad():
            for i in range(greedy + last):
                logits = trainer.model(input_ids=torch.tensor([ids])).logits[0, -1]
                ids.append(int(logits.argmin() if i == greedy else logits.argmax()))
        rows.append(ids[len(prompt):])
    return rows


def engine_logprobs(trainer: PolicyTrainer, responses) -> list[list[float]]:
    """The trainer's own logprobs of `responses` under top_p 0.7, as a rollout engine would record them
    (a token outside the nucleus gets a finite stand-in: the engine never samples one, but bf16 ties can)."""
    from specrl.rl.sequences import train_batch
    from specrl.rl.padded_reference import padded_token_logprobs

    batch = train_batch(PROMPTS, responses, 0)
    with torch.no_grad():
        logits = trainer.model(input_ids=batch.ids, attention_mask=batch.attention_mask).logits
        logprobs = padded_token_logprobs(logits, batch.ids, *trainer._truncation)
    logprobs = logprobs.clamp_min(-30.0)
    return [logprobs[i, len(p) - 1:len(p) - 1 + len(r)].tolist() for i, (p, r) in enumerate(zip(PROMPTS, responses))]


def test_parity_error_moves_when_the_behaviour_logprobs_are_shifted_under_truncation():
    """With every behaviour logprob shifted by 0.5 the mean and max error read 0.5 (NaN and 0.0 before the fix,
    so the parity assertion could not fail); unshifted, both are at fp32 rounding. Tokens the trainer scores
    -inf (excluded by its own cut) are counted apart, not averaged in."""
    trainer = tiny_trainer()
    responses = responses_of(trainer)
    behaviour = engine_logprobs(trainer, responses)
    shifted = [[b + 0.5 for b in row] for row in behaviour]
    stats = trainer.step(PROMPTS, responses, shifted, torch.tensor([1.0, -1.0]))
    assert stats["parity_tokens"] == 5 and stats["excluded_tokens"] == 1
    assert stats["logprob_abs_error_mean"] == pytest.approx(0.5, abs=1e-5)
    assert stats["logprob_abs_error_max"] == pytest.approx(0.5, abs=1e-5)
    fresh = tiny_trainer()
    same = fresh.step(PROMPTS, responses, engine_logprobs(fresh, responses), torch.tensor([1.0, -1.0]))
    assert same["logprob_abs_error_max"] < 1e-5 and same["excluded_tokens"] == 1


def test_a_non_finite_loss_skips_the_step_and_leaves_weights_and_optimiser_state_unchanged():
    trainer = tiny_trainer()
    responses = responses_of(trainer)
    behaviour = engine_logprobs(trainer, responses)
    trainer.step(PROMPTS, responses, behaviour, torch.tensor([1.0, -1.0]))  # one real step: AdamW has state
    weights = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    moments = {i: s["exp_avg"].clone() for i, s in trainer.optimizer.state_dict()["state"].items()}
    with pytest.warns(RuntimeWarning, match="policy: the loss .* not finite; skipping"):
        stats = trainer.step(PROMPTS, responses, behaviour, torch.tensor([float("nan"), 1.0]))
    assert stats["policy_step_skipped"] == 1
    assert all(torch.equal(weights[k], v) for k, v in trainer.model.state_dict().items())
    after = trainer.optimizer.state_dict()["state"]
    assert all(torch.equal(moments[i], after[i]["exp_avg"]) for i in moments)
    assert all(p.grad is None for p in trainer.model.parameters())
    assert trainer.step(PROMPTS, responses, behaviour, torch.tensor([1.0, -1.0]))["policy_step_skipped"] == 0


def test_a_non_finite_gradient_skips_the_step_even_when_the_loss_reads_finite():
    weight = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.AdamW([weight], lr=0.1)
    weight.grad = torch.tensor([1.0, float("inf"), 0.0])
    with pytest.warns(RuntimeWarning, match="head: .* not finite"):
        norm, skipped = finite_step(optimizer, [weight], 0.5, 1.0, "head")
    assert skipped and math.isinf(norm) and torch.equal(weight.detach(), torch.ones(3)) and weight.grad is None
    weight.grad = torch.tensor([3.0, 4.0, 0.0])
    norm, skipped = finite_step(optimizer, [weight], 0.5, 1.0, "head")
    assert not skipped and norm == pytest.approx(5.0) and not torch.equal(weight.detach(), torch.ones(3))


SMALL = ["run.steps=2", "rollout.prompts_per_step=2", "grpo.group_size=2", "rollout.max_tokens=8",
         "backend.proposer=ngram", "optim.lr=1e-3"]


@pytest.mark.parametrize("truncation", ["rollout.top_p=0.7", "rollout.top_k=5"])
def test_grpo_with_truncation_and_kl_keeps_the_weights_finite(tmp_path, truncation):
    """The review's reproduction (top_p 0.7, kl_coef 0.01, tiny): it died at step 1 on NaN weights."""
    config = load_config("tiny", overrides=SMALL + ["grpo.kl_coef=0.01", truncation, f"run.run_dir={tmp_path}"])
    pipeline = Pipeline(config)
    summary = pipeline.run()
    assert summary["steps_run"] == 2 and summary["skipped_steps_total"] == {"policy": 0, "draft": 0}
    for record in pipeline.history:
        assert math.isfinite(record["train"]["loss"]) and math.isfinite(record["train"]["kl"])
        assert record["train"]["logprob_abs_error_max"] < 1e-4
    assert all(torch.isfinite(v).all() for v in pipeline.learner.weights()[0].values())


def test_non_finite_weights_are_neither_published_nor_checkpointed(tmp_path):
    config = load_config("tiny", overrides=SMALL + ["run.steps=1", f"run.run_dir={tmp_path}"])
    pipeline = Pipeline(config)
    with torch.no_grad():
        next(pipeline.learner.trainer.model.parameters())[0, 0] = float("nan")
    with pytest.raises(ValueError, match="trained policy's weights .*not published.*holds NaN"):
        pipeline.learner.weights()
    with pytest.raises(ValueError, match="holds NaN"):
        pipeline.learner.checkpoint_if_due(1, pipeline.pipeline_state)
    assert not any((tmp_path / "checkpoints").glob("*/policy"))
    pipeline.learner.sink.close()


def test_a_nan_weight_sync_says_the_synced_weights_are_not_finite(target_dir):
    from specrl.engine.engine import RolloutEngine
    from specrl.models.llama import LlamaModel
    from specrl.models.checkpoint import load_state_dict

    engine = RolloutEngine(LlamaModel.from_pretrained(target_dir))
    state = load_state_dict(target_dir)
    state["model.norm.weight"] = torch.full_like(state["model.norm.weight"], float("nan"))
    with pytest.raises(ValueError, match=r"^policy weights of version 3: tensor 'model.norm.weight' holds NaN"):
        engine.load_weights(state, version=3)
    assert engine.version == 0

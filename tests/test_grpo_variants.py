"""The GRPO variants against closed forms on small cases, and in the pipeline on the tiny model.

    GSPO            sequence ratio exp(mean_t (l - b)), clipped per sequence, sequence-mean loss; its
                    gradient, micro-batch split and excluded tokens by hand
    overlong        DAPO's soft penalty by hand; filter leaves cut responses out of the loss
    dynamic         groups whose rewards are all equal are set aside; every step still trains P groups,
                    each with a reward spread, and the extra generations are counted
"""
from __future__ import annotations

import math

import pytest
import torch

from specrl.pipeline.buffer import StalenessBuffer
from specrl.pipeline.config import load_config
from specrl.pipeline.groups import Group
from specrl.pipeline.loop import Pipeline
from specrl.rl.grpo import GRPOConfig, grpo_loss, overlong_penalty

GSPO = GRPOConfig(group_size=2, ratio_level="sequence", clip_low=0.1, clip_high=0.1)


def test_gspo_loss_and_gradient_match_the_closed_form():
    behaviour = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, 0.0]])
    delta = torch.tensor([[0.03, -0.01, 0.01], [0.4, 0.2, 0.0]])  # seq 0: mean 0.01 (inside); seq 1: 0.3 (outside)
    logprobs = (behaviour + delta).requires_grad_(True)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv = torch.tensor([1.5, 2.0])
    loss, stats = grpo_loss(logprobs, behaviour, adv, mask, GSPO)
    loss.backward()
    s0 = math.exp(0.01)  # seq 1's exp(0.3) is past 1.1
    # S_i = min(s A, clip(s) A); seq 1 has A > 0 and s > 1.1: the clipped branch, no gradient
    assert loss.item() == pytest.approx(-(s0 * 1.5 + 1.1 * 2.0) / 2, rel=1e-6)
    # dS_0/dl_t = A s_0 / L_0, then the sequence mean's 1/N
    expected = torch.tensor([[-1.5 * s0 / 3 / 2] * 3, [0.0, 0.0, 0.0]])
    assert torch.allclose(logprobs.grad, expected, atol=1e-7)
    assert stats["clip_fraction"] == pytest.approx(0.5)  # one of two sequences, each weighing 1/N


def test_gspo_weighs_sequences_equally_whatever_their_length_and_splits_into_micro_batches():
    torch.manual_seed(0)
    behaviour = -torch.rand(4, 6)
    logprobs = behaviour + 0.05 * torch.randn(4, 6)
    mask = torch.tensor([[1.0] * 6, [1.0] * 2 + [0.0] * 4, [1.0] * 4 + [0.0] * 2, [1.0] + [0.0] * 5])
    adv = torch.tensor([1.0, -1.0, 0.5, 2.0])
    full, _ = grpo_loss(logprobs, behaviour, adv, mask, GSPO)
    halves = sum(grpo_loss(logprobs[r], behaviour[r], adv[r], mask[r], GSPO, num_sequences=4)[0]
                 for r in (slice(0, 2), slice(2, 4)))
    assert halves.item() == pytest.approx(full.item(), rel=1e-6)
    ratios = torch.exp(((logprobs - behaviour) * mask).sum(1) / mask.sum(1))
    surrogate = torch.minimum(ratios * adv, ratios.clamp(0.9, 1.1) * adv)
    assert full.item() == pytest.approx(-surrogate.mean().item(), rel=1e-6)


def test_gspo_leaves_a_token_the_trainer_cannot_score_out_of_the_sequence_ratio():
    behaviour = torch.tensor([[-1.0, -1.0, -1.0]])
    logprobs = torch.tensor([[-0.9, -float("inf"), -1.1]])
    loss, stats = grpo_loss(logprobs, behaviour, torch.tensor([1.0]), torch.ones(1, 3), GSPO)
    # ratio from the two finite tokens: exp(mean(0.1, -0.1)) = 1; they are 2 of the sequence's 3 tokens
    assert loss.item() == pytest.approx(-2 / 3) and stats["excluded_tokens"] == 1


def test_token_level_is_unchanged_by_the_sequence_option():
    logprobs = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    loss, _ = grpo_loss(logprobs, logprobs - 0.1, torch.tensor([2.0, -1.0]), mask, GRPOConfig(group_size=2))
    ratio = math.exp(0.1)
    assert loss.item() == pytest.approx(-(2 * min(ratio, 1.2) * 2 - 1 * ratio) / 3, rel=1e-6)


@pytest.mark.parametrize("length, penalty", [(10, 0.0), (24, 0.0), (26, -0.25), (28, -0.5), (32, -1.0)])
def test_overlong_penalty_is_dapos_linear_ramp(length, penalty):
    assert overlong_penalty(length, max_tokens=32, buffer=8) == pytest.approx(penalty)


def test_groups_with_equal_rewards_are_set_aside_when_dynamic_sampling_is_on():
    def group(index, rewards):
        return Group(index, [1], [], rewards, issued_version=0)

    buffer = StalenessBuffer(0, drop_uniform=True)
    buffer.put([group(0, [1.0, 1.0]), group(1, [0.0, 1.0]), group(2, [0.0, 0.0])])
    assert buffer.filtered == [0, 2] and [g.index for g in buffer.groups] == [1]
    restored = StalenessBuffer(0, drop_uniform=True)
    restored.load_state_dict(buffer.state_dict())
    assert restored.filtered == [0, 2]


SMALL = ["rollout.prompts_per_step=4", "grpo.group_size=4", "rollout.max_tokens=12", "run.tensorboard=false",
         "optim.lr=1e-3", "backend.adaptive=false", "backend.proposer=ngram"]


def tiny_config(tmp_path, *extra):
    return load_config("tiny", overrides=SMALL + [f"run.run_dir={tmp_path}"] + list(extra))


def test_dynamic_sampling_keeps_the_batch_full_of_groups_with_a_reward_spread(tmp_path):
    pipeline = Pipeline(tiny_config(tmp_path, "run.steps=2", "grpo.dynamic_sampling=true", "optim.lr=2e-4"))
    summary = pipeline.run()
    filtered = sum(r["filtered_groups"] for r in pipeline.history)
    assert filtered > 0  # tiny's untrained arithmetic gives many all-zero groups at G = 4
    for record in pipeline.history:
        assert len(record["data_positions"]) == 4 and record["reward_std"] > 0
    ledger = summary["groups"]
    assert ledger["filtered"] == filtered and summary["dynamic_sampling_extra_generations"] == 4 * filtered
    assert ledger["consumed"] + ledger["filtered"] + ledger["dropped"] + ledger["buffered"] + \
        ledger["in_flight"] + ledger["awaiting_reissue"] + ledger["abandoned"] == ledger["issued"]
    trained = [p for r in pipeline.history for p in r["data_positions"]]
    assert len(set(trained)) == len(trained)  # a position is trained on once, and a set-aside one never


def test_dynamic_sampling_stops_with_a_reason_when_no_group_has_a_spread(tmp_path):
    impossible = tmp_path / "never.py"
    impossible.write_text("def never(response, example):\n    return 0.0\n")
    pipeline = Pipeline(tiny_config(tmp_path / "run", "run.steps=1", "grpo.dynamic_sampling=true",
                                    "grpo.dynamic_sampling_budget=1", f"task.reward={impossible}:never"))
    with pytest.raises(RuntimeError, match="dynamic sampling set aside 8 groups whose rewards were all equal"):
        pipeline.run()


@pytest.mark.parametrize("mode", ["filter", "penalty"])
def test_overlong_responses_are_filtered_or_penalised(tmp_path, mode):
    pipeline = Pipeline(tiny_config(tmp_path, "run.steps=2", "rollout.max_tokens=9", f"grpo.overlong={mode}",
                                    "grpo.overlong_buffer=2"))
    pipeline.run()
    for record in pipeline.history:
        if mode == "filter":  # "12+34=46<eos>" is 9 tokens: a longer response is cut
            assert record["train"]["overlong_filtered"] > 0
            assert record["train"]["logprob_abs_error_max"] < 1e-4
        else:
            assert record["train"]["overlong_penalty_mean"] < 0

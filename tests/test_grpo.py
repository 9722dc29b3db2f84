"""GRPO pieces against hand calculations, the truncated IS weight of stale batches included."""
import math

import pytest
import torch

from specrl.rl.advantages import group_advantages
from specrl.rl.grpo import GRPOConfig, grpo_loss


def test_group_advantages_normalise_within_each_group():
    adv = group_advantages(torch.tensor([1.0, 0, 0, 0, 1, 1, 1, 1]), group_size=4)
    std = (0.25 * 0.75) ** 0.5
    expected = [0.75 / std, -0.25 / std, -0.25 / std, -0.25 / std, 0, 0, 0, 0]
    assert torch.allclose(adv, torch.tensor(expected), atol=1e-4)


def test_group_advantages_without_scaling_are_mean_centred():
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.5, 0.5]), group_size=2, scale=False)
    assert adv.tolist() == [0.5, -0.5, 0.0, 0.0]


def test_rewards_that_do_not_split_into_groups_are_refused():
    with pytest.raises(ValueError, match="groups of 3"):
        group_advantages(torch.zeros(4), group_size=3)


def test_on_policy_loss_gradient_is_the_token_mean_policy_gradient():
    logprobs = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    adv = torch.tensor([2.0, -1.0])
    loss, stats = grpo_loss(logprobs, logprobs.detach(), adv, mask, GRPOConfig(group_size=2))
    loss.backward()
    # d(-sum rho*A*mask / 3)/dl = -A*mask/3 at rho = 1
    assert torch.allclose(logprobs.grad, -adv.unsqueeze(1) * mask / 3)
    assert loss.item() == pytest.approx(-(2 * 2 - 1) / 3)
    assert stats["clip_fraction"] == 0


def test_ratio_outside_the_clip_range_stops_the_gradient_for_positive_advantage():
    behaviour = torch.tensor([[-1.0]])
    current = (behaviour + 0.5).requires_grad_()  # rho = e^0.5 > 1.2
    loss, stats = grpo_loss(current, behaviour, torch.tensor([1.0]), torch.ones(1, 1), GRPOConfig(group_size=2))
    loss.backward()
    assert current.grad.abs().item() == 0 and stats["clip_fraction"] == 1
    assert loss.item() == pytest.approx(-1.2)


def test_micro_batched_losses_sum_to_the_full_batch_loss():
    gen = torch.Generator().manual_seed(0)
    lp, old = torch.randn(6, 5, generator=gen), torch.randn(6, 5, generator=gen)
    mask = (torch.rand(6, 5, generator=gen) > 0.3).float()
    adv = torch.randn(6, generator=gen)
    cfg = GRPOConfig(group_size=2)
    full, _ = grpo_loss(lp, old, adv, mask, cfg)
    total = int(mask.sum())
    parts = sum(grpo_loss(lp[i:i + 2], old[i:i + 2], adv[i:i + 2], mask[i:i + 2], cfg, num_tokens=total)[0]
                for i in range(0, 6, 2))
    assert parts.item() == pytest.approx(full.item(), abs=1e-6)


def test_kl_penalty_is_zero_at_the_reference_and_positive_away_from_it():
    lp = torch.tensor([[-1.0, -2.0]])
    cfg = GRPOConfig(group_size=2, kl_coef=0.1)
    _, at_ref = grpo_loss(lp, lp, torch.zeros(1), torch.ones(1, 2), cfg, ref_logprobs=lp)
    _, away = grpo_loss(lp, lp, torch.zeros(1), torch.ones(1, 2), cfg, ref_logprobs=lp - 0.5)
    assert at_ref["kl"] == 0 and away["kl"] > 0


def test_truncated_is_weight_on_hand_cases():
    # one response of three tokens, advantage 2; b = behaviour, x = proximal (the current weights)
    b = torch.tensor([[math.log(0.5), math.log(0.2), math.log(0.9)]])
    x = torch.tensor([[math.log(0.6), math.log(0.8), math.log(0.45)]])
    mask = torch.ones(1, 3)
    config = GRPOConfig(group_size=2, is_cap=2.0)
    current = x.clone().requires_grad_(True)
    loss, stats = grpo_loss(current, b, torch.tensor([2.0]), mask, config, proximal_logprobs=x)
    weights = [0.6 / 0.5, min(0.8 / 0.2, 2.0), 0.45 / 0.9]  # [1.2, 4 -> 2 (truncated), 0.5]
    assert loss.item() == pytest.approx(-2.0 * sum(weights) / 3, rel=1e-6)
    assert stats["is_weight"] == pytest.approx(sum(weights) / 3, rel=1e-6)
    assert stats["is_truncated_fraction"] == pytest.approx(1 / 3)
    loss.backward()  # rho = exp(l - x) == 1: the gradient is -w * A / N per token
    assert torch.allclose(current.grad, torch.tensor([[-2.0 * w / 3 for w in weights]]), atol=1e-6)


def test_without_lag_the_decoupled_loss_equals_the_plain_grpo_loss():
    torch.manual_seed(0)
    b = torch.randn(2, 4).log_softmax(-1)
    l1 = (b + 0.1 * torch.randn(2, 4)).requires_grad_(True)
    l2 = l1.detach().clone().requires_grad_(True)
    adv, mask, config = torch.tensor([1.0, -0.5]), torch.ones(2, 4), GRPOConfig(group_size=2)
    plain, _ = grpo_loss(l1, b, adv, mask, config)
    decoupled, stats = grpo_loss(l2, b, adv, mask, config, proximal_logprobs=b)  # proximal == behaviour
    plain.backward()
    decoupled.backward()
    assert stats["is_weight"] == pytest.approx(1.0)
    assert torch.allclose(plain, decoupled) and torch.allclose(l1.grad, l2.grad)


def test_bf16_autocast_trains_with_fp32_master_weights():
    """optim.precision=bf16: the step runs under autocast, the weights and AdamW moments stay fp32,
    and the trainer's logprobs differ from fp32's by bf16 rounding only (the ratio's first-step error)."""
    from specrl.models.registry import resolve_checkpoint
    from specrl.rl.trainer import OptimConfig, PolicyTrainer
    from specrl.sampling import SamplingParams

    model_dir = resolve_checkpoint("tiny")
    prompts, responses = [[5, 6, 7], [8, 9]], [[10, 11, 12, 13], [14, 15]]
    trainers = {p: PolicyTrainer(model_dir, GRPOConfig(), OptimConfig(lr=1e-3, precision=p), SamplingParams(), 0)
                for p in ("fp32", "bf16")}
    fp32 = trainers["fp32"].step(prompts, responses, [[0.0] * 4, [0.0] * 2], torch.tensor([1.0, -1.0]))
    bf16 = trainers["bf16"].step(prompts, responses, [[0.0] * 4, [0.0] * 2], torch.tensor([1.0, -1.0]))
    # behaviour logprobs 0: the error is each step's own mean |logprob|, equal up to bf16 rounding
    assert bf16["logprob_abs_error_mean"] == pytest.approx(fp32["logprob_abs_error_mean"], rel=0.05)
    assert bf16["logprob_abs_error_mean"] != fp32["logprob_abs_error_mean"]  # autocast did run in bf16
    model = trainers["bf16"].model
    assert all(p.dtype == torch.float32 for p in model.parameters())
    state = trainers["bf16"].optimizer_state()["state"]
    assert state and all(slots["exp_avg"].dtype == torch.float32 for slots in state.values())

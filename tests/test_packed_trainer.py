"""The packed trainer (each group's prompt computed once, logits only at response positions, micro-batches
sized in tokens) takes the same step as plain right-padded rows: loss, gradient norm and every parameter's
gradient to fp32 rounding, under every sampling option, with KL, at sequence level, and with micro-batches
that split a group. What draft and head adaptation read from it equals a padded forward's. Its gradients do not
change from one process to the next (MKL kept on every thread)."""
import os
import subprocess
import sys

import pytest
import torch

from helpers import save_random_checkpoint
from specrl.rl.grpo import GRPOConfig
from specrl.rl.packing import micro_batches, pack
from specrl.rl.padded_reference import padded_step
from specrl.rl.sequences import train_batch
from specrl.rl.trainer import OptimConfig, PolicyTrainer, capture_hidden, packed_logits, padded_views
from specrl.sampling import SamplingParams

VOCAB = 40


def test_a_group_is_packed_as_its_prompt_then_each_response_continuing_from_it():
    prompts, responses = [[5, 6], [5, 6], [7]], [[1, 2], [3], [4, 4]]
    packed = pack(prompts, responses, range(3), budget=100)
    assert packed.ids.tolist() == [[5, 6, 1, 2, 3, 7, 4, 4]]
    assert packed.positions.tolist() == [[0, 1, 2, 3, 2, 0, 1, 2]]
    # response tokens are predicted by the prompt's last position, then by their own previous token
    assert packed.logit_positions.tolist() == [1, 2, 1, 5, 6]
    assert packed.targets.tolist() == [1, 2, 3, 4, 4]
    assert packed.response_mask.tolist() == [[True, True], [True, False], [True, True]]
    mask = packed.attention_mask("sdpa", torch.float32)[0, 0].int().tolist()
    assert mask[4] == [1, 1, 0, 0, 1, 0, 0, 0]  # the second response reads the prompt and itself, not r1
    assert mask[3] == [1, 1, 1, 1, 0, 0, 0, 0]
    assert mask[6] == [0, 0, 0, 0, 0, 1, 1, 0]  # the next group reads nothing of the first
    # each row's tokens in train_batch's padded layout
    assert packed.ids[0][packed.unpack_index].tolist()[:2] == [[5, 6, 1, 2], [5, 6, 3, 5]]


def test_micro_batches_hold_whole_groups_within_the_token_budget_and_split_a_group_that_exceeds_it():
    prompts = [[1] * 4] * 3 + [[2] * 4] * 2
    responses = [[0] * 3] * 5
    assert micro_batches(prompts, responses, 100) == [range(0, 5)]
    assert micro_batches(prompts, responses, 13) == [range(0, 3), range(3, 5)]  # 4 + 9, then 4 + 6
    assert micro_batches(prompts, responses, 10) == [range(0, 2), range(2, 3), range(3, 5)]  # the group splits
    packed = pack(prompts, responses, range(0, 2), 10)
    assert packed.tokens == 10
    assert micro_batches([[1] * 8], [[0] * 8], 10) == [range(0, 1)]  # one sequence over the budget runs alone


def batch(seed: int, groups: int = 3, group_size: int = 4):
    g = torch.Generator().manual_seed(seed)
    prompts, responses = [], []
    for _ in range(groups):
        prompt = torch.randint(0, VOCAB, (int(torch.randint(3, 9, (1,), generator=g)),), generator=g).tolist()
        for _ in range(group_size):
            prompts.append(prompt)
            length = int(torch.randint(1, 12, (1,), generator=g))
            responses.append(torch.randint(0, VOCAB, (length,), generator=g).tolist())
    behaviour = [(-3.0 + 0.5 * torch.randn(len(r), generator=g)).tolist() for r in responses]
    advantages = torch.randn(len(responses), generator=g)
    return prompts, responses, behaviour, advantages


def gradients(trainer: PolicyTrainer) -> dict:
    """The gradients the optimiser is about to apply, captured just before it steps."""
    seen = {}

    def keep(optimizer, args, kwargs):
        seen.update({name: p.grad.clone() for name, p in trainer.model.named_parameters()})
    trainer.optimizer.register_step_pre_hook(keep)
    return seen


SAMPLING = {"plain": SamplingParams(temperature=1.0), "temperature": SamplingParams(temperature=0.7),
            "top_k": SamplingParams(temperature=0.9, top_k=8), "top_p": SamplingParams(temperature=1.0, top_p=0.8),
            "all": SamplingParams(temperature=0.8, top_k=12, top_p=0.9)}
CASES = {  # (grpo settings, micro-batch budget in tokens, padded micro-batch rows, decoupled)
    "one micro-batch": ({}, 4096, 12, False),
    "kl, groups split": ({"kl_coef": 0.1}, 20, 5, False),
    "sequence level, decoupled": ({"ratio_level": "sequence"}, 30, 3, True),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("sampling", SAMPLING)
def test_the_packed_step_equals_the_padded_step(tmp_path, sampling, case):
    grpo, budget, rows, decoupled = CASES[case]
    save_random_checkpoint(tmp_path, vocab=VOCAB)
    make = lambda: PolicyTrainer(tmp_path, GRPOConfig(group_size=4, **grpo),  # noqa: E731
                                 OptimConfig(lr=1e-3, max_grad_norm=0.0, micro_batch_tokens=budget),
                                 SAMPLING[sampling], pad_id=0)
    packed_trainer, padded_trainer = make(), make()
    for trainer in (packed_trainer, padded_trainer):  # the policy moves away from the KL reference
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for p in trainer.model.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=g))
    prompts, responses, behaviour, advantages = batch(seed=len(sampling) + len(case))
    if budget < 100:
        assert len(micro_batches(prompts, responses, budget)) > 3  # groups really are split
    packed_grads, padded_grads = gradients(packed_trainer), gradients(padded_trainer)
    stats = packed_trainer.step(prompts, responses, behaviour, advantages, decoupled=decoupled)
    reference = padded_step(padded_trainer, prompts, responses, behaviour, advantages, rows, decoupled=decoupled)
    assert stats["loss"] == pytest.approx(reference["loss"], rel=1e-5, abs=1e-6)
    assert stats["kl"] == pytest.approx(reference["kl"], rel=1e-4, abs=1e-7)
    assert stats["grad_norm"] == pytest.approx(reference["grad_norm"], rel=1e-5)
    assert reference["grad_norm"] > 0 and (grpo.get("kl_coef", 0) == 0 or reference["kl"] > 0)
    for name, grad in padded_grads.items():  # to fp32 rounding of the tensor's scale (the sums' order differs: on
        # AVX-512 one element of 6e-4 in a tensor reaching 15 differed by 1.5e-6)
        torch.testing.assert_close(packed_grads[name], grad, rtol=1e-4, atol=1e-6 * max(1.0, float(grad.abs().max())),
                                   msg=name)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_adaptation_reads_what_a_padded_forward_computes(tmp_path, arch):
    """Hidden states at every real position of every row, and the logits at the response-predicting positions."""
    model = save_random_checkpoint(tmp_path, arch=arch, vocab=VOCAB)
    prompts, responses, _, _ = batch(seed=3)
    rows = range(2, 9)  # splits the first and last groups
    packed = pack(prompts, responses, rows, budget=4096)
    layers = (0, -1)
    hidden, release = capture_hidden(model, layers)
    with torch.no_grad():
        logits = packed_logits(model, packed)
    release()
    padded, view_logits, view_hidden = padded_views(prompts, responses, packed, logits, hidden, pad_id=0)
    expected = train_batch(prompts[2:9], responses[2:9], 0)
    assert torch.equal(padded.ids, expected.ids) and torch.equal(padded.loss_mask, expected.loss_mask)
    hidden, release = capture_hidden(model, layers)
    with torch.no_grad():
        full = model(input_ids=expected.ids, attention_mask=expected.attention_mask).logits
    release()
    real = expected.attention_mask.bool()
    for layer in layers:
        torch.testing.assert_close(view_hidden[layer][real], hidden[layer][real], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(view_logits, full[expected.loss_mask > 0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("preset, expected", [(None, "FALSE"), ("TRUE", "TRUE")])
def test_importing_specrl_keeps_mkl_on_the_threads_torch_asks_for_unless_the_user_says_otherwise(preset, expected):
    """Left dynamic, MKL ran the trainer's LM-head backward on fewer threads in some processes (other last bits, a
    seeded run that drifted): `import specrl` sets MKL_DYNAMIC=FALSE before torch loads, and keeps a user's own."""
    env = {k: v for k, v in os.environ.items() if k != "MKL_DYNAMIC"} | ({"MKL_DYNAMIC": preset} if preset else {})
    out = subprocess.run([sys.executable, "-c", "import os, specrl, torch; print(os.environ['MKL_DYNAMIC'])"],
                         env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == expected

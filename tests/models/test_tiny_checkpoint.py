"""The committed `tiny` / `tiny-draft` checkpoints load with transformers and have learnt something."""
from collections import Counter

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from specrl.tasks import arithmetic
from specrl.training.pretraining import PretrainConfig, evaluate, pretrain
from specrl.models.registry import draft_for, resolve_checkpoint
from specrl.models.tiny import TINY_DRAFT


@pytest.fixture(scope="module")
def models():
    torch.set_num_threads(1)
    target = AutoModelForCausalLM.from_pretrained(resolve_checkpoint("tiny")).eval()
    draft = AutoModelForCausalLM.from_pretrained(resolve_checkpoint(draft_for("tiny", "draft"))).eval()
    return target, draft


@pytest.fixture(scope="module")
def held_out_metrics(models):
    return evaluate(*models, PretrainConfig(eval_problems=300, seed=11))


def test_tiny_and_its_draft_share_the_vocabulary(models):
    target, draft = models
    assert target.config.vocab_size == draft.config.vocab_size == 22
    assert target.config.eos_token_id == draft.config.eos_token_id == 2
    assert draft.num_parameters() < target.num_parameters() / 4


def test_tiny_beats_the_best_constant_answer_on_held_out_problems(held_out_metrics):
    """Chance here is guessing the most common sum: about 1% of 2-digit additions.

    Pretraining reaches ~34% greedy; 300 problems give a standard error near 3%, so the
    0.2 floor fails by chance with odds far below 1e-4."""
    problems = arithmetic.generate_problems(arithmetic.ArithmeticConfig(), 300, 111, "test")
    best_constant = Counter(p.answer for p in problems).most_common(1)[0][1] / len(problems)
    assert held_out_metrics["accuracy_greedy"] > max(0.2, best_constant + 0.15)
    assert held_out_metrics["accuracy_sampled"] > best_constant + 0.05


def test_tiny_still_leaves_room_for_rl(held_out_metrics):
    assert held_out_metrics["accuracy_sampled"] < 0.6


def test_tiny_draft_agrees_with_tiny_far_better_than_an_untrained_draft(models, held_out_metrics):
    target, _ = models
    torch.manual_seed(0)
    untrained = AutoModelForCausalLM.from_config(TINY_DRAFT.llama_config()).eval()
    baseline = evaluate(target, untrained, PretrainConfig(eval_problems=300, seed=11))
    assert held_out_metrics["draft_acceptance"] > 0.7
    assert held_out_metrics["draft_acceptance"] > baseline["draft_acceptance"] + 0.3
    assert held_out_metrics["draft_top1"] > baseline["draft_top1"] + 0.3


def test_pretrain_is_reproducible_from_its_seed(tmp_path):
    config = PretrainConfig(steps=3, draft_steps=2, distill_samples=32, eval_problems=8, batch_size=8)
    first, second = pretrain(config, tmp_path / "a"), pretrain(config, tmp_path / "b")
    for name in ("tiny", "tiny-draft"):
        a = load_file(tmp_path / "a" / name / "model.safetensors")
        b = load_file(tmp_path / "b" / name / "model.safetensors")
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a)
    assert first["loss"] == second["loss"]
    assert (tmp_path / "a" / "tiny" / "tokenizer.json").is_file()

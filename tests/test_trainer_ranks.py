"""The policy trainer as FSDP2 ranks on Ray (`pipeline.trainer_group`) against one in-process rank.

Chain of invariants:
    same seed, same global batch   2 gloo ranks == 1 rank: parameters after 3 steps within 1e-5
                                   (the steps move them by ~1e-3), and the same loss and gradient
                                   norm (which would differ if a rank's share were mis-weighted);
    optimizer state                gathered from the ranks in the single-rank layout, equal to 1 rank's;
    checkpoints                    the policy the ranks save loads as a plain Hugging Face model;
    `specrl train --trainer-ranks 2`   runs the sync pipeline and reports trainer_ranks 2;
    configs                        a batch that does not split over the ranks is refused at load.
One local Ray (2 CPUs: one per rank, 1 thread each) serves the module.
"""
from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest
import ray
import torch

from specrl.models.checkpoint import load_causal_lm
from specrl.models.registry import resolve_checkpoint
from specrl.pipeline.config import load_config
from specrl.pipeline.trainer_group import TrainerGroup
from specrl.rl.grpo import GRPOConfig
from specrl.rl.sequences import train_batch
from specrl.rl.padded_reference import padded_token_logprobs
from specrl.rl.trainer import OptimConfig, PolicyTrainer
from specrl.sampling import SamplingParams

pytestmark = pytest.mark.ray

SAMPLING = SamplingParams(temperature=1.0)
OPTIM = OptimConfig(lr=1e-3, micro_batch_tokens=16, max_grad_norm=1.0)  # micro-batches split groups


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)
    yield
    ray.shutdown()


def batches(model_dir, steps: int = 3, rows: int = 8):
    """Per step: prompts, responses, the starting policy's logprobs of them, advantages (fixed seed)."""
    gen = torch.Generator().manual_seed(0)
    model = load_causal_lm(model_dir).eval()
    vocab = model.config.vocab_size
    out = []
    for _ in range(steps):
        prompts = [torch.randint(3, vocab, (int(torch.randint(3, 7, (1,), generator=gen)),), generator=gen).tolist()
                   for _ in range(rows // 2) for _ in range(2)]  # groups of two, packed with one copy of the prompt
        prompts = [prompts[i - i % 2] for i in range(rows)]
        responses = [torch.randint(3, vocab, (int(torch.randint(2, 9, (1,), generator=gen)),), generator=gen).tolist()
                     for _ in range(rows)]
        batch = train_batch(prompts, responses, 0)
        with torch.no_grad():
            logits = model(input_ids=batch.ids, attention_mask=batch.attention_mask).logits
            lp = padded_token_logprobs(logits, batch.ids, 1.0)
        behaviour = [lp[i, len(p) - 1: len(p) - 1 + len(r)].tolist() for i, (p, r) in enumerate(zip(prompts, responses))]
        out.append((prompts, responses, behaviour, torch.randn(rows, generator=gen)))
    return out


def test_two_gloo_ranks_train_like_one(local_ray, tmp_path):
    model_dir = str(resolve_checkpoint("tiny"))
    data = batches(model_dir)
    torch.manual_seed(0)
    single = PolicyTrainer(model_dir, GRPOConfig(), OPTIM, SAMPLING, pad_id=0)
    start = {k: v.clone() for k, v in single.state_dict().items()}
    group = TrainerGroup(2, model_dir, GRPOConfig(), OPTIM, SAMPLING, pad_id=0, threads_per_rank=1)
    try:
        for prompts, responses, behaviour, advantages in data:
            one = single.step(prompts, responses, behaviour, advantages)
            two = group.step(prompts, responses, behaviour, advantages)
            assert two["loss"] == pytest.approx(one["loss"], rel=1e-5, abs=1e-6)
            assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-5)
            # the largest |engine logprob - trainer logprob|: fp32 rounding (~3e-6), whose last bits differ with
            # how each side packs its micro-batches (2.4e-6 against 2.9e-6 on AVX-512)
            assert two["logprob_abs_error_max"] == pytest.approx(one["logprob_abs_error_max"], abs=2e-6)
        want, got = single.state_dict(), group.state_dict()
        assert set(got) == set(want)
        moved = max(float((want[k] - start[k]).abs().max()) for k in want)
        assert moved > 1e-3  # the parity below is not that of parameters that never moved
        for name in want:  # each rank packs its own micro-batches: the sums' order differs, so the gradients agree
            # to fp32 rounding, which AdamW's normalised early steps amplify (1.5e-5 measured after 3 steps at lr 1e-3)
            assert torch.allclose(got[name], want[name], atol=5e-5, rtol=0), name

        one_state, two_state = single.optimizer_state(), group.optimizer_state()
        assert two_state["param_groups"][0]["params"] == one_state["param_groups"][0]["params"]
        for index, slots in one_state["state"].items():
            for slot in ("exp_avg", "exp_avg_sq"):
                assert torch.allclose(two_state["state"][index][slot], slots[slot], atol=1e-6, rtol=1e-4)

        group.save_policy(tmp_path / "policy")
        saved = load_causal_lm(tmp_path / "policy").state_dict()
        for name, tensor in got.items():  # the group saves the weights it holds
            assert torch.equal(saved[name], tensor), name
        group.load_optimizer_state(one_state)  # a single-rank checkpoint resumes on two ranks
        assert torch.allclose(group.optimizer_state()["state"][0]["exp_avg"], one_state["state"][0]["exp_avg"])
    finally:
        group.close()


def test_a_batch_that_does_not_split_over_the_ranks_is_refused():
    with pytest.raises(ValueError, match=r"run.trainer_ranks \(3\) must divide .* 16 sequences"):
        load_config("tiny", overrides=["rollout.prompts_per_step=4", "grpo.group_size=4", "run.trainer_ranks=3"])
    with pytest.raises(ValueError, match="draft.enabled"):
        load_config("tiny", overrides=["run.trainer_ranks=2", "draft.enabled=true", "backend.proposer=eagle3"])


def test_cuda_without_cuda_is_an_error_that_says_so(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    from specrl.pipeline.learner import starting_point

    config = load_config("tiny", overrides=["run.device=cuda", f"run.run_dir={tmp_path}"])
    with pytest.raises(ValueError, match="run.device=cuda, but .*(CPU-only build|no CUDA device)"):
        starting_point(config, resume=False)


@pytest.mark.slow
def test_specrl_train_with_two_trainer_ranks_reports_them(tmp_path):
    done = subprocess.run([sys.executable, "-m", "specrl.cli", "train", "--preset", "tiny", "--trainer-ranks", "2",
                           "run.steps=3", "run.threads=2", f"run.run_dir={tmp_path}", "run.tensorboard=false"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["trainer_ranks"] == 2 and summary["steps_run"] == 3
    assert (tmp_path / "checkpoints" / "step_000003" / "policy" / "model.safetensors").is_file()

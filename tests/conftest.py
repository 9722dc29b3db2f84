"""Shared fixtures: tiny random-weight Hugging Face checkpoints built in the test run."""
from __future__ import annotations

import pytest
import torch

torch.set_num_threads(2)


def save_random_checkpoint(path, arch: str = "llama", layers: int = 2, hidden: int = 64, vocab: int = 40,
                           seed: int = 0, max_positions: int = 256):
    """Write a random-weight `arch` checkpoint (safetensors + config.json) to `path`; return the HF model."""
    import transformers

    config_cls, model_cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
    }[arch]
    extra = {"head_dim": hidden // 4} if arch == "qwen3" else {}
    cfg = config_cls(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_positions,
                     eos_token_id=None, bos_token_id=None, pad_token_id=None, **extra)
    torch.manual_seed(seed)
    model = model_cls(cfg).eval()
    with torch.no_grad():  # sharper logits than the default init, so samples are not near-uniform
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(path)
    return model


@pytest.fixture(scope="session")
def target_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("target")
    save_random_checkpoint(path, layers=2, hidden=64, seed=0)
    return path


@pytest.fixture(scope="session")
def draft_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("draft")
    save_random_checkpoint(path, layers=1, hidden=32, seed=1)
    return path

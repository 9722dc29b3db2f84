"""Helpers the tests share (imported as `helpers`; fixtures stay in conftest.py).

Tiny random-weight checkpoints built in the test run, and loaders that only tests need.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors.torch import load_file

from specrl.speculation.eagle3 import Eagle3Head
from specrl.speculation.mtp import MTPHead


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


def jittered(head):
    """A head initialised from its target, then moved off it: drafts that are often but not always right."""
    torch.manual_seed(1)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return head.eval()


def make_head(kind, target):
    """An EAGLE-3 head (reduced vocabulary: every other id) or an MTP head for `target`, jittered."""
    if kind == "eagle3":
        return jittered(Eagle3Head.from_target(target, d2t=torch.arange(0, 40, 2)))
    return jittered(MTPHead.from_target(target))


def load_reduced_draft(path: Path):
    """Load a reduced-vocabulary draft with transformers (JSON + safetensors only).

    The returned model's logits are [.., N]; its `d2t` buffer maps them to target ids.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    from specrl.models.reduced_vocab import D2T_KEY, _attach_reduced_head

    path = Path(path)
    config_dict = json.loads((path / "config.json").read_text())
    n = config_dict.get("draft_vocab_size")
    if n is None:
        raise ValueError(f"{path}/config.json has no draft_vocab_size: not a reduced-vocabulary draft")
    config = LlamaConfig(**{k: v for k, v in config_dict.items() if k not in ("architectures", "transformers_version")})
    tensors = load_file(str(path / "model.safetensors"))
    if D2T_KEY not in tensors:
        raise ValueError(f"{path}/model.safetensors has no {D2T_KEY!r} tensor (draft-to-target id map)")
    d2t = tensors.pop(D2T_KEY)
    if d2t.numel() != n or tensors["lm_head.weight"].shape[0] != n:
        raise ValueError(f"{path}: draft_vocab_size {n} disagrees with d2t {tuple(d2t.shape)} "
                         f"or lm_head.weight {tuple(tensors['lm_head.weight'].shape)}")
    model = LlamaForCausalLM(config)
    _attach_reduced_head(model, d2t.long())
    model.load_state_dict(tensors, strict=True)
    return model.float().eval()


def parse_arithmetic_prompt(prompt: str):
    """The arithmetic problem behind a prompt built by `Problem.prompt`."""
    from specrl.tasks.arithmetic import Problem

    match = re.fullmatch(r"Q:(\d+)([+\-*])(\d+)\nA:", prompt)
    if not match:
        raise ValueError(f"not an arithmetic prompt: {prompt!r}")
    return Problem(int(match.group(1)), match.group(2), int(match.group(3)))


CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def save_chat_tokenizer(path):
    """A character-level fast tokenizer over printable ASCII with a ChatML chat template, saved to `path`
    (what a Hugging Face checkpoint folder holds); its vocabulary is 100 ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    from transformers import PreTrainedTokenizerFast

    specials = ["<|im_start|>", "<|im_end|>", "<unk>"]
    chars = [chr(c) for c in range(32, 127)] + ["\n", "\t"]
    vocab = {token: i for i, token in enumerate(specials + chars)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<unk>",
                                   unk_token="<unk>", additional_special_tokens=specials[:1])
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(path)
    return fast

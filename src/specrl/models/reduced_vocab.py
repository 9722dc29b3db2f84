"""A Llama-shaped draft whose output layer covers only N of the target's V tokens.

Why: for SmolLM2-135M the tied lm_head (49152 x 576) is ~20% of the weights, so a
small draft with a full-vocabulary head would cost ~0.2 target steps per drafted
token. Scoring only the N ≈ 8192 tokens the target actually emits makes the draft
several times cheaper while losing little acceptance.

Checkpoint layout (a Hugging Face folder; safetensors + config.json, no code):
- config.json: a normal `llama` config (vocab_size = V, the target's, for the input
  embedding; tie_word_embeddings false) plus `"draft_vocab_size": N`.
- model.safetensors: standard Llama tensor names, except `lm_head.weight` is [N, hidden];
  plus `d2t` int64 [N], mapping draft-vocabulary ids to target-vocabulary ids.
- the target's tokenizer files.

The draft's distribution q is softmax(lm_head(h)) placed at target ids d2t and zero
elsewhere. Speculative sampling stays exact for any q (tokens outside d2t are simply
never proposed); only the acceptance rate depends on it.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import LlamaForCausalLM

from specrl.models.checkpoint import check_d2t

D2T_KEY = "d2t"


def build_draft(target: LlamaForCausalLM, layers: int, d2t: torch.Tensor) -> LlamaForCausalLM:
    """A `layers`-layer draft initialised from the target: embeddings, its first `layers`
    decoder layers, final norm, and the lm_head rows of the ids in `d2t` [N]."""
    if not 1 <= layers <= target.config.num_hidden_layers:
        raise ValueError(f"draft layers must be in 1..{target.config.num_hidden_layers}, got {layers}")
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = layers
    config.tie_word_embeddings = False
    config.draft_vocab_size = int(d2t.numel())
    draft = LlamaForCausalLM(config)
    _attach_reduced_head(draft, d2t)
    with torch.no_grad():
        draft.model.embed_tokens.weight.copy_(target.model.embed_tokens.weight)
        for i in range(layers):
            draft.model.layers[i].load_state_dict(target.model.layers[i].state_dict())
        draft.model.norm.load_state_dict(target.model.norm.state_dict())
        draft.lm_head.weight.copy_(target.lm_head.weight[d2t])
    return draft.float().eval()


def _attach_reduced_head(model: LlamaForCausalLM, d2t: torch.Tensor) -> None:
    d2t = check_d2t(d2t, d2t.numel() if d2t.dim() == 1 else -1, model.config.vocab_size, "reduced-vocabulary draft")
    model.lm_head = torch.nn.Linear(model.config.hidden_size, d2t.numel(), bias=False)
    model.register_buffer(D2T_KEY, d2t.clone(), persistent=False)


SHARED_KEY = "specrl_shared_with_target"  # config.json: tensors a checkpoint leaves to its target


def save_draft(draft: LlamaForCausalLM, out_dir: Path, dtype: torch.dtype = torch.float32,
               share_embeddings: bool = False) -> None:
    """Write config.json and model.safetensors (with `d2t`) into `out_dir`; floating tensors stored as
    `dtype`. `share_embeddings` leaves out the input embedding (the target's, frozen in training): the
    config lists it under `specrl_shared_with_target` and the engine fills it from the target."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = draft.config.to_dict()
    config["architectures"] = ["LlamaForCausalLM"]
    config["draft_vocab_size"] = int(getattr(draft, D2T_KEY).numel())
    config["torch_dtype"] = str(dtype).removeprefix("torch.")
    tensors = {k: v.detach().to(dtype).contiguous() for k, v in draft.state_dict().items()}
    if share_embeddings:
        del tensors["model.embed_tokens.weight"]
        config[SHARED_KEY] = ["model.embed_tokens.weight"]
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    tensors[D2T_KEY] = getattr(draft, D2T_KEY).contiguous()
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
